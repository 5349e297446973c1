"""Calibration benchmark: how well does the cost model rank and predict real runs on this machine,
before and after `meshplan calibrate`?

Runs >= 12 distinct plans of a tiny model on 4 CPU processes (cluster cpu-gloo) covering DP, FSDP,
HSDP, TP(+SP), PP, CP and the AC modes, plus the planner's own top choice, and two expert-parallel
layouts of tiny-moe (scored apart, not fitted: how the MoE terms carry over), then prints:
  - Spearman rank correlation of predicted vs measured throughput,
  - the planner's top choice's measured throughput relative to the best measured plan,
  - mean absolute relative error of predicted step time and peak memory,
each before and after calibration. The calibration is fitted on the same runs (in-sample), and the
planner's choice under the calibrated profile is run too when it is a new plan.

    python benchmarks/calibration_benchmark.py [--steps 10] [--out bench-runs] [--fresh-profile]

--fresh-profile measures this machine first (`meshplan profile-cluster --quick`) and predicts with
that profile, as a newcomer's loop would, instead of the built-in cpu-gloo.

Run directories are kept; a rerun reuses every run that already has a summary.json. The default 10 steps
time 8 (the first 2 are warm-up): with 2 timed steps, medians of one plan on a shared 2-core host
scattered by up to 3x between reruns. The host's load average is printed before and after, and its speed
(microseconds per op of a plain op chain) before each run: on a shared VM it switches between two levels
about 1.8x apart for minutes at a time. So each plan runs --passes times (default 2), in whole passes over
the layouts, and its fastest run counts, as timeit takes the best of its repeats.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from scipy.stats import spearmanr

from meshplan.cost_models.calibrate import Run, calibrate, errors, load_run, predict
from meshplan.tuning.study import TuneConfig, planner_plans, plan_params, run_plan
from meshplan.profiles import load_profile
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import Plan, plan_from_dict
from meshplan.yamlio import atomic_write_yaml

MODEL, GPUS, CLUSTER, SEQ, BATCH = "tiny-4l", 4, "cpu-gloo", 128, 8
# (dp_replicate, dp_shard, cp, tp, pp, micro_batch, ac, pp_schedule, virtual stages)
PLANS = [
    (4, 1, 1, 1, 1, 1, "none", "1F1B", 1),        # DDP
    (1, 4, 1, 1, 1, 1, "none", "1F1B", 1),        # FSDP
    (1, 4, 1, 1, 1, 2, "full", "1F1B", 1),        # FSDP + full AC
    (1, 4, 1, 1, 1, 1, "selective", "1F1B", 1),   # FSDP + selective AC
    (2, 2, 1, 1, 1, 1, "none", "1F1B", 1),        # HSDP
    (1, 2, 1, 2, 1, 1, "none", "1F1B", 1),        # FSDP x TP + SP
    (2, 1, 1, 2, 1, 2, "selective", "1F1B", 1),   # DDP x TP + SP
    (1, 2, 1, 1, 2, 1, "none", "1F1B", 1),        # FSDP x PP
    (1, 1, 1, 1, 4, 1, "full", "GPipe", 1),       # PP 4
    (2, 1, 1, 1, 2, 1, "none", "Interleaved1F1B", 2),  # DDP x PP interleaved
    (1, 2, 2, 1, 1, 1, "none", "1F1B", 1),        # FSDP x CP
    (1, 1, 2, 2, 1, 1, "selective", "1F1B", 1),   # CP x TP
    (1, 1, 1, 2, 2, 1, "none", "1F1B", 1),        # TP x PP
]
# Ten layouts on 2 ranks: what one 2-core machine runs without oversubscription (--ranks 2).
PLANS_2 = [
    (2, 1, 1, 1, 1, 1, "none", "1F1B", 1),        # DDP
    (1, 2, 1, 1, 1, 1, "none", "1F1B", 1),        # FSDP
    (1, 2, 1, 1, 1, 2, "full", "1F1B", 1),        # FSDP + full AC
    (1, 2, 1, 1, 1, 1, "selective", "1F1B", 1),   # FSDP + selective AC
    (1, 1, 1, 2, 1, 1, "none", "1F1B", 1),        # TP + SP
    (1, 1, 1, 2, 1, 2, "selective", "1F1B", 1),   # TP + SP + selective AC
    (1, 1, 1, 1, 2, 1, "none", "1F1B", 1),        # PP 1F1B
    (1, 1, 1, 1, 2, 1, "full", "GPipe", 1),       # PP GPipe + full AC
    (1, 1, 1, 1, 2, 1, "none", "Interleaved1F1B", 2),  # PP interleaved
    (1, 1, 2, 1, 1, 1, "none", "1F1B", 1),        # CP
]


# Expert-parallel layouts of tiny-moe (8 experts, top-2): (layout as above, ep). They are scored apart from
# the dense runs and left out of the calibration fit, so their errors say how the MoE terms carry over.
MOE_MODEL = "tiny-moe"
MOE_PLANS = {
    4: [((1, 4, 1, 1, 1, 1, "none", "1F1B", 1), 4), ((1, 2, 1, 2, 1, 1, "none", "1F1B", 1), 2)],  # EP4; EP2 x TP2
    2: [((1, 2, 1, 1, 1, 1, "none", "1F1B", 1), 2), ((1, 2, 1, 1, 1, 1, "selective", "1F1B", 1), 2)],  # EP2; + SAC
}


def plan_of(spec: tuple, cluster: str = CLUSTER, gpus: int = GPUS, model: str = MODEL, ep: int = 1) -> Plan:
    r, s, c, t, p, mb, ac, sched, v = spec
    return plan_from_dict({
        "version": 1, "model": model, "cluster": cluster, "gpus": gpus,
        "training": {"seq_len": SEQ, "global_batch": BATCH, "micro_batch": mb, "dtype": "fp32"},
        "parallel": {"dp_replicate": r, "dp_shard": s, "cp": c, "tp": t, "pp": p, "sequence_parallel": t > 1,
                     "async_tp": False, "pp_schedule": sched, "pp_virtual_stages": v, "pp_layers": None, "ep": ep},
        "memory": {"activation_checkpointing": ac, "sac_ops": None, "float8": False, "reshard_after_forward": True},
        "compile": False})


def host_op_us() -> float:
    """This host's speed right now: microseconds per op of profile-cluster's plain op chain, one process."""
    import torch

    from meshplan.bench.host import Chain, count_ops
    from meshplan.bench.timing import time_local

    x, chain = torch.ones(8, requires_grad=True), Chain()
    ops = count_ops(lambda: chain(x).sum().backward())
    return time_local(lambda: chain(x).sum().backward(), lambda: None, 0.3, 20, warmup=3).median_s / ops * 1e6


def measured(plan: Plan, run_dir: Path, steps: int) -> Run | None:
    """Run the plan unless run_dir already holds a summary; None (and say why) when the run fails. The host's
    speed just before the run is printed beside it: a shared VM drifts, and the profile saw one moment."""
    if not (run_dir / "summary.json").is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_yaml(run_dir / "plan.yaml", plan.to_dict())
        speed = host_op_us()
        out = run_plan(run_dir / "plan.yaml", run_dir, steps, timeout_s=900)
        print(f"  {run_dir.name}: {out.status} {out.reason} (host {speed:.2f} us/op before it)", flush=True)
        if out.status != "ok":
            return None
    return load_run(str(run_dir))


def planner_choice(profile: ClusterProfile, cluster: str = CLUSTER, gpus: int = GPUS) -> Plan:
    cfg = TuneConfig(model=MODEL, gpus=gpus, cluster=cluster, seq_len=SEQ, global_batch=BATCH, dtype="fp32",
                     trials=0, steps=0, storage="", study="", out=Path("x.yaml"), runs_dir=Path("."), timeout_s=0, top=1)
    return planner_plans(cfg, profile)[0]


def same_plan(a: Plan, b: Plan) -> bool:
    return plan_params(a) == plan_params(b) and a.parallel.pp_layers == b.parallel.pp_layers


def pass_dir(out: Path, name: str, k: int) -> Path:
    return out / (name if k == 0 else f"{name}.pass{k + 1}")


def fastest(tries: list[Run | None]) -> Run | None:
    """The run with the shortest measured step among a plan's passes (failed ones left out)."""
    done = [r for r in tries if r is not None]
    return min(done, key=lambda r: r.step_time_s) if done else None


def find_or_run(plan: Plan, runs: list[Run], out: Path, name: str, steps: int, passes: int) -> Run | None:
    for r in runs:
        if same_plan(r.plan, plan):
            return r
    run = fastest([measured(plan, pass_dir(out, name, k), steps) for k in range(passes)])
    if run is not None:
        runs.append(run)
    return run


def tokens(run: Run) -> float:
    return run.plan.training.global_batch * run.plan.training.seq_len / run.step_time_s / run.plan.gpus


def scores(label: str, runs: list[Run], prof: ClusterProfile, choice: Run | None) -> None:
    ests = predict(runs, prof)
    err = errors(runs, ests)
    rho = spearmanr([e.tokens_per_s_per_gpu for e in ests], [tokens(r) for r in runs]).statistic
    best = max(tokens(r) for r in runs)
    rel = f"{tokens(choice) / best:.3f}" if choice is not None else "n/a (its run failed)"
    mem = err.mean_abs_memory
    print(f"{label}: Spearman rho (pred vs measured tok/s) {rho:+.3f} over {len(runs)} runs; "
          f"planner's top choice measured at {rel} of the best measured plan; "
          f"MAE step time {err.mean_abs_step * 100:.1f}%, peak memory {'n/a' if mem is None else f'{mem * 100:.1f}%'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="bench-runs")
    ap.add_argument("--fresh-profile", action="store_true",
                    help="first measure this machine with `meshplan profile-cluster --quick` and predict with that "
                         "profile instead of the built-in cpu-gloo (the newcomer's loop, issue 18)")
    ap.add_argument("--passes", type=int, default=2,
                    help="runs of each plan, in whole passes over the layouts; the fastest counts (a shared VM "
                         "slows some runs by up to 2x: the host's speed before each run is printed)")
    ap.add_argument("--ranks", type=int, choices=(2, 4), default=GPUS,
                    help="processes per run: 4 (13 layouts, as cpu-gloo was measured) or 2 (10 layouts)")
    args = ap.parse_args()
    out = Path(args.out)
    gpus, layouts = args.ranks, (PLANS if args.ranks == 4 else PLANS_2)
    cluster = fresh_profile(out, gpus) if args.fresh_profile else CLUSTER
    base = load_profile(cluster)
    print(f"{MODEL} on {gpus} CPU processes ({cluster}), seq {SEQ}, global batch {BATCH}, {args.steps} steps per run")
    print(f"profile: op_dispatch_s {base.overheads.op_dispatch_s * 1e6:.2f} us/op (all ranks at once; one process "
          f"now: {host_op_us():.2f})")
    print(load_line("before"), flush=True)
    # Whole passes over the layouts, so that a slow spell of the host hits different plans in each pass.
    tries = [[measured(plan_of(spec, cluster, gpus), pass_dir(out, f"plan{i:02d}", k), args.steps)
              for i, spec in enumerate(layouts)] for k in range(args.passes)]
    runs = [r for per_plan in zip(*tries) if (r := fastest(list(per_plan)))]
    moe_tries = [[measured(plan_of(spec, cluster, gpus, MOE_MODEL, ep), pass_dir(out, f"moe{i:02d}", k), args.steps)
                  for i, (spec, ep) in enumerate(MOE_PLANS[gpus])] for k in range(args.passes)]
    moe_runs = [r for per_plan in zip(*moe_tries) if (r := fastest(list(per_plan)))]
    choice_before = find_or_run(planner_choice(base, cluster, gpus), runs, out, "planner-before", args.steps,
                                args.passes)
    fit = calibrate(runs, base)
    calibrated = replace(fit.profile, name=f"{CLUSTER}-calibrated")
    choice_after = find_or_run(planner_choice(calibrated, cluster, gpus), runs, out, "planner-after", args.steps,
                               args.passes)
    print(f"\n{len(runs)} measured runs (failed runs are left out)")
    print(f"{'run':<16} {'plan':<46} {'meas tok/s':>10} {'pred before':>11} {'pred after':>10}")
    before, after = predict(runs, base), predict(runs, calibrated)
    for r, b, a in zip(runs, before, after):
        p = r.plan.parallel
        desc = (f"r{p.dp_replicate} s{p.dp_shard} c{p.cp} t{p.tp} p{p.pp} mb{r.plan.training.micro_batch} "
                f"ac={r.plan.memory.activation_checkpointing} {p.pp_schedule if p.pp > 1 else ''}")
        print(f"{Path(r.path).name:<16} {desc:<46} {tokens(r):>10.1f} {b.tokens_per_s_per_gpu:>11.1f} "
              f"{a.tokens_per_s_per_gpu:>10.1f}")
    print("\nfitted terms (in-sample: fitted on these same runs):")
    for k in fit.before:
        kept = "  (not seen by these runs: kept)" if k in fit.unconstrained else ""
        print(f"  {k:<45} {fit.before[k]:.6g} -> {fit.after[k]:.6g}{kept}")
    print()
    scores("before calibration", runs, base, choice_before)
    scores("after calibration (in-sample)", runs, calibrated, choice_after)
    moe_scores(moe_runs, base, calibrated)
    print(load_line("after"))
    return 0


def moe_scores(runs: list[Run], base: ClusterProfile, calibrated: ClusterProfile) -> None:
    """Each expert-parallel run's step-time error (predicted / measured - 1), before and after the dense fit,
    beside the measured routing: these runs took no part in the fit."""
    print(f"\n{MOE_MODEL} expert-parallel layouts (not in the fit): predicted / measured step time - 1")
    for r in runs:
        b, a = predict([r], base)[0], predict([r], calibrated)[0]
        p = r.plan.parallel
        print(f"  {Path(r.path).name:<10} ep{p.ep} s{p.dp_shard} t{p.tp} ac={r.plan.memory.activation_checkpointing:<9} "
              f"measured {r.step_time_s:.4f} s: before {b.step_time_s / r.step_time_s - 1:+.1%}, "
              f"after {a.step_time_s / r.step_time_s - 1:+.1%}")


def fresh_profile(out: Path, gpus: int) -> str:
    """`meshplan profile-cluster --nproc gpus --quick` into out/fresh.yaml (kept: a rerun reuses it)."""
    path = (out / "fresh.yaml").resolve()
    if not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "meshplan", "profile-cluster", "--nproc", str(gpus), "--quick", "--out", str(path)]
        print("$ " + " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True)
    return str(path)


def load_line(when: str) -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {when}: {one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min) on {os.cpu_count()} cores"


if __name__ == "__main__":
    raise SystemExit(main())
