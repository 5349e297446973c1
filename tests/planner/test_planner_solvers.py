"""The planner's exact sub-solvers against brute force: the SAC ILP (pulp and enumeration), the
balanced stage split, and the pipeline makespan lower bound."""

from __future__ import annotations

import itertools
import random

import pytest

from meshplan.cost_models.pipeline import bound_kind, linear_bound_rows, makespan_lower_bound, simulate
from meshplan.specs.rules import microbatch_reason
from meshplan.planner.sac_ilp import SacItems, best_subset, pareto_subsets, solve_sac_ilp
from meshplan.planner.stage_split import balanced_split, balanced_split_costs, brute_force_split, max_stage_time
from meshplan.specs.plan import PP_SCHEDULES, SAC_OPS

ALL_SUBSETS = [tuple(s) for r in range(len(SAC_OPS) + 1) for s in itertools.combinations(SAC_OPS, r)]


# ---------------------------------------------------------------------------------------------
# SAC ILP
# ---------------------------------------------------------------------------------------------
def random_items(rng: random.Random) -> SacItems:
    """Per-kind bytes and recompute seconds; some kinds cost nothing to recompute (like ffn_out in
    the cost model) or nothing to save, but never both (see test_sac_pulp_free_kind)."""
    while True:
        b = {k: rng.choice([0.0, rng.uniform(1, 4096), float(rng.randint(1, 8) * 256)]) for k in SAC_OPS}
        t = {k: rng.choice([0.0, rng.uniform(1e-8, 1e-6), rng.uniform(1e-8, 1e-6)]) for k in SAC_OPS}
        if all(b[k] or t[k] for k in SAC_OPS):
            return SacItems(SAC_OPS, b, rng.uniform(0, 1024), t, rng.choice([0.0, rng.uniform(1e-8, 2e-6)]))


def brute_optimum(items: SacItems, budget: float) -> float | None:
    """Least recompute time over all 2^5 subsets whose bytes fit the budget; None if none does."""
    times = [items.time_of(s) for s in ALL_SUBSETS if items.bytes_of(s) <= budget]
    return min(times) if times else None


def sac_cases(n: int = 24):
    rng = random.Random(20241201)
    cases = []
    for i in range(n):
        items = random_items(rng)
        lo, hi = items.bytes_of(()), items.bytes_of(SAC_OPS)
        budgets = [lo * 0.5 - 1.0,  # infeasible: even saving nothing exceeds it
                   lo,  # exactly the always-kept bytes
                   rng.uniform(lo, hi), rng.uniform(lo, hi),
                   items.bytes_of(rng.choice(ALL_SUBSETS)),  # exactly one subset's bytes
                   hi * 2]
        cases += [(i, items, budget) for budget in budgets]
    return cases


CASES = sac_cases()


@pytest.mark.parametrize("solver", ["enumeration", "pareto"])
def test_sac_enumeration_matches_brute_force(solver):
    """best_subset and the pareto list the search walks give the brute-force optimum on every case."""
    for i, items, budget in CASES:
        want = brute_optimum(items, budget)
        if solver == "enumeration":
            got = best_subset(items, budget)
        else:  # the search takes the first pareto subset within the budget
            got = next((s for s in pareto_subsets(items) if items.bytes_of(s) <= budget), None)
        assert_optimal(i, items, budget, got, want, rel=1e-12, abs_=1e-18)


def assert_optimal(i, items, budget, got, want, rel, abs_):
    """`got` is a subset within budget with the brute-force optimum's recompute (or both are None)."""
    if want is None:
        assert got is None, (i, budget, got)
        return
    assert got is not None, (i, budget)
    assert items.bytes_of(got) <= budget * (1 + rel), (i, budget, got)
    assert items.time_of(got) == pytest.approx(want, rel=rel, abs=abs_), (i, budget, got)


def test_sac_pulp_matches_brute_force():
    """pulp/CBC solves the same ILP to the same optimum (a subset of the cases: CBC costs ~20 ms each)."""
    for i, items, budget in CASES[::5]:
        want = brute_optimum(items, budget)
        got = solve_sac_ilp(items, budget)
        assert_optimal(i, items, budget, got, want, rel=1e-9, abs_=1e-15)


def test_sac_pulp_free_kind():
    b = {"qkv": 256.0, "attention": 0.0, "attn_out": 128.0, "ffn_in": 512.0, "ffn_out": 128.0}
    t = {"qkv": 1e-7, "attention": 0.0, "attn_out": 2e-8, "ffn_in": 6e-8, "ffn_out": 0.0}
    items = SacItems(SAC_OPS, b, 512.0, t, 1e-6)
    budget = 512.0 + 300.0
    got = solve_sac_ilp(items, budget)
    assert got is not None and items.time_of(got) == pytest.approx(brute_optimum(items, budget))


def test_sac_pulp_solves_without_the_environment_on_path(monkeypatch):
    """`python -m meshplan plan` through the venv's python, not activated: CBC is not on PATH, and the ILP
    must still solve (it raised PulpSolverError 'cannot execute cbc' before)."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    b = {"qkv": 256.0, "attention": 0.0, "attn_out": 128.0, "ffn_in": 512.0, "ffn_out": 128.0}
    t = {"qkv": 1e-7, "attention": 0.0, "attn_out": 2e-8, "ffn_in": 6e-8, "ffn_out": 0.0}
    items = SacItems(SAC_OPS, b, 512.0, t, 1e-6)
    got = solve_sac_ilp(items, 512.0 + 300.0)
    assert got is not None and items.time_of(got) == pytest.approx(brute_optimum(items, 512.0 + 300.0))


def test_sac_pareto_is_the_frontier():
    """Every subset is weakly dominated by a pareto subset, and pareto subsets are strictly ordered."""
    for _, items, _ in CASES[::6]:
        front = pareto_subsets(items)
        pts = [(items.time_of(s), items.bytes_of(s)) for s in front]
        assert pts == sorted(pts)
        assert all(b1 > b2 for (_, b1), (_, b2) in zip(pts, pts[1:]))
        for s in ALL_SUBSETS:
            t, b = items.time_of(s), items.bytes_of(s)
            assert any(tp <= t + 1e-18 and bp <= b + 1e-9 for tp, bp in pts), s


# ---------------------------------------------------------------------------------------------
# Balanced stage split
# ---------------------------------------------------------------------------------------------
def split_cases():
    rng = random.Random(7)
    out = []
    for n_layers in range(1, 13):
        for stages in range(1, min(4, n_layers) + 1):
            for _ in range(4):
                layer = rng.choice([1.0, rng.uniform(0.1, 3.0)])
                extras = [rng.choice([0.0, rng.uniform(0, 3 * layer), float(rng.randint(0, 4)) * layer])
                          for _ in range(stages)]
                out.append((n_layers, extras, layer))
    return out


@pytest.mark.parametrize("n_layers,extras,layer", split_cases()[::3])
def test_balanced_split_is_optimal(n_layers, extras, layer):
    split = balanced_split(n_layers, extras, layer)
    assert len(split) == len(extras) and sum(split) == n_layers and min(split) >= 1
    want = brute_force_split(n_layers, extras, layer)
    assert max_stage_time(split, extras, layer) == pytest.approx(want, rel=1e-12)


def test_balanced_split_all_cases():
    """The parametrised test above samples; this one sweeps every generated case at once."""
    for n_layers, extras, layer in split_cases():
        split = balanced_split(n_layers, extras, layer)
        assert sum(split) == n_layers and min(split) >= 1
        assert max_stage_time(split, extras, layer) == pytest.approx(brute_force_split(n_layers, extras, layer),
                                                                    rel=1e-12), (n_layers, extras, layer, split)


def test_balanced_split_with_layers_of_different_costs_is_optimal():
    """Dense first layers cost differently from MoE ones: the split over per-layer costs against brute force,
    and equal costs give the uniform split's optimum."""
    rng = random.Random(7)
    for _ in range(300):
        n_layers = rng.randint(1, 9)
        stages = rng.randint(1, min(4, n_layers))
        costs = [rng.choice([1.0, 0.4, rng.uniform(0.1, 3.0)]) for _ in range(n_layers)]
        extras = [rng.choice([0.0, rng.uniform(0, 3.0)]) for _ in range(stages)]
        split = balanced_split_costs(costs, extras)
        assert len(split) == stages and sum(split) == n_layers and min(split) >= 1
        starts = [sum(split[:s]) for s in range(stages)]
        got = max(sum(costs[a:a + k]) + e for a, k, e in zip(starts, split, extras))
        assert got == pytest.approx(brute_force_split(n_layers, extras, costs), rel=1e-9), (costs, extras, split)
    for n_layers, extras, layer in split_cases()[::5]:
        split = balanced_split_costs([layer] * n_layers, extras)
        assert max_stage_time(split, extras, layer) == pytest.approx(brute_force_split(n_layers, extras, layer),
                                                                    rel=1e-9)


# ---------------------------------------------------------------------------------------------
# Pipeline makespan lower bound
# ---------------------------------------------------------------------------------------------
def _vs(schedule: str) -> list[int]:
    if schedule in ("GPipe", "1F1B"):
        return [1]
    if schedule in ("ZBVZeroBubble", "DualPipeV"):
        return [2]
    return [1, 2, 3]


def test_makespan_lower_bound_never_exceeds_simulation():
    rng = random.Random(11)
    checked = 0
    for trial in range(40):
        pp = rng.choice([2, 3, 4])
        for schedule in PP_SCHEDULES:
            for v in _vs(schedule):
                m = rng.choice([1, 2, 3, 4, pp, 2 * pp, 2 * pp + 1, 4 * pp])
                if microbatch_reason(schedule, pp, v, m):
                    continue
                n = pp * v
                f = [rng.uniform(0.1, 2.0) for _ in range(n)]
                b = [rng.uniform(0.1, 3.0) for _ in range(n)]
                w = [rng.choice([0.0, rng.uniform(0.0, 1.5)]) for _ in range(n)]
                p2p = rng.choice([0.0, rng.uniform(0, 0.5)])
                try:
                    res = simulate(schedule, pp, v, m, f, b, w, p2p)
                except RuntimeError:
                    continue  # the search counts these as rejected; nothing to bound
                lb = makespan_lower_bound(schedule, pp, v, m, f, b, w, p2p)
                assert lb <= res.makespan * (1 + 1e-12), (schedule, pp, v, m, f, b, w, p2p, lb, res.makespan)
                # and the bound is at least every rank's own work
                assert lb >= max(res.busy) * (1 - 1e-12)
                checked += 1
    assert checked > 300


def test_makespan_lower_bound_tight_for_equal_stages():
    """With equal stages the documented closed forms are what 1F1B / GPipe reach: (m + p - 1)(F + B)."""
    for schedule in ("GPipe", "1F1B"):
        for pp, m in [(2, 4), (4, 8), (3, 3)]:
            f, b = [1.0] * pp, [2.0] * pp
            res = simulate(schedule, pp, 1, m, f, b, [0.0] * pp, 0.0)
            lb = makespan_lower_bound(schedule, pp, 1, m, f, b, [0.0] * pp, 0.0)
            assert lb == pytest.approx((m + pp - 1) * 3.0)
            assert res.makespan == pytest.approx(lb)


def test_linear_bound_rows_equal_the_bound_on_linear_durations():
    """The planner's per-rank rows give makespan_lower_bound exactly when each stage's durations are
    its layers times a layer's plus the embedding on the first stage and the head on the last."""
    rng = random.Random(5)
    checked = 0
    for _ in range(60):
        pp = rng.choice([2, 3, 4, 8])
        schedule = rng.choice(PP_SCHEDULES)
        v = rng.choice(_vs(schedule))
        n = pp * v
        layers = tuple(rng.randint(1, 6) for _ in range(n))
        a_f, a_b, a_w = rng.uniform(0.1, 1), rng.uniform(0.1, 2), rng.choice([0.0, rng.uniform(0, 1)])
        emb, head_f, head_b = rng.uniform(0, 0.5), rng.uniform(0, 2), rng.uniform(0, 3)
        m, p2p = rng.randint(1, 3 * pp), rng.choice([0.0, rng.uniform(0, 0.2)])
        f = [k * a_f + (emb if s == 0 else 0.0) + (head_f if s == n - 1 else 0.0) for s, k in enumerate(layers)]
        b = [k * a_b + (head_b if s == n - 1 else 0.0) for s, k in enumerate(layers)]
        w = [k * a_w for k in layers]
        x = [a_f, a_b + a_w, m * (a_f + a_b + a_w), m * emb, m * (head_f + head_b), emb, p2p]
        linear = float((linear_bound_rows(pp, v, *bound_kind(schedule), layers) @ x).max())
        assert linear == pytest.approx(makespan_lower_bound(schedule, pp, v, m, f, b, w, p2p), rel=1e-12)
        checked += 1
    assert checked == 60
