"""The pipeline schedule model: every schedule of the plan contract as data, simulated.

A schedule is a stage->rank mapping, a forward order per rank, an in-flight limit per rank and
whether backward is split into input-gradient (B) and weight-gradient (W) work. `simulate` runs
it as a list scheduler over given per-stage durations and returns every block (rank, stage,
micro-batch, kind, start, end), the makespan, bubble and activations in flight. The same events
drive the step time in the estimate, the runtime's expectations and the Gantt chart in reports.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from meshplan.specs.rules import SPLIT_BACKWARD_SCHEDULES as SPLIT_BACKWARD

V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
FORWARD_FIRST = ("GPipe", "LoopedBFS")
_FORWARD_FIRST_RANK = {"F": 0, "B": 1, "W": 2}  # preference among ready work (lower first)
_BACKWARD_FIRST_RANK = {"B": 0, "F": 1, "W": 2}


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


def stage_rank(stage: int, pp: int, schedule: str) -> int:
    """Loop placement (stage s on rank s % pp), or V-shape (rank r holds stages r and 2pp-1-r)."""
    if schedule in V_SHAPED:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def in_flight_limit(schedule: str, pp: int, v: int, rank: int, n_micro: int) -> int:
    """How many (stage, micro-batch) activations a rank may hold before it must run a backward."""
    total = n_micro * v
    if schedule in FORWARD_FIRST:
        return total
    if schedule == "1F1B":
        return min(pp - rank, total)
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        # Megatron's warm-up count plus the one forward of the steady 1F1B phase.
        return min((pp - rank - 1) * 2 + (v - 1) * pp + 1, total)
    if schedule == "ZBVZeroBubble":
        return min(2 * pp, total)
    if schedule == "DualPipeV":
        return min(2 * pp + 1, total)
    raise ValueError(schedule)


def forward_order(schedule: str, pp: int, v: int, rank: int, n_micro: int) -> list[tuple[int, int]] | None:
    """Fixed (stage, micro-batch) forward order of a rank, or None where the schedule picks greedily."""
    stages = [c * pp + rank for c in range(v)]
    if schedule in ("GPipe", "1F1B"):
        return [(rank, mb) for mb in range(n_micro)]
    if schedule == "LoopedBFS":
        return [(s, mb) for s in stages for mb in range(n_micro)]
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        order = []
        for k in range(n_micro * v):
            group, within = divmod(k, pp * v)
            chunk, offset = divmod(within, pp)
            mb = group * pp + offset
            if mb < n_micro:
                order.append((stages[chunk], mb))
        seen = set(order)
        order += [(s, mb) for mb in range(n_micro) for s in stages if (s, mb) not in seen]
        return order
    return None


def backward_order(schedule: str, pp: int, v: int, rank: int, n_micro: int) -> list[tuple[int, int]] | None:
    """Fixed (stage, micro-batch) backward order of a rank, or None where the schedule picks greedily."""
    stages = [c * pp + rank for c in range(v)]
    if schedule in ("GPipe", "1F1B"):
        return [(rank, mb) for mb in range(n_micro)]
    if schedule == "LoopedBFS":
        return [(s, mb) for s in reversed(stages) for mb in range(n_micro)]
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        fwd = forward_order(schedule, pp, v, rank, n_micro)
        # Mirror of the forward order: the last chunk's micro-batches come back first.
        return [(stages[v - 1 - stages.index(s)], mb) for s, mb in fwd]
    return None


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
    n_stages = pp * v
    split = schedule in SPLIT_BACKWARD
    forward_first = schedule in FORWARD_FIRST
    w = list(w) if w is not None else [0.0] * n_stages
    b_eff = list(b) if split else [bi + wi for bi, wi in zip(b, w)]
    rank_of = [stage_rank(s, pp, schedule) for s in range(n_stages)]
    # Send time into stage s from s - 1 (forward) and from s + 1 (backward): p2p only across ranks.
    p2p_fwd = [0.0] + [p2p if rank_of[s - 1] != rank_of[s] else 0.0 for s in range(1, n_stages)]
    p2p_bwd = [p2p if rank_of[s + 1] != rank_of[s] else 0.0 for s in range(n_stages - 1)] + [0.0]
    last_stage = n_stages - 1
    # When each (stage, micro-batch) finished its forward / backward, at index stage * n_micro + mb.
    f_done: list[float | None] = [None] * (n_stages * n_micro)
    b_done: list[float | None] = [None] * (n_stages * n_micro)
    result = ScheduleResult(schedule, pp, v, n_micro, busy=[0.0] * pp, peak_in_flight=[0.0] * pp,
                            peak_kept=[0.0] * pp)
    kept_by = [0.0] * pp  # kept outputs so far, per rank
    free = [0.0] * pp
    last_kind = ["B"] * pp
    held = [0.0] * pp
    n_held = [0] * pp
    orders = [forward_order(schedule, pp, v, r, n_micro) for r in range(pp)]
    b_orders = [backward_order(schedule, pp, v, r, n_micro) for r in range(pp)]
    next_f = [0] * pp
    next_b = [0] * pp
    local_stages = [[s for s in range(n_stages) if rank_of[s] == r] for r in range(pp)]
    pending_f = [n_micro * len(local_stages[r]) for r in range(pp)]  # forwards left
    pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(pp)]
    remaining = n_stages * n_micro * (3 if split else 2)
    limits = [in_flight_limit(schedule, pp, v, r, n_micro) for r in range(pp)]
    next_f_mb = [0] * n_stages  # greedy (V-shaped) schedules run each stage's micro-batches in order
    next_b_mb = [0] * n_stages

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

    def v_window_ok(r: int, s: int) -> bool:
        """ZB-V warm-up: a rank's first chunk runs at most 2(pp - r) - 1 micro-batches ahead of its second."""
        first, second = local_stages[r]
        return s != first or next_f_mb[first] < next_f_mb[second] + 2 * (pp - r) - 1

    def candidates(r: int) -> list[tuple[float, int, int, int, str]]:
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

    def pick(r: int) -> tuple[float, tuple] | None:
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

    # A rank's next choice changes only when it or a neighbouring stage's rank acts: cache the rest.
    picks: list = [pick(r) for r in range(pp)]
    inf = float("inf")
    times = [got[0] if got is not None else inf for got in picks]  # when each rank's pick can start
    busy, peak, peak_kept, blocks = result.busy, result.peak_in_flight, result.peak_kept, result.blocks
    makespan = 0.0
    while remaining:
        # The earliest pick, the lowest rank on a tie (min and index run in C: this loop is the hot path).
        first = min(times)
        if first == inf:
            raise RuntimeError(f"{schedule}: deadlock with pp={pp} v={v} m={n_micro}")
        r = times.index(first)
        start, cand = picks[r]
        kind = cand[4]
        other = -1  # the rank whose options this event changes besides r's own
        if kind == "F":
            s, mb = -cand[2], cand[3]
            if orders[r] is not None:
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
                result.exceeded = True
                break
            if s < last_stage:
                other = rank_of[s + 1]  # a forward readies the next stage's forward
        elif kind == "B":
            s, mb = -cand[3], cand[2]
            if b_orders[r] is not None:
                next_b[r] += 1
            next_b_mb[s] += 1
            end = start + b_eff[s]
            b_done[s * n_micro + mb] = end
            n_held[r] -= 1
            if split:
                held[r] -= 1.0 - w_memory_share
                pending_w[r].append((s, mb))
            else:
                held[r] -= 1.0
            if s > 0:
                other = rank_of[s - 1]  # a backward readies the previous stage's backward
        else:
            s, mb = cand[3], cand[2]
            pending_w[r].popleft()
            end = start + w[s]
            held[r] -= w_memory_share
        if held[r] + kept_by[r] > peak[r] + peak_kept[r]:
            peak[r], peak_kept[r] = held[r], kept_by[r]
        if keep_blocks:
            blocks.append(Block(r, s, mb, kind, start, end))
        if end > makespan:
            makespan = end
        busy[r] += end - start
        free[r] = end
        if kind != "W":
            last_kind[r] = kind
        remaining -= 1
        got = picks[r] = pick(r)
        times[r] = got[0] if got is not None else inf
        if other >= 0 and other != r:
            got = picks[other] = pick(other)
            times[other] = got[0] if got is not None else inf
    result.makespan = makespan
    return result


@dataclass(frozen=True)
class Placement:
    """Where the stages of one (pp, v, placement kind) live, as arrays for the bound and the work sums."""

    ranks: np.ndarray  # rank of each stage
    first: np.ndarray  # first (lowest) stage of each rank
    hops: np.ndarray  # rank-to-rank sends micro-batch 0 makes before reaching each rank's first stage
    rank_list: tuple[int, ...]  # ranks again, as Python ints


@lru_cache(maxsize=4096)
def placement(pp: int, v: int, v_shaped: bool) -> Placement:
    ranks = np.array([stage_rank(s, pp, "ZBVZeroBubble" if v_shaped else "1F1B") for s in range(pp * v)])
    first = np.array([int(np.flatnonzero(ranks == r)[0]) for r in range(pp)])
    crossings = np.concatenate(([0], np.cumsum(ranks[1:] != ranks[:-1])))
    return Placement(ranks, first, crossings[first], tuple(int(r) for r in ranks))


def rank_work(schedule: str, pp: int, v: int, n_micro: int, f, b, w) -> tuple[float, ...]:
    """Each rank's work over the step: n_micro times the F + B + W of the stages it holds."""
    pl = placement(pp, v, schedule in V_SHAPED)
    if pp * v > 64:
        return tuple((n_micro * np.bincount(pl.ranks, weights=np.add(np.add(f, b), w), minlength=pp)).tolist())
    work = [0.0] * pp  # a plain loop beats numpy's call overhead on a few stages
    for s, r in enumerate(pl.rank_list):
        work[r] += f[s] + b[s] + w[s]
    return tuple(n_micro * x for x in work)


@lru_cache(maxsize=65536)
def linear_bound_rows(pp: int, v: int, v_shaped: bool, split_backward: bool,
                      stage_layers: tuple[int, ...]) -> np.ndarray:
    """makespan_lower_bound, for durations linear in each stage's layers, as one row per rank.

    With one layer's forward a_f and backward + weight a_bw per micro-batch, the embedding's forward
    e on the first stage and the head's forward + backward h on the last, the bound is
    max(rows @ (a_f, a_bw, m * (a_f + a_bw), m * e, m * h, e, p2p)): the planner bounds thousands of
    (split, schedule) leaves with one small product each instead of building their durations.
    """
    pl = placement(pp, v, v_shaped)
    n = np.asarray(stage_layers, dtype=float)
    layers_before_first = (np.cumsum(n) - n)[pl.first]
    rows = np.zeros((pp, 7))
    rows[:, 0] = layers_before_first  # lead: forward of the stages before the rank's first
    if not split_backward:
        rows[:, 1] = layers_before_first  # tail: their backward, after the rank's last
    rows[:, 2] = np.bincount(pl.ranks, weights=n, minlength=pp)  # the rank's own layers
    rows[pl.ranks[0], 3] = 1.0  # the embedding's stage
    rows[pl.ranks[-1], 4] = 1.0  # the head's stage
    rows[:, 5] = pl.first > 0  # the embedding's forward leads every rank but the first
    rows[:, 6] = pl.hops * (1 if split_backward else 2)
    return rows


def bound_kind(schedule: str) -> tuple[bool, bool]:
    """What makespan_lower_bound depends on: (V-shaped placement, split backward)."""
    return schedule in V_SHAPED, schedule in SPLIT_BACKWARD


def makespan_lower_bound(schedule: str, pp: int, v: int, n_micro: int, f: list[float], b: list[float],
                         w: list[float], p2p: float = 0.0) -> float:
    """A makespan no execution of the schedule can beat, without simulating it.

    Rank r cannot start before micro-batch 0's forward reaches its first stage, must then do all of
    its own work, and (when backward is not split) finishes with the backward of its first stage,
    after which the stages before it still have that micro-batch's backward to run. For 1F1B and
    GPipe this is (m + p - 1)(F + B) and for interleaving (m + (p - 1)/v)(F + B) with equal stages:
    the closed forms, which the simulation reaches.
    """
    pl = placement(pp, v, schedule in V_SHAPED)
    f = np.asarray(f, dtype=float)
    bw = np.add(b, w)
    busy = n_micro * np.bincount(pl.ranks, weights=f + bw, minlength=pp)
    # Work of the stages before each rank's first stage (exclusive prefix sums).
    lead = np.cumsum(f)[pl.first] - f[pl.first] + pl.hops * p2p
    if schedule not in SPLIT_BACKWARD:
        lead = lead + np.cumsum(bw)[pl.first] - bw[pl.first] + pl.hops * p2p
    return float((lead + busy).max())
