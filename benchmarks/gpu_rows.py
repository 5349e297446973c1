"""The estimate against the steps meshplan's runtime took on a lent GPU (benchmarks/plans/gpu_rows.csv:
each row a plan file, the measured median step and the committed output it comes from). Out of sample:
no constant is fitted on these rows. Prints, per row, the prediction, the error and what the host adds
beyond the kernels (cost_models/host.py host_beyond), then MAPE, bias and Spearman's rank correlation
per model.

    python benchmarks/gpu_rows.py [--profile h200-141g-dgx]
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import replace
from pathlib import Path

from scipy.stats import spearmanr

from meshplan.cost_models.estimate import estimate_plan
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import load_plan

PLANS = Path(__file__).parent / "plans"


def without_host(prof):
    """The profile with its host costs zeroed: what the estimate said before it priced them on GPUs."""
    o = replace(prof.overheads, op_dispatch_s=0.0, python_dispatch_s=0.0, checkpoint_op_s=0.0, sac_op_s=0.0)
    return replace(prof, overheads=o)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="h200-141g-dgx", help="profile the rows ran on (default h200-141g-dgx)")
    prof = load_profile(ap.parse_args().profile)
    bare = without_host(prof)
    rows = list(csv.DictReader((PLANS / "gpu_rows.csv").open()))
    print(f"{'plan':28s} {'measured s':>10s} {'predicted':>9s} {'error':>7s} {'no host':>8s} {'error':>7s}")
    by_model: dict[str, list[tuple[float, float, float]]] = {}
    for r in rows:
        plan = load_plan(PLANS / r["plan"])
        meas = float(r["measured_s"])
        pred, base = estimate_plan(plan, prof).step_time_s, estimate_plan(plan, bare).step_time_s
        by_model.setdefault(plan.model.name, []).append((meas, pred, base))
        print(f"{r['plan']:28s} {meas:10.3f} {pred:9.3f} {pred / meas - 1:+7.1%} {base:8.3f} {base / meas - 1:+7.1%}")
    print()
    for model, got in by_model.items():
        for label, i in (("host priced", 1), ("host unpriced", 2)):
            errs = [p[i] / p[0] - 1 for p in got]
            rho = spearmanr([p[0] for p in got], [p[i] for p in got]).statistic
            print(f"{model:12s} {label:14s} MAPE {sum(map(abs, errs)) / len(errs):6.1%}  bias {sum(errs) / len(errs):+6.1%}  "
                  f"Spearman {rho:+.2f}  ({len(got)} rows)")


if __name__ == "__main__":
    main()
