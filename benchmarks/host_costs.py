"""Host cost per eager op on this machine's device (bench/host.py, as profile-cluster measures it), in one
process: on a GPU the chain's kernels are tiny, so the host is what is timed (Python, dispatcher,
autograd, the kernel launch). Prints the four costs in microseconds, as JSON, and beside them the cost
per op of the runtime's own blocks (tiny-4l's dense ones, tiny-moe's MoE ones), timed the same way: the
op mix cost_models/host.py counts, whose matmuls and attention take cuBLAS's and cuDNN's host paths,
which the chain's multiply does not. From the two it derives `moe_op_s`, what each op an MoE layer adds
to a dense block costs (overheads.moe_op_s): the MoE blocks' seconds less their dense ops at the dense
blocks' cost per op, over the MoE ops, and `moe_op_ratio`, that cost over the chain's (op_dispatch_s),
which carries it to a profile whose chain was timed on another host.

    python benchmarks/host_costs.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
# blocks: the difference drops the embedding, head and loss. The four steps (two models, two depths) are
# timed once a round, and each figure is the median over ROUNDS rounds of that round's value: a shared
# host's speed drifts, and a difference of steps timed minutes apart would carry the drift.
SEQ = 16
BLOCKS = (2, 4)
MODELS = ("tiny-4l", "tiny-moe")  # tiny-moe's blocks are tiny-4l's with the MLP swapped for an MoE layer
ROUNDS = 7


def runtime_step(env: BenchEnv, model: str, blocks: int):
    """One eager training step (forward, loss, backward) of `model` cut to `blocks` blocks, in the dtype
    the runtime computes in on this device."""
    dtype = torch.bfloat16 if env.is_cuda else torch.float32
    torch.manual_seed(0)
    spec = replace(resolve_model(model), n_layers=blocks)
    m = build_model(spec, env.device).to(dtype)
    init_weights(m, spec, 0)
    x = torch.randint(0, spec.vocab_size, (1, SEQ), device=env.device)

    def step() -> None:
        loss_fn(m(x), x).backward()

    return step


def moe_op_s(dense: tuple[float, float], moe: tuple[float, float]) -> float:
    """Seconds per op an MoE layer adds to a block, from (seconds, ops) of one dense block and one MoE block
    of the same dims: the MoE block's dense ops cost what the dense block's do, so the difference in
    seconds over the difference in ops."""
    return max(0.0, moe[0] - dense[0]) / (moe[1] - dense[1])


def runtime_block_costs(env: BenchEnv, target_s: float, min_reps: int = 5) -> tuple[dict[str, float], dict[str, float]]:
    """(seconds per op of each model's blocks and moe_op_s, medians over rounds; ops per block of each model)."""
    steps = {(m, n): runtime_step(env, m, n) for m in MODELS for n in BLOCKS}
    ops = {k: count_ops(f) for k, f in steps.items()}
    per_block = {m: (ops[(m, BLOCKS[1])] - ops[(m, BLOCKS[0])]) / (BLOCKS[1] - BLOCKS[0]) for m in MODELS}
    rounds = []
    for _ in range(ROUNDS):
        t = {k: time_local(f, env.sync, target_s / (ROUNDS * len(steps)), min_reps, warmup=2).median_s
             for k, f in steps.items()}
        block_s = {m: max(0.0, t[(m, BLOCKS[1])] - t[(m, BLOCKS[0])]) / (BLOCKS[1] - BLOCKS[0]) for m in MODELS}
        r = {f"block_op_s {m}": block_s[m] / per_block[m] for m in MODELS}
        r["moe_op_s"] = moe_op_s(*((block_s[m], per_block[m]) for m in MODELS))
        rounds.append(r)
    costs = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    return costs, {f"block_ops {m}": per_block[m] for m in MODELS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-s", type=float, default=0.3,
                    help="time per chain variant, and for all the runtime's blocks together (default 0.3 s)")
    ap.add_argument("--out", default=None, help="also write host_costs-<device>.json here")
    a = ap.parse_args()
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": os.environ.get("MASTER_PORT", "29533")}.items():
        os.environ.setdefault(k, v)
    env = init_env()
    costs = asdict(bench_host_dispatch(env, a.target_s, 5))
    blocks, ops = runtime_block_costs(env, a.target_s)
    costs.update(blocks)
    name = torch.cuda.get_device_name(env.device) if env.is_cuda else "CPU"
    row = {"device": name, "torch": torch.__version__, "cpu_count": os.cpu_count(),
           **{k: round(v * 1e6, 2) for k, v in costs.items()}, "unit": "us per op",
           "moe_op_ratio": round(costs["moe_op_s"] / costs["op_dispatch_s"], 3), **ops}
    print(json.dumps(row))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"host_costs-{name.replace(' ', '_')}.json").write_text(json.dumps(row, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
