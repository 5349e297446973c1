"""The timing of a pipeline schedule: its actions (schedule.py) run as a list scheduler over given
per-stage durations (fixed_order.py runs the same loop faster where every rank's forward and
backward orders are fixed, weight gradients split off or not).

`simulate` returns every block (rank, stage, micro-batch, kind, start, end), the makespan, bubble and
activations in flight. The same events drive the step time in the estimate, the runtime's
expectations and the Gantt chart in reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from meshplan.cost_models.pipeline.fixed_order import is_fixed_order, run_fixed_order
from meshplan.cost_models.pipeline.schedule import Schedule, build_schedule
from meshplan.cost_models.pipeline.state import State, actions, candidates_of, picker, ready_times

_INF = float("inf")


class Block(NamedTuple):
    """One unit of work in the simulated schedule (a named tuple: simulations make thousands)."""

    rank: int
    stage: int
    microbatch: int
    kind: str  # F | B | W  (B includes W for schedules that do not split backward)
    start: float
    end: float


@dataclass
class ScheduleResult:
    schedule: str
    pp: int
    virtual_stages: int
    n_microbatches: int
    blocks: list[Block] = field(default_factory=list)
    makespan: float = 0.0
    busy: list[float] = field(default_factory=list)
    peak_in_flight: list[float] = field(default_factory=list)  # activation units (one stage, one mb)
    # Per rank and memory phase: (activations, kept outputs) at the peak of their sum in that phase,
    # and the most of the last stage's micro-batches whose loss graph was alive in it (an upper bound
    # when that happened at another moment); None for a phase the rank never entered. Phase 2j + d: j
    # of the rank's stages have begun their weight gradients (whose accumulators then exist until the
    # step ends), and d = 1 once the last stage has run its last backward (no loss buffers after). A
    # rank's memory peak is the largest over its phases (memory.peak_rank_memory).
    phases: list[list[tuple[float, float, float] | None]] = field(default_factory=list)
    exceeded: bool = False  # stopped early: a rank's load passed simulate's held_limit

    @property
    def bubble_time(self) -> float:
        """Idle time on the busiest rank: what the pipeline adds over its own work."""
        return self.makespan - max(self.busy)

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_time / self.makespan if self.makespan else 0.0


def simulate(schedule: str, pp: int, v: int, n_micro: int, f: list[float], b: list[float],
             w: list[float] | None = None, p2p: float = 0.0, w_memory_share: float = 1.0,
             keep_blocks: bool = True, kept: list[float] | None = None,
             held_limit: list[float] | None = None) -> ScheduleResult:
    """Simulate one optimizer step of the pipeline.

    f, b, w: per-stage durations of forward, backward-input and backward-weight (w is folded into b
    for schedules that do not split). p2p: activation send time between stages on different ranks.
    w_memory_share: share of a stage's activations still held after B until its W runs. PyTorch's
    stages compute input gradients with retain_graph=True, so the whole set stays until W, with the
    gradients the weight pass starts from on top (memory.weight_pass_share: above 1.0).
    keep_blocks=False leaves `blocks` empty (makespan, busy and in-flight are still exact).
    kept: per stage, activation units each forward leaves held until the step ends (a schedule that
    returns every micro-batch's output); the peak is then that of activations plus these.
    held_limit: per rank, the most units it may hold; the simulation stops at the first forward that
    passes it, with `exceeded` set and the rest of the result partial (a plan that cannot fit needs
    no step time).
    """
    sched = build_schedule(schedule, pp, v, n_micro)
    st = State(sched, f, b, w, p2p, kept, held_limit, w_memory_share)
    result = ScheduleResult(schedule, pp, v, n_micro, busy=[0.0] * pp, peak_in_flight=[0.0] * pp,
                            phases=[[None] * (2 * len(ra.stages) + 2) for ra in sched.ranks])
    if is_fixed_order(sched):
        run_fixed_order(sched, st, result, keep_blocks, Block)
        return result
    pick = picker(sched, st, candidates_of(sched, st, *ready_times(sched, st)))
    return _run(sched, pick, actions(sched, st), _recorder(st, result, keep_blocks), result)


@lru_cache(maxsize=8192)
def simulate_cached(schedule: str, pp: int, v: int, m: int, f: tuple, b: tuple, w: tuple, p2p: float,
                    held_limit: tuple | None = None, w_memory_share: float = 1.0) -> tuple[float, tuple, bool, tuple]:
    """(makespan, busy, whether a rank passed held_limit and the simulation stopped, the memory phases
    of ScheduleResult.phases)."""
    res = simulate(schedule, pp, v, m, list(f), list(b), list(w), p2p, w_memory_share, keep_blocks=False,
                   held_limit=list(held_limit) if held_limit else None)
    return res.makespan, tuple(res.busy), res.exceeded, tuple(map(tuple, res.phases))


def _recorder(st: State, result: ScheduleResult, keep_blocks: bool) -> Callable:
    """record(r, s, mb, kind, start, end): book a finished block on its rank and in the result."""
    held, kept_by, free, last_kind, phase, losses = st.held, st.kept_by, st.free, st.last_kind, st.phase, st.losses
    busy, peak, blocks, phases = result.busy, result.peak_in_flight, result.blocks, result.phases

    def record(r: int, s: int, mb: int, kind: str, start: float, end: float) -> None:
        load = held[r] + kept_by[r]
        if held[r] > peak[r]:
            peak[r] = held[r]
        ph, j = phases[r], phase[r]
        got = ph[j]
        if got is None or load > got[0] + got[1]:
            ph[j] = (held[r], kept_by[r], float(max(losses[r], got[2] if got else 0)))
        elif losses[r] > got[2]:
            ph[j] = (got[0], got[1], float(losses[r]))
        if keep_blocks:
            blocks.append(Block(r, s, mb, kind, start, end))
        busy[r] += end - start
        free[r] = end
        if kind != "W":
            last_kind[r] = kind

    return record


def _run(sched: Schedule, pick: Callable, actions: dict[str, Callable], record: Callable,
         result: ScheduleResult) -> ScheduleResult:
    """The event loop: always the earliest pick, the lowest rank on a tie, until every block has run."""
    remaining = sched.n_stages * sched.n_micro * (3 if sched.split_backward else 2)
    # A rank's next choice changes only when it or a neighbouring stage's rank acts: cache the rest.
    picks: list = [pick(r) for r in range(sched.pp)]
    times = [got[0] if got is not None else _INF for got in picks]  # when each rank's pick can start
    makespan = 0.0
    while remaining:
        first = min(times)  # min and index run in C: this loop is the hot path
        if first == _INF:
            raise RuntimeError(f"{sched.name}: deadlock with pp={sched.pp} v={sched.v} m={sched.n_micro}")
        r = times.index(first)
        start, cand = picks[r]
        kind = cand[4]
        done = actions[kind](r, start, cand)
        if done is None:
            result.exceeded = True
            break
        s, mb, end, other = done
        record(r, s, mb, kind, start, end)
        if end > makespan:
            makespan = end
        remaining -= 1
        got = picks[r] = pick(r)
        times[r] = got[0] if got is not None else _INF
        if other >= 0 and other != r:
            got = picks[other] = pick(other)
            times[other] = got[0] if got is not None else _INF
    result.makespan = makespan
    return result
