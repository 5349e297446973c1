"""The pipeline schedule of a plan: the same simulate() events the estimate's step time came from.

`estimate_layout` computes per-stage forward / backward-input / backward-weight durations and the
stage-to-stage send time, then simulates the schedule, but only returns summary numbers. This
module assembles those durations from the same public cost-model functions and runs the same
`simulate`, then checks the result against the estimate (bubble and makespan) so a drift between
the two is an error, never a silently wrong picture.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost_models.comm import p2p_time
from meshplan.cost_models.estimate import DEFAULT_MESH_ORDER, Estimate, group_spans
from meshplan.cost_models.layout import Layout, layout_of
from meshplan.cost_models.pipeline import ScheduleResult, simulate
from meshplan.cost_models.timing import block_time, embedding_time, head_time
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import Plan

# time_s entries that are added to the pipeline makespan to make the step time.
OUTSIDE_PIPELINE = ("fsdp_comm", "dp_comm", "optimizer", "overhead")


@dataclass
class StageDurations:
    """Seconds per stage for one micro-batch: forward, backward-input, backward-weight; p2p send."""

    forward: list[float]
    backward: list[float]
    weight: list[float]
    p2p: float


class ScheduleMismatch(RuntimeError):
    """The schedule rebuilt here does not reproduce the estimate's pipeline numbers."""


def stage_durations(lay: Layout, prof: ClusterProfile, order: tuple[str, ...] = DEFAULT_MESH_ORDER) -> StageDurations:
    """Per-stage durations exactly as `estimate_layout` feeds them to `simulate`."""
    spans = group_spans(lay, prof, order)
    bt = block_time(lay, prof, spans)
    head = head_time(lay, prof)
    emb = embedding_time(lay, prof)
    passes = 2 if lay.ac == "full" else 1
    tp_pass = bt.tp_comm / (passes + 1)
    cp_pass = bt.cp_comm / (passes + 1)
    last = lay.n_stages - 1
    f, b, w = [], [], []
    for s, layers in enumerate(lay.stage_layers):
        f.append(layers * (bt.forward + tp_pass + cp_pass) + (emb if s == 0 else 0.0)
                 + (head.forward if s == last else 0.0))
        b.append(layers * (bt.backward_input + bt.recompute + passes * (tp_pass + cp_pass))
                 + (head.backward if s == last else 0.0))
        w.append(layers * bt.backward_weight)
    p2p = 0.0
    if lay.pp > 1:
        payload = lay.tokens_per_micro * lay.spec.dim * lay.act_bytes / (lay.tp if lay.sp else 1)
        p2p = p2p_time(prof, payload, crosses_node=spans["pp"].nodes > 1)
    return StageDurations(f, b, w, p2p)


def pipeline_schedule(plan: Plan, prof: ClusterProfile) -> ScheduleResult | None:
    """The simulated schedule of a complete plan with pipeline parallelism (None without PP)."""
    lay = layout_of(plan)
    if lay.pp == 1:
        return None
    d = stage_durations(lay, prof)
    return simulate(lay.schedule, lay.pp, lay.v, lay.n_micro, d.forward, d.backward, d.weight, d.p2p)


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
