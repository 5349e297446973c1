"""A 2-rank gloo world for test_context_parallel.py: the gather CP path against one-process causal
SDPA (forward and gradients), and its peak memory at growing sequence lengths.

usage: torchrun --nproc-per-node 2 cp_worker.py RESULTS.json
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from meshplan.runtime import context_parallel as cp
from meshplan.runtime.metrics import LiveTensorMemory
from meshplan.runtime.model import SeqLayout

MEMORY_SEQS = (2048, 4096, 8192)


def numeric_error(h: int, hk: int, seq: int, layout: SeqLayout) -> float:
    """Max abs difference of output and q/k/v gradients (this rank's tokens) vs. full causal SDPA."""
    gen = torch.Generator().manual_seed(h * 100 + hk)
    q, k, v = (torch.randn(2, n, seq, 8, generator=gen, dtype=torch.float64) for n in (h, hk, hk))
    w = torch.randn(2, h, seq, 8, generator=gen, dtype=torch.float64)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=True)
    (ref * w).sum().backward()
    local = [cp.shard_sequence(t, layout, dim=2).clone().requires_grad_() for t in (q, k, v)]
    out = cp.gather_attention(*local, group=dist.group.WORLD, layout=layout)
    (out * cp.shard_sequence(w, layout, dim=2)).sum().backward()
    errs = [(out - cp.shard_sequence(ref, layout, dim=2)).abs().max()]
    errs += [(lo.grad - cp.shard_sequence(fu.grad, layout, dim=2)).abs().max() for lo, fu in zip(local, full)]
    return float(max(errs))


def peak_bytes(seq: int, layout: SeqLayout) -> int:
    """Peak live tensor bytes of one forward + backward of the gather path at `seq` tokens."""
    q, k, v = (torch.randn(1, n, seq // 2, 16).requires_grad_() for n in (2, 1, 1))
    with LiveTensorMemory(torch.device("cpu")) as mem:
        out = cp.gather_attention(q, k, v, group=dist.group.WORLD, layout=layout)
        out.sum().backward()
        del out
    return mem.peak


def main() -> None:
    dist.init_process_group("gloo")
    layout = SeqLayout(dist.get_rank(), dist.get_world_size())
    cp.CP_GATHER_TILE = 8  # several tiles per chunk at the small numeric sizes
    err = max(numeric_error(h, hk, 64, layout) for h, hk in ((4, 2), (4, 4), (2, 1)))
    cp.CP_GATHER_TILE = 256
    peaks = [peak_bytes(s, layout) for s in MEMORY_SEQS]
    buf = torch.tensor([err] + peaks, dtype=torch.float64)
    dist.all_reduce(buf, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        json.dump({"max_abs_error": float(buf[0]), "seqs": list(MEMORY_SEQS), "peak_bytes": buf[1:].tolist()},
                  open(sys.argv[1], "w"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Skip interpreter teardown: under load, gloo's threads sometimes abort it ("terminate called
    # without an active exception", no Python frame) after the work is done and written.
    sys.stdout.flush()
    os._exit(0)
