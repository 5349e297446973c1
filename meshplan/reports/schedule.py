"""The pipeline schedule of a plan: the same simulate() events the estimate's step time came from.

`cost_models.estimate.pipeline_schedule` re-runs the simulation the estimate used (same stage
durations, same schedule); this module checks the result against the estimate (bubble and
makespan) so a drift between the two is an error, never a silently wrong picture.
"""

from __future__ import annotations

from meshplan.cost_models.estimate import Estimate, pipeline_schedule
from meshplan.cost_models.pipeline import ScheduleResult

__all__ = ["ScheduleMismatch", "check_schedule", "implied_makespan", "pipeline_schedule"]

# time_s entries that are added to the pipeline makespan to make the step time.
OUTSIDE_PIPELINE = ("fsdp_comm", "dp_comm", "optimizer", "overhead")


class ScheduleMismatch(RuntimeError):
    """The schedule rebuilt here does not reproduce the estimate's pipeline numbers."""


def implied_makespan(est: Estimate) -> float:
    """The pipeline makespan inside the estimate's step time."""
    return est.step_time_s - sum(est.time_s.get(k, 0.0) for k in OUTSIDE_PIPELINE)


def check_schedule(result: ScheduleResult, est: Estimate, rel_tol: float = 1e-9) -> None:
    """Raise ScheduleMismatch unless `result` has the estimate's makespan and bubble."""
    tol = rel_tol * max(est.step_time_s, 1e-12)
    makespan = implied_makespan(est)
    bubble = est.time_s.get("pipeline_bubble", 0.0)
    if abs(result.makespan - makespan) > tol or abs(result.bubble_time - bubble) > tol:
        raise ScheduleMismatch(
            f"schedule model gives makespan {result.makespan:.6g} s, bubble {result.bubble_time:.6g} s; "
            f"the estimate used {makespan:.6g} s, {bubble:.6g} s")
