"""`meshplan run --plan P [--steps N] [--data synthetic|PATH] [--out DIR] [--seed S] [--resume]`.

Outside torchrun this validates the plan and launches torchrun for the plan's `gpus` on this node
(launcher.py); inside torchrun (RANK / WORLD_SIZE set) it is the worker (worker.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from meshplan.argparsing import ArgumentParser
from meshplan.errors import InputError
from meshplan.runtime.options import RunOptions, check_runnable
from meshplan.specs.plan import Plan, load_plan


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="meshplan run", description="Execute a plan with native PyTorch distributed APIs.")
    ap.add_argument("--plan", required=True, help="plan YAML (e.g. best.yaml)")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps to run (default 10)")
    ap.add_argument("--data", default="synthetic", help="'synthetic' or a flat token file (uint16/uint32)")
    ap.add_argument("--data-dtype", default="auto", help="token file dtype: uint16 | uint32 | auto (by vocab size)")
    ap.add_argument("--out", default=None, help="run directory for metrics.jsonl, summary.json, checkpoints")
    ap.add_argument("--seed", type=int, default=0, help="seed of weights and synthetic data (default 0)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in --out")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every K steps (and always at the end)")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    ap.add_argument("--warmup-steps", type=int, default=None, help="LR warm-up steps (default steps/10, at least 1)")
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (default 1.0)")
    ap.add_argument("--timing-warmup", type=int, default=2, help="first steps left out of the measured medians (default 2)")
    ap.add_argument("--track-memory", default="warmup", choices=("warmup", "all", "off"),
                    help="CPU peak-memory tracking: on warm-up steps (default), every step, or off")
    ap.add_argument("--quiet", action="store_true", help="no per-step lines on the terminal")
    return ap


def parse(argv: list[str]) -> tuple[Plan, RunOptions]:
    """Parse and validate everything that can be checked before launching processes."""
    args = build_parser().parse_args(argv)
    plan = load_plan(args.plan)
    check_runnable(plan)
    if args.steps < 1:
        raise InputError("--steps", f"must be >= 1, got {args.steps}")
    if args.checkpoint_every < 0:
        raise InputError("--checkpoint-every", f"must be >= 0, got {args.checkpoint_every}")
    if args.timing_warmup < 0:
        raise InputError("--timing-warmup", f"must be >= 0, got {args.timing_warmup}")
    if args.lr <= 0:
        raise InputError("--lr", f"must be > 0, got {args.lr}")
    if args.warmup_steps is not None and args.warmup_steps < 1:
        raise InputError("--warmup-steps", f"must be >= 1, got {args.warmup_steps}")
    if args.data != "synthetic" and not Path(args.data).is_file():
        raise InputError("--data", f"file not found: {args.data} (use 'synthetic' or a flat token file)")
    if args.data_dtype not in ("auto", "uint16", "uint32"):
        raise InputError("--data-dtype", f"must be uint16, uint32 or auto, got {args.data_dtype!r}")
    if args.resume and not args.out:
        raise InputError("--resume", "needs --out (the run directory holding the checkpoints)")
    opts = RunOptions(steps=args.steps, data=args.data, data_dtype=args.data_dtype, out=args.out, seed=args.seed,
                      resume=args.resume, checkpoint_every=args.checkpoint_every, lr=args.lr,
                      warmup_steps=args.warmup_steps, max_grad_norm=args.max_grad_norm,
                      timing_warmup=args.timing_warmup, track_memory=args.track_memory, quiet=args.quiet)
    return plan, opts


def inside_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def main(argv: list[str]) -> int:
    plan, opts = parse(argv)
    if inside_torchrun():
        from meshplan.runtime.worker import run_worker

        return run_worker(plan, opts)
    from meshplan.runtime.launcher import launch

    return launch(plan.gpus, argv)
