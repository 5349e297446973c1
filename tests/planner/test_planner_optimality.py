"""The planner returns the brute-force optimum of its declared space.

Every complete plan of the space is enumerated independently (planner_brute.enumerate_space), scored
with the cost model's estimate_layout, and the fastest one that fits is compared with the search's
winner. Memory budgets are set between distinct peaks of the enumerated plans (never exactly on one),
from loose (everything fits) to tight (a handful fits), by giving a copy of the profile less usable
memory: the estimates do not depend on it, so one enumeration serves every budget.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from planner_brute import enumerate_space, make_plan, rel, tight_profile  # noqa: E402

from meshplan.cost_models.estimate import estimate_layout  # noqa: E402
from meshplan.cost_models.layout import even_split  # noqa: E402
from meshplan.planner.search import search  # noqa: E402
from meshplan.profiles.registry import load_profile  # noqa: E402
from meshplan.specs.plan import SAC_OPS  # noqa: E402

CLUSTER = "h100-80g-dgx"
# name: (model, gpus, seq_len, global_batch, fixes on both sides)
CASES = {
    "tiny-4l-8gpu": ("tiny-4l", 8, 256, 16, ("compile=true", "memory.float8=false", "parallel.async_tp=false")),
    "small-4gpu": ("small", 4, 256, 8, ("compile=true", "memory.float8=false")),
    "tiny-gpt-4gpu": ("tiny-gpt", 4, 256, 8, ("compile=true",)),
    "tiny-4l-8gpu-no-ac": ("tiny-4l", 8, 256, 16, ("compile=true", "memory.float8=false", "parallel.async_tp=false",
                                                   "memory.activation_checkpointing=none")),
}
QUANTILES = {"tiny-4l-8gpu": (1.0, 0.5, 0.2, 0.05, 0.01, 0.002), "small-4gpu": (1.0, 0.5, 0.2, 0.05, 0.01, 0.002),
             "tiny-gpt-4gpu": (1.0, 0.2, 0.01), "tiny-4l-8gpu-no-ac": (1.0, 0.05)}


_ROWS: dict = {}


def scored_space(name):
    """[(step, peak, layout, order)] for every leaf of the case's space (cached per module)."""
    if name not in _ROWS:
        model, gpus, seq, gb, fix = CASES[name]
        plan = make_plan(model, gpus, seq, gb, CLUSTER, fix)
        prof = load_profile(CLUSTER)
        rows = []
        for lay, order in enumerate_space(plan, prof, gb):
            try:
                e = estimate_layout(lay, prof, order)
            except RuntimeError:
                continue
            rows.append((e.step_time_s, e.peak_memory_gib, lay, order))
        _ROWS[name] = (plan, rows)
    return _ROWS[name]


def budget_at(peaks: list[float], q: float) -> float:
    """A usable memory strictly between two distinct peaks around quantile q (above the largest for q=1)."""
    i = min(len(peaks) - 1, int(q * (len(peaks) - 1)))
    above = next((p for p in peaks[i:] if p > peaks[i]), None)
    return (peaks[i] + above) / 2 if above is not None else peaks[i] * (1 + 1e-6)


def params():
    out = []
    for name in CASES:
        for q in QUANTILES[name]:
            out.append(pytest.param(name, q, None, id=f"{name}-q{q}"))
    return out


@pytest.mark.parametrize("name,q,usable", params())
def test_planner_finds_brute_force_optimum(name, q, usable):
    plan, rows = scored_space(name)
    peaks = sorted(r[1] for r in rows)
    if usable is None:
        usable = budget_at(peaks, q)
    fitting = [r for r in rows if r[1] <= usable]
    assert fitting
    want = min(fitting, key=lambda r: r[0])
    res = search(plan, tight_profile(CLUSTER, usable), top_k=5)
    n = res.counts()
    assert n["accounted"] == n["space"]
    assert res.best is not None, f"planner found nothing; brute force: {want[0]} with {want[2]}"
    got = res.best.estimate.step_time_s
    assert rel(got, want[0]) <= 1e-9, (f"planner {got} vs brute force {want[0]}",
                                       res.best.layout, res.best.order, want[2], want[3])
    # and the ranked list below the winner is the brute-force order of the fitting plans
    assert res.best.estimate.peak_memory_gib <= usable


@pytest.mark.parametrize("q", (1.0, 0.5, 0.2, 0.05))
def test_planner_top_k_are_the_brute_force_k_fastest(q):
    """Not only the winner: the K plans the search keeps are the K fastest that fit, by their exact estimates.
    AC is fixed off, as the search settles a selective plan's subset per leaf where brute force lists
    every one. Pipelined leaves are screened on rounded simulations, and those near the K-th time are
    simulated exactly before the pool takes or leaves them (scoring.RESIMULATE_WITHIN): without that,
    at q = 0.2 the 32nd to 40th kept were not the brute force's."""
    plan, rows = scored_space("tiny-4l-8gpu-no-ac")
    usable = budget_at(sorted(r[1] for r in rows), q)
    want = sorted(r[0] for r in rows if r[1] <= usable)[:40]
    assert len(want) == 40 and len({round(t, 12) for t in want}) > 20
    res = search(plan, tight_profile(CLUSTER, usable), top_k=40)
    assert [c.estimate.step_time_s for c in res.ranked] == pytest.approx(want, rel=1e-9)
    assert sum(c.layout.pp > 1 for c in res.ranked) >= 10  # the kept include pipelined leaves


def scan_misses(name, n_budgets=40, top_fraction=0.12):
    """Budgets spread over the lowest peaks (where memory binds): those where the planner misses the optimum."""
    plan, rows = scored_space(name)
    peaks = sorted(r[1] for r in rows)
    misses = []
    for k in range(n_budgets):
        usable = budget_at(peaks, top_fraction * k / n_budgets)
        fitting = [r for r in rows if r[1] <= usable]
        want = min(fitting, key=lambda r: r[0])
        res = search(plan, tight_profile(CLUSTER, usable), top_k=1)
        got = res.best.estimate.step_time_s if res.best else None
        if got is None or rel(got, want[0]) > 1e-9:
            misses.append((usable, got, want[0], want[2]))
    return misses


def test_planner_optimum_dense_scan_of_tight_budgets():
    """Where memory binds hardest (the lowest 12% of peaks), 20 budgets: the winner is always the optimum.
    (Pipelined plans whose SAC choice is memory-tight are covered by test_sac_choice_is_brute_force_optimum_pp2.)"""
    misses = scan_misses("small-4gpu", n_budgets=20)
    assert not misses, f"{len(misses)} budgets missed, e.g. {misses[0]}"


def test_brute_force_space_is_not_trivial():
    """The enumerated spaces contain pipelines, TP, CP, HSDP and SAC subsets, and budgets that bind."""
    plan, rows = scored_space("tiny-4l-8gpu")
    lays = [r[2] for r in rows]
    assert any(l.pp > 1 for l in lays) and any(l.tp > 1 for l in lays) and any(l.cp > 1 for l in lays)
    assert any(l.dp_replicate > 1 and l.dp_shard > 1 for l in lays)
    assert len({l.sac_ops for l in lays if l.ac == "selective"}) == 33  # 32 subsets + TorchTitan's policy
    assert len({l.schedule for l in lays if l.pp > 1}) == 7
    _, rows8 = scored_space("small-4gpu")  # 8 layers: the balanced split differs from the even one
    assert any(l.pp > 1 and len(set(l.stage_layers)) > 1 and l.stage_layers != even_split(8, l.n_stages)
               for _, _, l, _ in rows8)


# ---------------------------------------------------------------------------------------------
# The planner's SAC choice equals the optimum over all 32 subsets, under tight memory
# ---------------------------------------------------------------------------------------------
FIXED_PP1 = ("compile=true", "parallel.dp_replicate=1", "parallel.dp_shard=1", "parallel.cp=1", "parallel.tp=4",
             "parallel.pp=1", "training.micro_batch=1", "parallel.sequence_parallel=false",
             "parallel.async_tp=true", "memory.float8=false", "memory.activation_checkpointing=selective",
             "memory.reshard_after_forward=true")
FIXED_PP2 = ("compile=true", "parallel.dp_replicate=1", "parallel.dp_shard=1", "parallel.cp=1", "parallel.tp=2",
             "parallel.pp=2", "parallel.pp_schedule=1F1B", "training.micro_batch=1",
             "parallel.sequence_parallel=false", "parallel.async_tp=true", "memory.float8=false",
             "memory.activation_checkpointing=selective")


def subsets_scored(plan, order=None):
    """Every SAC subset of the single plan `plan` fixes (but sac_ops), scored with estimate_layout."""
    prof = load_profile(CLUSTER)
    res = search(plan, prof, top_k=1)  # only to get the complete layout the fixes describe
    lay, order = res.best.layout, res.best.order
    out = []
    for r in range(len(SAC_OPS) + 1):
        for s in itertools.combinations(SAC_OPS, r):
            e = estimate_layout(lay.with_(sac_ops=s), prof, order)
            out.append((s, e.step_time_s, e.time_s["recompute"], e.peak_memory_gib))
    return out


def sac_budgets(scored):
    peaks = sorted({x[3] for x in scored})
    return [(a + b) / 2 for a, b in zip(peaks, peaks[1:])] + [peaks[-1] * (1 + 1e-6)]


def check_sac_choice(plan, scored, usable):
    fitting = [x for x in scored if x[3] <= usable]
    res = search(plan, tight_profile(CLUSTER, usable), top_k=1)
    assert res.best is not None, f"nothing chosen at {usable}; fitting subsets: {[x[0] for x in fitting]}"
    chosen = res.best.layout.sac_ops
    e = res.best.estimate
    assert e.peak_memory_gib <= usable
    assert rel(e.step_time_s, min(x[1] for x in fitting)) <= 1e-9, (usable, chosen, sorted(fitting, key=lambda x: x[1])[:3])
    assert e.time_s["recompute"] <= min(x[2] for x in fitting) * (1 + 1e-9) + 1e-18, (chosen, usable)
    return res


def test_sac_choice_is_brute_force_optimum_pp1():
    plan = make_plan("small", 4, 256, 8, CLUSTER, FIXED_PP1)
    scored = subsets_scored(plan)
    budgets = sac_budgets(scored)
    assert len(budgets) >= 8
    for usable in budgets[::3] + budgets[-1:]:
        res = check_sac_choice(plan, scored, usable)
        if res.best.layout.ac == "selective":
            assert "agrees" in res.sac_ilp_check, res.sac_ilp_check


def test_sac_choice_is_brute_force_optimum_pp2():
    plan = make_plan("small", 4, 256, 8, CLUSTER, FIXED_PP2)
    scored = subsets_scored(plan)
    for usable in sac_budgets(scored):
        check_sac_choice(plan, scored, usable)


def test_sac_choice_at_exact_budget():
    plan = make_plan("small", 4, 256, 8, CLUSTER, FIXED_PP1)
    scored = subsets_scored(plan)
    for usable in sorted({x[3] for x in scored}):
        check_sac_choice(plan, scored, usable)
