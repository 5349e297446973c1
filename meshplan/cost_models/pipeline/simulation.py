"""The timing of a pipeline schedule: its actions (schedule.py) run as a list scheduler over given
per-stage durations.

`simulate` returns every block (rank, stage, micro-batch, kind, start, end), the makespan, bubble and
activations in flight. The same events drive the step time in the estimate, the runtime's
expectations and the Gantt chart in reports.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from meshplan.cost_models.pipeline.schedule import Schedule, build_schedule

_FORWARD_FIRST_RANK = {"F": 0, "B": 1, "W": 2}  # preference among ready work (lower first)
_BACKWARD_FIRST_RANK = {"B": 0, "F": 1, "W": 2}
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
    # Outputs kept until the step ends (see simulate's `kept`), in the same units, at the moment
    # activations plus kept outputs peak; peak_in_flight is then the activations at that moment.
    peak_kept: list[float] = field(default_factory=list)
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
    stages compute input gradients with retain_graph=True, so the whole set stays until W (1.0).
    keep_blocks=False leaves `blocks` empty (makespan, busy and in-flight are still exact).
    kept: per stage, activation units each forward leaves held until the step ends (a schedule that
    returns every micro-batch's output); the peak is then that of activations plus these.
    held_limit: per rank, the most units it may hold; the simulation stops at the first forward that
    passes it, with `exceeded` set and the rest of the result partial (a plan that cannot fit needs
    no step time).
    """
    sched = build_schedule(schedule, pp, v, n_micro)
    st = _State.start(sched, f, b, w, p2p, kept, held_limit, w_memory_share)
    result = ScheduleResult(schedule, pp, v, n_micro, busy=[0.0] * pp, peak_in_flight=[0.0] * pp,
                            peak_kept=[0.0] * pp)
    pick = _picker(sched, st, _candidates(sched, st, *_ready_times(sched, st)))
    return _run(sched, pick, _actions(sched, st), _recorder(st, result, keep_blocks), result)


@lru_cache(maxsize=8192)
def simulate_cached(schedule: str, pp: int, v: int, m: int, f: tuple, b: tuple, w: tuple, p2p: float,
                    held_limit: tuple | None = None) -> tuple[float, tuple, tuple, bool]:
    """(makespan, busy, in flight, whether a rank passed held_limit and the simulation stopped)."""
    res = simulate(schedule, pp, v, m, list(f), list(b), list(w), p2p, keep_blocks=False,
                   held_limit=list(held_limit) if held_limit else None)
    return res.makespan, tuple(res.busy), tuple(res.peak_in_flight), res.exceeded


# The pieces below share one _State and are closures over its lists, not methods: the event loop
# is the planner's hot path, and a closure's variables are faster to reach than attributes.
Candidate = tuple  # (ready time, priority, key, key, kind F | B | W)


@dataclass
class _State:
    """The simulation's inputs and what it has done so far, per rank and per (stage, micro-batch)."""

    f: list[float]
    b_eff: list[float]  # backward as run: input gradient, plus weight gradient unless split
    w: list[float]
    p2p_fwd: list[float]  # send time into stage s from s - 1; 0 on the same rank
    p2p_bwd: list[float]  # send time into stage s from s + 1; 0 on the same rank
    kept: list[float] | None
    held_limit: list[float] | None
    w_memory_share: float
    f_done: list[float | None]  # when each (stage, micro-batch) finished its forward, at stage * n_micro + mb
    b_done: list[float | None]  # ... and its backward
    free: list[float]  # per rank: when it is free
    last_kind: list[str]
    held: list[float]  # activation units held
    n_held: list[int]  # activation sets held, against the in-flight limit
    kept_by: list[float]  # kept outputs so far
    next_f: list[int]  # position in a fixed forward order
    next_b: list[int]
    pending_f: list[int]  # forwards left
    pending_w: list[deque[tuple[int, int]]]  # weight gradients waiting, oldest first
    next_f_mb: list[int]  # per stage: greedy (V-shaped) schedules run each stage's micro-batches in order
    next_b_mb: list[int]

    @staticmethod
    def start(sched: Schedule, f: list[float], b: list[float], w: list[float] | None, p2p: float,
              kept: list[float] | None, held_limit: list[float] | None, w_memory_share: float) -> _State:
        pp, n, rank_of = sched.pp, sched.n_stages, sched.rank_of
        w = list(w) if w is not None else [0.0] * n
        b_eff = list(b) if sched.split_backward else [bi + wi for bi, wi in zip(b, w)]
        p2p_fwd = [0.0] + [p2p if rank_of[s - 1] != rank_of[s] else 0.0 for s in range(1, n)]
        p2p_bwd = [p2p if rank_of[s + 1] != rank_of[s] else 0.0 for s in range(n - 1)] + [0.0]
        pairs = n * sched.n_micro
        return _State(f, b_eff, w, p2p_fwd, p2p_bwd, kept, held_limit, w_memory_share, [None] * pairs,
                      [None] * pairs, [0.0] * pp, ["B"] * pp, [0.0] * pp, [0] * pp, [0.0] * pp, [0] * pp, [0] * pp,
                      [sched.n_micro * len(ra.stages) for ra in sched.ranks], [deque() for _ in range(pp)],
                      [0] * n, [0] * n)


def _ready_times(sched: Schedule, st: _State) -> tuple[Callable, Callable]:
    """f_ready(s, mb), b_ready(s, mb): when that forward / backward can start, None if not yet known."""
    n_micro, last_stage = sched.n_micro, sched.n_stages - 1
    f_done, b_done, p2p_fwd, p2p_bwd = st.f_done, st.b_done, st.p2p_fwd, st.p2p_bwd

    def f_ready(s: int, mb: int) -> float | None:
        if s == 0:
            return 0.0
        t = f_done[(s - 1) * n_micro + mb]
        return None if t is None else t + p2p_fwd[s]

    def b_ready(s: int, mb: int) -> float | None:
        t_f = f_done[s * n_micro + mb]
        if t_f is None or s == last_stage:
            return t_f
        t = b_done[(s + 1) * n_micro + mb]
        if t is None:
            return None
        t += p2p_bwd[s]
        return t if t > t_f else t_f

    return f_ready, b_ready


def _candidates(sched: Schedule, st: _State, f_ready: Callable, b_ready: Callable) -> Callable:
    """candidates(r): rank r's next forward(s), backward(s) and oldest weight gradient, with ready times."""
    pp, n_micro = sched.pp, sched.n_micro
    orders, b_orders = [ra.forwards for ra in sched.ranks], [ra.backwards for ra in sched.ranks]
    local_stages, limits = [ra.stages for ra in sched.ranks], [ra.limit for ra in sched.ranks]
    n_held, pending_f, pending_w, b_done = st.n_held, st.pending_f, st.pending_w, st.b_done
    next_f, next_b, next_f_mb, next_b_mb = st.next_f, st.next_b, st.next_f_mb, st.next_b_mb

    def v_window_ok(r: int, s: int) -> bool:
        """ZB-V warm-up: a rank's first chunk runs at most 2(pp - r) - 1 micro-batches ahead of its second."""
        first, second = local_stages[r]
        return s != first or next_f_mb[first] < next_f_mb[second] + 2 * (pp - r) - 1

    def candidates(r: int) -> list[Candidate]:
        out = []
        if n_held[r] < limits[r] and pending_f[r]:
            order = orders[r]
            if order is not None:
                s, mb = order[next_f[r]]
                t = f_ready(s, mb)
                if t is not None:
                    out.append((t, 1, -s, mb, "F"))
            else:
                for s in local_stages[r]:
                    mb = next_f_mb[s]
                    if mb < n_micro and v_window_ok(r, s):
                        t = f_ready(s, mb)
                        if t is not None:
                            out.append((t, 1, -s, mb, "F"))
        b_order = b_orders[r]
        if b_order is not None:
            if next_b[r] < len(b_order):
                s, mb = b_order[next_b[r]]
                t = b_ready(s, mb)
                if t is not None:
                    out.append((t, 0, mb, -s, "B"))
        else:
            for s in local_stages[r]:
                mb = next_b_mb[s]
                if mb < n_micro:
                    t = b_ready(s, mb)
                    if t is not None:
                        out.append((t, 0, mb, -s, "B"))
        if pending_w[r]:
            # Weight gradients run oldest first; past `pp` waiting they outrank forwards, which
            # bounds the activations they pin.
            s, mb = pending_w[r][0]
            out.append((b_done[s * n_micro + mb], 2 if len(pending_w[r]) <= pp else -1, mb, s, "W"))
        return out

    return candidates


def _picker(sched: Schedule, st: _State, candidates: Callable) -> Callable:
    """pick(r): (start, candidate) of rank r's next block, or None if it has nothing it can run yet."""
    forward_first, free, last_kind = sched.forward_first, st.free, st.last_kind

    def pick(r: int) -> tuple[float, Candidate] | None:
        cands = candidates(r)
        if not cands:
            return None
        if len(cands) == 1:
            c = cands[0]
            return (free[r], c) if c[0] <= free[r] + 1e-12 else (c[0], c)
        now = free[r] + 1e-12
        # Steady 1F1B: when a forward and a backward are both ready, take the other kind than last
        # time; weight-gradient work only fills what would otherwise be idle.
        rank_kind = _FORWARD_FIRST_RANK if forward_first or last_kind[r] == "B" else _BACKWARD_FIRST_RANK
        best, best_key = None, None
        for c in cands:
            if c[0] <= now:
                key = (-1 if c[1] < 0 else rank_kind[c[4]], c[2], c[3])
                if best_key is None or key < best_key:
                    best, best_key = c, key
        if best is not None:
            return free[r], best
        best = min(cands)  # earliest ready; candidates never tie on (time, priority, mb, stage)
        return best[0], best

    return pick


def _actions(sched: Schedule, st: _State) -> dict[str, Callable]:
    """Per kind, run(r, start, candidate) -> (stage, micro-batch, end, the other rank it readies or -1),
    or None when a forward leaves rank r holding more than held_limit allows."""
    n_micro, last_stage, split, rank_of = sched.n_micro, sched.n_stages - 1, sched.split_backward, sched.rank_of
    fixed_f, fixed_b = [ra.forwards is not None for ra in sched.ranks], [ra.backwards is not None for ra in sched.ranks]
    f, b_eff, w, kept, held_limit, share = st.f, st.b_eff, st.w, st.kept, st.held_limit, st.w_memory_share
    f_done, b_done, held, n_held, kept_by = st.f_done, st.b_done, st.held, st.n_held, st.kept_by
    pending_w = st.pending_w
    next_f, next_b, pending_f, next_f_mb, next_b_mb = st.next_f, st.next_b, st.pending_f, st.next_f_mb, st.next_b_mb

    def forward(r: int, start: float, cand: Candidate) -> tuple | None:
        s, mb = -cand[2], cand[3]
        if fixed_f[r]:
            next_f[r] += 1
        pending_f[r] -= 1
        next_f_mb[s] += 1
        end = start + f[s]
        f_done[s * n_micro + mb] = end
        held[r] += 1.0
        n_held[r] += 1
        if kept is not None:
            kept_by[r] += kept[s]
        if held_limit is not None and held[r] + kept_by[r] > held_limit[r]:
            return None
        return s, mb, end, rank_of[s + 1] if s < last_stage else -1  # readies the next stage's forward

    def backward(r: int, start: float, cand: Candidate) -> tuple:
        s, mb = -cand[3], cand[2]
        if fixed_b[r]:
            next_b[r] += 1
        next_b_mb[s] += 1
        end = start + b_eff[s]
        b_done[s * n_micro + mb] = end
        n_held[r] -= 1
        if split:
            held[r] -= 1.0 - share
            pending_w[r].append((s, mb))
        else:
            held[r] -= 1.0
        return s, mb, end, rank_of[s - 1] if s > 0 else -1  # readies the previous stage's backward

    def weight(r: int, start: float, cand: Candidate) -> tuple:
        s, mb = cand[3], cand[2]
        pending_w[r].popleft()
        held[r] -= share
        return s, mb, start + w[s], -1

    return {"F": forward, "B": backward, "W": weight}


def _recorder(st: _State, result: ScheduleResult, keep_blocks: bool) -> Callable:
    """record(r, s, mb, kind, start, end): book a finished block on its rank and in the result."""
    held, kept_by, free, last_kind = st.held, st.kept_by, st.free, st.last_kind
    busy, peak, peak_kept, blocks = result.busy, result.peak_in_flight, result.peak_kept, result.blocks

    def record(r: int, s: int, mb: int, kind: str, start: float, end: float) -> None:
        if held[r] + kept_by[r] > peak[r] + peak_kept[r]:
            peak[r], peak_kept[r] = held[r], kept_by[r]
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
