"""Host cost per eager op on this machine's device (bench/host.py, as profile-cluster measures it), in one
process: on a GPU the chain's kernels are tiny, so the host is what is timed (Python, dispatcher,
autograd, the kernel launch). Prints the four costs in microseconds, as JSON, and beside them the cost
per op of the runtime's own blocks (tiny-4l's dense ones, tiny-moe's MoE ones), timed the same way: the
op mix cost_models/host.py counts, whose matmuls and attention take cuBLAS's and cuDNN's host paths,
which the chain's multiply does not.

    python benchmarks/host_costs.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

from meshplan.bench.env import BenchEnv, init_env
from meshplan.bench.host import bench_host_dispatch, count_ops
from meshplan.bench.timing import time_local
from meshplan.runtime.initialisation import init_weights
from meshplan.runtime.model import build_model
from meshplan.runtime.train import loss_fn
from meshplan.specs.registry import resolve_model

# One sequence of SEQ tokens (the kernels are nothing beside the host), models of BLOCKS[0] and BLOCKS[1]
# blocks: the difference drops the embedding, head and loss.
SEQ = 16
BLOCKS = (2, 4)


def runtime_block_op_s(env: BenchEnv, model: str, target_s: float, min_reps: int = 5) -> float:
    """Seconds per op of `model`'s blocks, forward and backward, eager, in the dtype the runtime computes
    in on this device: (step of BLOCKS[1] blocks - step of BLOCKS[0]) / (their ops' difference)."""
    dtype = torch.bfloat16 if env.is_cuda else torch.float32
    seconds, ops = [], []
    for n in BLOCKS:
        torch.manual_seed(0)
        spec = replace(resolve_model(model), n_layers=n)
        m = build_model(spec, env.device).to(dtype)
        init_weights(m, spec, 0)
        x = torch.randint(0, spec.vocab_size, (1, SEQ), device=env.device)

        def step() -> None:
            loss_fn(m(x), x).backward()

        ops.append(count_ops(step))
        seconds.append(time_local(step, env.sync, target_s, min_reps, warmup=3).median_s)
    return max(0.0, (seconds[1] - seconds[0]) / (ops[1] - ops[0]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-s", type=float, default=0.3, help="time per variant (default 0.3 s)")
    ap.add_argument("--out", default=None, help="also write host_costs-<device>.json here")
    a = ap.parse_args()
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": os.environ.get("MASTER_PORT", "29533")}.items():
        os.environ.setdefault(k, v)
    env = init_env()
    costs = asdict(bench_host_dispatch(env, a.target_s, 5))
    costs.update({f"block_op_s {m}": runtime_block_op_s(env, m, a.target_s / 2) for m in ("tiny-4l", "tiny-moe")})
    name = torch.cuda.get_device_name(env.device) if env.is_cuda else "CPU"
    row = {"device": name, "torch": torch.__version__, "cpu_count": os.cpu_count(),
           **{k: round(v * 1e6, 2) for k, v in costs.items()}, "unit": "us per op"}
    print(json.dumps(row))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"host_costs-{name.replace(' ', '_')}.json").write_text(json.dumps(row, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
