"""Runtime overhead on CPU: tokens/s of `meshplan.runtime` (1 process, gloo group, the same code
path as `meshplan run` minus torchrun start-up) vs a plain single-process PyTorch loop of the same
model, data, optimizer and steps (meshplan/runtime/reference.py). Medians after 2 warm-up steps;
memory tracking off (it is a measurement tool, not part of training).

    python benchmarks/runtime_overhead.py [--model tiny-4l] [--seq-len 128] [--batch 8] [--steps 20]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics

import torch
import torch.distributed as dist

from meshplan.runtime.options import RunOptions
from meshplan.runtime.reference import reference_run
from meshplan.runtime.train import run_training
from meshplan.specs.plan import plan_from_dict

WARMUP = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_gpu_plan(model: str, seq_len: int, batch: int) -> dict:
    return {"model": model, "cluster": "h100-80g-dgx", "gpus": 1,
            "training": {"seq_len": seq_len, "global_batch": batch, "micro_batch": batch, "dtype": "fp32"},
            "parallel": {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "sequence_parallel": False, "async_tp": False,
                         "pp": 1, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "cp": 1},
            "memory": {"activation_checkpointing": "none", "float8": False, "reshard_after_forward": True},
            "compile": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-4l")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    plan = plan_from_dict(one_gpu_plan(args.model, args.seq_len, args.batch))
    opts = RunOptions(steps=args.steps, quiet=True, track_memory="off", timing_warmup=WARMUP)
    tokens = args.batch * args.seq_len

    plain = reference_run(plan, opts)
    plain_tps = tokens / statistics.median(r.step_time_s for r in plain[WARMUP:])

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    rows = run_training(plan, opts, torch.device("cpu"))
    dist.destroy_process_group()
    runtime_tps = statistics.median(r.tokens_per_s_per_gpu for r in rows[WARMUP:])

    same = all(abs(a.loss - b.loss) <= 1e-4 * abs(b.loss) for a, b in zip(rows, plain))
    print(f"model {args.model}, seq {args.seq_len}, batch {args.batch}, {args.steps} steps, 1 CPU thread")
    print(f"plain PyTorch loop : {plain_tps:12,.0f} tokens/s")
    print(f"meshplan runtime   : {runtime_tps:12,.0f} tokens/s")
    print(f"ratio runtime/plain: {runtime_tps / plain_tps:.3f}   (losses equal: {same})")


if __name__ == "__main__":
    main()
