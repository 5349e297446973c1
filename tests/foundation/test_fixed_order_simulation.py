"""fixed_order.py is simulation._run specialised: on every fixed-order schedule, split backward included
(InterleavedZeroBubble), it must give the general loop's result to the last bit, blocks, memory phases
and early stops included."""

from __future__ import annotations

import random

import pytest

import meshplan.cost_models.pipeline.simulation as simulation
from meshplan.cost_models.pipeline.fixed_order import is_fixed_order
from meshplan.cost_models.pipeline.schedule import build_schedule
from meshplan.specs.rules import microbatch_reason


def _both(monkeypatch, *args):
    fast = simulation.simulate(*args)
    with monkeypatch.context() as m:
        m.setattr(simulation, "is_fixed_order", lambda sched: False)  # the general loop
        general = simulation.simulate(*args)
    return fast, general


def test_which_schedules_take_the_fixed_order_loop():
    assert is_fixed_order(build_schedule("1F1B", 4, 1, 8))
    assert is_fixed_order(build_schedule("Interleaved1F1B", 4, 2, 8))
    assert is_fixed_order(build_schedule("GPipe", 4, 1, 8)) and is_fixed_order(build_schedule("LoopedBFS", 2, 2, 4))
    assert is_fixed_order(build_schedule("InterleavedZeroBubble", 4, 2, 8))  # split backward, fixed orders
    assert not is_fixed_order(build_schedule("ZBVZeroBubble", 4, 2, 8))  # V-shaped: greedy ranks
    assert not is_fixed_order(build_schedule("DualPipeV", 4, 2, 8))


def test_random_durations_give_the_general_loops_result_exactly(monkeypatch):
    rng = random.Random(20261127)
    checked = stopped = 0
    while checked < 500:
        sched = rng.choice(["GPipe", "1F1B", "LoopedBFS", "Interleaved1F1B", "InterleavedZeroBubble"])
        pp = rng.choice([2, 3, 4, 8])
        v = 1 if sched in ("GPipe", "1F1B") else rng.choice([2, 3, 4])
        m = rng.choice([1, 2, 3, 4, 5, 8, 12, 16])
        if microbatch_reason(sched, pp, v, m):
            continue
        n = pp * v
        f = [rng.choice([1.0, rng.uniform(0.1, 3.0)]) for _ in range(n)]  # ties as well as spread
        b = [rng.uniform(0.1, 5.0) for _ in range(n)]
        w = [rng.uniform(0.0, 1.0) for _ in range(n)]
        kept = rng.choice([None, [rng.uniform(0.0, 0.3) for _ in range(n)]])
        limit = rng.choice([None, [rng.choice([1.5, 3.0, 5.0, 100.0]) for _ in range(pp)]])
        share = rng.choice([1.0, 1.3]) if sched == "InterleavedZeroBubble" else 1.0  # memory.weight_pass_share
        fast, general = _both(monkeypatch, sched, pp, v, m, f, b, w, rng.choice([0.0, 0.2]), share,
                              rng.random() < 0.5, kept, limit)
        assert (fast.makespan, fast.busy, fast.peak_in_flight, fast.phases, fast.exceeded, fast.blocks) == \
            (general.makespan, general.busy, general.peak_in_flight, general.phases, general.exceeded,
             general.blocks), (sched, pp, v, m)
        checked += 1
        stopped += fast.exceeded
    assert 0 < stopped < checked  # both ends of the held limit were exercised


@pytest.mark.parametrize("sched,v", [("1F1B", 1), ("Interleaved1F1B", 2)])
def test_one_f_one_b_with_equal_stages_by_hand(sched, v):
    """pp 4, 8 micro-batches, every stage 1 forward + 2 backward, no sends: (m + pp - 1) x (f + b) per
    chunk for 1F1B, the known 1F1B makespan."""
    res = simulation.simulate(sched, 4, v, 8, [1.0 / v] * (4 * v), [2.0 / v] * (4 * v), [0.0] * (4 * v))
    if sched == "1F1B":
        assert res.makespan == pytest.approx((8 + 4 - 1) * 3.0)
    assert max(res.busy) == pytest.approx(8 * 3.0)
