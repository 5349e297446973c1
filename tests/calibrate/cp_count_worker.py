"""One rank of the CP op-count test (run by test_host_costs.py under torchrun, 2 gloo ranks): the ops one
block of the runtime's tiny-4l adds, forward and backward, with CP 2 on the gather path, per sequence length.

usage: torchrun --nproc-per-node 2 cp_count_worker.py OUT.json SEQ [SEQ ...]
"""

import json
import os
import sys
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils._python_dispatch import TorchDispatchMode

from meshplan.runtime.context_parallel import apply_cp, shard_sequence
from meshplan.runtime.initialisation import init_weights
from meshplan.runtime.model import build_model
from meshplan.runtime.train import loss_fn
from meshplan.specs.registry import resolve_model


class OpCount(TorchDispatchMode):
    """aten ops, without the detach a dispatch mode itself adds per saved tensor."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func is not torch.ops.aten.detach.default
        return func(*args, **(kwargs or {}))


def counts(layers: int, seq: int, mesh) -> tuple[int, int]:
    spec = replace(resolve_model("tiny-4l"), n_layers=layers, max_seq_len=seq)
    model = build_model(spec, "cpu")
    init_weights(model, spec, 0)
    x = shard_sequence(torch.randint(0, spec.vocab_size, (1, seq)), apply_cp(model, mesh))
    loss_fn(model(x), x).backward()  # lazy state out of the way
    with OpCount() as fwd:
        loss = loss_fn(model(x), x)
    with OpCount() as bwd:
        loss.backward()
    return fwd.n, bwd.n


def main(out: str, seqs: list[int]) -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    per_block = {}
    for seq in seqs:
        two, four = counts(2, seq, mesh), counts(4, seq, mesh)
        per_block[seq] = [(b - a) / 2 for a, b in zip(two, four)]
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(per_block, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2:]])
    sys.stdout.flush()
    os._exit(0)
