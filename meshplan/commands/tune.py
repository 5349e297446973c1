"""`meshplan tune`: measure candidate plans with an Optuna study (the planner's top plans first)."""

from __future__ import annotations

import re
from pathlib import Path

from meshplan.commands.argparsing import ArgumentParser
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.specs.registry import resolve_model
from meshplan.tuning.study import (RunFailed, TuneConfig, _progress, enqueue_planner_plans, mesh_choices, objective,
                                   open_study, trial_table, write_best)


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="meshplan tune", description="Measure candidate plans with an Optuna study "
                        "(planner's top plans first); resumable from its storage.")
    ap.add_argument("--model", required=True, help="model name (meshplan models), model YAML or HF config.json")
    ap.add_argument("--gpus", required=True, type=int, help="world size (processes on CPU)")
    ap.add_argument("--cluster", default="cpu-gloo", help="profile name or path (default cpu-gloo)")
    ap.add_argument("--seq-len", type=int, default=128, help="sequence length (default 128)")
    ap.add_argument("--global-batch", type=int, default=None, help="sequences per step (default 2 x gpus)")
    ap.add_argument("--trials", type=int, default=10, help="trials to run in this invocation (default 10)")
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps per trial run (default 4)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds before a trial's run is killed (default 600)")
    ap.add_argument("--storage", default="sqlite:///tune.db", help="Optuna storage URL (default sqlite:///tune.db)")
    ap.add_argument("--study", default=None, help="study name (default derived from model, gpus, cluster, shape)")
    ap.add_argument("--top", type=int, default=3, help="planner plans enqueued first in a new study (default 3)")
    ap.add_argument("--out", default="tune-best.yaml", help="where to write the best measured plan")
    ap.add_argument("--runs-dir", default=None, help="where trial run directories go (default <study>-runs)")
    return ap


def config(args) -> TuneConfig:
    for flag, value, low in (("--gpus", args.gpus, 1), ("--seq-len", args.seq_len, 1), ("--trials", args.trials, 1),
                             ("--steps", args.steps, 1), ("--top", args.top, 0)):
        if value < low:
            raise InputError(flag, f"must be >= {low}, got {value}")
    if not args.timeout > 0:
        raise InputError("--timeout", f"must be > 0, got {args.timeout}")
    if not args.storage.startswith(("sqlite:///", "postgresql", "mysql")):
        raise InputError("--storage", f"must be an RDB URL like sqlite:///tune.db, got {args.storage!r}")
    out = Path(args.out)
    if out.suffix not in (".yaml", ".yml"):
        raise InputError("--out", f"must name a .yaml file, got {args.out!r}")
    gb = args.global_batch if args.global_batch is not None else 2 * args.gpus
    if gb < 1:
        raise InputError("--global-batch", f"must be >= 1, got {gb}")
    profile = load_profile(args.cluster)
    spec = resolve_model(args.model)
    dtype = "bf16" if "bf16" in profile.device.peak_tflops else "fp32"  # CPU profiles have fp32 only
    study = args.study or re.sub(r"[^A-Za-z0-9_.-]", "_",
                                 f"tune-{spec.name}-{args.gpus}x{profile.name}-s{args.seq_len}-b{gb}-steps{args.steps}")
    return TuneConfig(model=args.model, gpus=args.gpus, cluster=args.cluster, seq_len=args.seq_len, global_batch=gb,
                      dtype=dtype, trials=args.trials, steps=args.steps, storage=args.storage, study=study, out=out,
                      runs_dir=Path(args.runs_dir or f"{study}-runs"), timeout_s=args.timeout, top=args.top)


def main(argv: list[str]) -> int:
    import optuna

    cfg = config(parser().parse_args(argv))
    profile = load_profile(cfg.cluster)
    meshes = mesh_choices(cfg)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(cfg)
    before = len(study.trials)
    queued = enqueue_planner_plans(study, cfg, profile, meshes)
    print(f"study {cfg.study} in {cfg.storage}: {before} trial(s) so far"
          + (f"; enqueued the planner's top {queued} plan(s)" if queued else ""), flush=True)
    study.optimize(lambda t: objective(t, cfg, profile, meshes), n_trials=cfg.trials, catch=(RunFailed,),
                   callbacks=[_progress])
    table, rho = trial_table(study)
    print(table)
    print("Spearman rank correlation, predicted vs measured throughput: "
          + (f"{rho:+.3f}" if rho is not None else "undefined (fewer than 3 measured trials or a constant side)"))
    best = write_best(study, cfg.out)
    if best is None:
        print("no trial has a measurement yet; nothing written (rerun the same command to continue the study)")
        return 1
    print(f"best measured: trial #{best['trial']} {best['tokens_per_s_per_gpu']:,.1f} tok/s/gpu -> {cfg.out}")
    return 0
