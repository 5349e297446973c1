"""The schedule the reports draw is the one the estimate's step time came from."""

import dataclasses

import pytest

from meshplan.cost_models.estimate import estimate_plan
from meshplan.profiles.registry import load_profile
from meshplan.reports.schedule import ScheduleMismatch, check_schedule, implied_makespan, pipeline_schedule

from meshplan.specs.plan import plan_from_dict
from meshplan.specs.rules import SPLIT_BACKWARD_SCHEDULES
from report_fixtures import make_plan, plan_dict

SCHEDULES = [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("LoopedBFS", 2), ("InterleavedZeroBubble", 2)]


@pytest.mark.parametrize("schedule,v", SCHEDULES)
def test_schedule_reproduces_estimate(schedule, v):
    d = plan_dict(pp_schedule=schedule, pp_virtual_stages=v)
    if schedule in SPLIT_BACKWARD_SCHEDULES:  # selective AC does not run there (specs/rules.py)
        d["memory"]["activation_checkpointing"] = "full"
    plan = plan_from_dict(d)
    prof = load_profile(plan.cluster)
    est = estimate_plan(plan, prof)
    res = pipeline_schedule(plan, prof)
    assert res.schedule == schedule and res.pp == 4 and res.virtual_stages == v
    assert res.makespan == pytest.approx(implied_makespan(est), rel=1e-12)
    assert res.bubble_time == pytest.approx(est.time_s["pipeline_bubble"], rel=1e-9, abs=1e-12)
    assert res.bubble_fraction == pytest.approx(est.pipeline["bubble_fraction"], rel=1e-9, abs=1e-12)
    assert [max(res.peak_in_flight)] == [max(est.pipeline["in_flight"])]
    check_schedule(res, est)


def test_no_schedule_without_pp():
    plan = make_plan(pp=1, dp_shard=16)
    assert pipeline_schedule(plan, load_profile(plan.cluster)) is None


def test_mismatch_is_detected():
    plan = make_plan()
    prof = load_profile(plan.cluster)
    est = estimate_plan(plan, prof)
    res = pipeline_schedule(plan, prof)
    skewed = dataclasses.replace(est, step_time_s=est.step_time_s * 1.01)
    with pytest.raises(ScheduleMismatch):
        check_schedule(res, skewed)
