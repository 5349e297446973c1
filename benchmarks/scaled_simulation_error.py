"""How far does the planner's screening simulation put a pipelined leaf from its exact schedule?

    python benchmarks/scaled_simulation_error.py > benchmarks/results/scaled_simulation_error.txt

The planner simulates a pipelined leaf's schedule on durations in units of its first stage's forward,
rounded to 1 % (planner/scoring.py, Scoring.simulate_scaled), so one simulation serves many leaves. A
leaf that this screening puts within RESIMULATE_WITHIN of the K-th best is simulated again on its own
durations before the pool takes or leaves it. That margin must exceed the screening's error, which
this measures: every screening simulation of a few searches that ran to the end is repeated on the
leaf's own durations, and the relative error of the makespan printed (the step adds exact terms to
the makespan, so its relative error is smaller still). No assertions: this prints, it does not judge.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "planner"))

from planner_brute import make_plan  # noqa: E402

from meshplan.cost_models.memory import weight_pass_share  # noqa: E402
from meshplan.cost_models.pipeline import simulate_cached  # noqa: E402
from meshplan.planner import scoring  # noqa: E402
from meshplan.planner.search import search  # noqa: E402
from meshplan.profiles.registry import load_profile  # noqa: E402
from meshplan.commands.plan import build_plan_mapping, parser  # noqa: E402
from meshplan.specs.plan import plan_from_dict  # noqa: E402

# (label, plan, profile, top K, excludes): the planner-workers test's 400-best search, and two of the
# README's planner cases at their default K.
CASES = [
    ("small, 512 GPUs, top 400 (tests/planner/test_planner_workers.py)",
     lambda: make_plan("small", 512, 1024, 4096, "h100-80g-dgx", ()), "h100-80g-dgx", 400, {"parallel.tp": [1]}),
    ("meshplan plan --model llama70b --gpus 384", lambda: cli_plan("llama70b", 384), "h100-80g-dgx", 10, None),
    ("meshplan plan --model llama3-405b --gpus 4096", lambda: cli_plan("llama3-405b", 4096), "h100-80g-dgx", 10, None),
]


def cli_plan(model: str, gpus: int):
    """The plan `meshplan plan --model MODEL --gpus GPUS` searches."""
    return plan_from_dict(build_plan_mapping(parser().parse_args(["--model", model, "--gpus", str(gpus)])))


def screened_errors(make, cluster: str, top_k: int, excludes) -> list[tuple[str, float]]:
    errors: list[tuple[str, float]] = []
    screen = scoring.Scoring.simulate_scaled

    def measured(self, lay, d, held_limit):
        got = screen(self, lay, d, held_limit)
        if got is not None:
            exact = simulate_cached(lay.schedule, lay.pp, lay.v, lay.n_micro, tuple(d.forward), tuple(d.backward),
                                    tuple(d.weight), d.p2p, None, weight_pass_share(lay))[0]
            errors.append((lay.schedule, got[0] / exact - 1))
        return got

    scoring.Scoring.simulate_scaled = measured
    try:
        search(make(), load_profile(cluster), top_k=top_k, excludes=excludes, jobs=1)
    finally:
        scoring.Scoring.simulate_scaled = screen
    return errors


def main() -> None:
    print(f"makespan on durations rounded to 1% / makespan on the leaf's own durations - 1; "
          f"RESIMULATE_WITHIN = {scoring.RESIMULATE_WITHIN:.2%}")
    every: list[tuple[str, float]] = []
    for label, make, cluster, top_k, excludes in CASES:
        found = screened_errors(make, cluster, top_k, excludes)
        every += found
        e = np.array([x for _, x in found])
        print(f"{label}: {len(e):,} screening simulations ran to the end; error min {e.min():+.3%}, "
              f"max {e.max():+.3%}, 99th percentile of |error| {np.percentile(abs(e), 99):.3%}")
    print("largest |error| by schedule, over every case:")
    for schedule in sorted({s for s, _ in every}):
        e = np.array([x for s, x in every if s == schedule])
        print(f"  {schedule:<24} {abs(e).max():.3%} over {len(e):,}")
    print(f"all: {len(every):,} simulations; largest |error| {max(abs(x) for _, x in every):.3%}")

if __name__ == "__main__":
    main()
