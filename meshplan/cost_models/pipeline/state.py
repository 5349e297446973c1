"""What each pipeline rank may run next, and what running a block does to it: the simulation's state.

One `State` holds the inputs (per-stage durations, sends, limits) and everything done so far; the
functions here build closures over it that simulation.py's event loop calls: when a forward or
backward can start, each rank's ready candidates, the one it picks (steady 1F1B alternation,
weight gradients filling idle time), and the bookkeeping of a forward, backward or weight block.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from meshplan.cost_models.pipeline.schedule import Schedule

_FORWARD_FIRST_RANK = {"F": 0, "B": 1, "W": 2}  # preference among ready work (lower first)
_BACKWARD_FIRST_RANK = {"B": 0, "F": 1, "W": 2}

# The pieces below share one State and are closures over its lists, not methods: the event loop
# is the planner's hot path, and a closure's variables are faster to reach than attributes.
Candidate = tuple  # (ready time, priority, key, key, kind F | B | W)


class State:
    """The simulation's inputs and what it has done so far, per rank and per (stage, micro-batch).
    (A plain class: a 21-field dataclass costs milliseconds at every `meshplan` start.)"""

    def __init__(self, sched: Schedule, f: list[float], b: list[float], w: list[float] | None, p2p: float,
                 kept: list[float] | None, held_limit: list[float] | None, w_memory_share: float):
        pp, n, rank_of = sched.pp, sched.n_stages, sched.rank_of
        self.f = f
        self.w = list(w) if w is not None else [0.0] * n
        # Backward as run: input gradient, plus weight gradient unless split.
        self.b_eff = list(b) if sched.split_backward else [bi + wi for bi, wi in zip(b, self.w)]
        # Send time into stage s from s - 1 (forward) and from s + 1 (backward): p2p only across ranks.
        self.p2p_fwd = [0.0] + [p2p if rank_of[s - 1] != rank_of[s] else 0.0 for s in range(1, n)]
        self.p2p_bwd = [p2p if rank_of[s + 1] != rank_of[s] else 0.0 for s in range(n - 1)] + [0.0]
        self.kept, self.held_limit, self.w_memory_share = kept, held_limit, w_memory_share
        # When each (stage, micro-batch) finished its forward / backward, at index stage * n_micro + mb.
        self.f_done: list[float | None] = [None] * (n * sched.n_micro)
        self.b_done: list[float | None] = [None] * (n * sched.n_micro)
        # Per rank: when it is free, its last kind, activation units held, activation sets held (against
        # the in-flight limit), kept outputs so far, positions in fixed orders, forwards left, weight
        # gradients waiting (oldest first).
        self.free, self.last_kind, self.held, self.n_held = [0.0] * pp, ["B"] * pp, [0.0] * pp, [0] * pp
        self.kept_by, self.next_f, self.next_b = [0.0] * pp, [0] * pp, [0] * pp
        self.pending_f = [sched.n_micro * len(ra.stages) for ra in sched.ranks]
        self.pending_w: list[deque[tuple[int, int]]] = [deque() for _ in range(pp)]
        # Per stage: greedy (V-shaped) schedules run each stage's micro-batches in order.
        self.next_f_mb, self.next_b_mb = [0] * n, [0] * n
        # Memory phases (ScheduleResult.phases): per stage, whether its weight gradients have begun (the
        # first B, or the first W where split); per rank, its phase, 2 x (its stages that have begun) + 1
        # once the last stage has finished every backward (its loss buffers are gone); per stage, the
        # backward passes left.
        self.grads_begun, self.phase = [False] * n, [0] * pp
        self.backwards_left = [sched.n_micro] * n
        # Per rank: the last stage's micro-batches between their forward (which computed the loss) and
        # the backward that frees its graph (the weight pass where backward is split).
        self.losses = [0] * pp


def ready_times(sched: Schedule, st: State) -> tuple[Callable, Callable]:
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


def candidates_of(sched: Schedule, st: State, f_ready: Callable, b_ready: Callable) -> list[Callable]:
    """Per rank, candidates(r): rank r's next forward(s), backward(s) and oldest weight gradient, with
    their ready times; ranks with fixed orders and greedy (V-shaped) ranks each get their own."""
    fixed = _fixed_order_candidates(sched, st, f_ready, b_ready)
    greedy = _greedy_candidates(sched, st, f_ready, b_ready)
    return [fixed if ra.forwards is not None else greedy for ra in sched.ranks]


def _fixed_order_candidates(sched: Schedule, st: State, f_ready: Callable, b_ready: Callable) -> Callable:
    """The next forward and backward in the rank's fixed orders."""
    pp, n_micro = sched.pp, sched.n_micro
    orders, b_orders, limits = ([getattr(ra, k) for ra in sched.ranks] for k in ("forwards", "backwards", "limit"))
    n_held, pending_f, pending_w = st.n_held, st.pending_f, st.pending_w
    next_f, next_b = st.next_f, st.next_b

    def candidates(r: int) -> list[Candidate]:
        out = []
        if n_held[r] < limits[r] and pending_f[r]:
            s, mb = orders[r][next_f[r]]
            t = f_ready(s, mb)
            if t is not None:
                out.append((t, 1, -s, mb, "F"))
        b_order = b_orders[r]
        if next_b[r] < len(b_order):
            s, mb = b_order[next_b[r]]
            t = b_ready(s, mb)
            if t is not None:
                out.append((t, 0, mb, -s, "B"))
        if pending_w[r]:
            out.append(_oldest_weight(st, r, pp, n_micro, limits[r]))
        return out

    return candidates


def _greedy_candidates(sched: Schedule, st: State, f_ready: Callable, b_ready: Callable) -> Callable:
    """Each of the rank's stages offers its next micro-batch, forwards within the ZB-V warm-up window."""
    pp, n_micro = sched.pp, sched.n_micro
    local_stages, limits = [ra.stages for ra in sched.ranks], [ra.limit for ra in sched.ranks]
    n_held, pending_f, pending_w, next_f_mb, next_b_mb = (st.n_held, st.pending_f, st.pending_w, st.next_f_mb,
                                                          st.next_b_mb)

    def v_window_ok(r: int, s: int) -> bool:
        """ZB-V warm-up: a rank's first chunk runs at most 2(pp - r) - 1 micro-batches ahead of its second."""
        first, second = local_stages[r]
        return s != first or next_f_mb[first] < next_f_mb[second] + 2 * (pp - r) - 1

    def candidates(r: int) -> list[Candidate]:
        out = []
        if n_held[r] < limits[r] and pending_f[r]:
            for s in local_stages[r]:
                mb = next_f_mb[s]
                if mb < n_micro and v_window_ok(r, s):
                    t = f_ready(s, mb)
                    if t is not None:
                        out.append((t, 1, -s, mb, "F"))
        for s in local_stages[r]:
            mb = next_b_mb[s]
            if mb < n_micro:
                t = b_ready(s, mb)
                if t is not None:
                    out.append((t, 0, mb, -s, "B"))
        if pending_w[r]:
            out.append(_oldest_weight(st, r, pp, n_micro, limits[r]))
        return out

    return candidates


def _oldest_weight(st: State, r: int, pp: int, n_micro: int, limit: int) -> Candidate:
    """Rank r's oldest waiting weight gradient. It fills idle time, but outranks everything once more
    than `pp` wait or once the rank holds its limit of activation sets: under a split backward a set
    is freed only by its weight pass, and PyTorch's zero-bubble orders free one before the next forward."""
    s, mb = st.pending_w[r][0]
    urgent = len(st.pending_w[r]) > pp or st.n_held[r] >= limit
    return st.b_done[s * n_micro + mb], -1 if urgent else 2, mb, s, "W"


def picker(sched: Schedule, st: State, candidates: list[Callable]) -> Callable:
    """pick(r): (start, candidate) of rank r's next block, or None if it has nothing it can run yet."""
    forward_first, free, last_kind = sched.forward_first, st.free, st.last_kind

    def pick(r: int) -> tuple[float, Candidate] | None:
        cands = candidates[r](r)
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


def actions(sched: Schedule, st: State) -> dict[str, Callable]:
    """Per kind, run(r, start, candidate) -> (stage, micro-batch, end, the other rank it readies or -1),
    or None when a forward leaves rank r holding more than held_limit allows."""
    return {"F": _forward_action(sched, st), "B": _backward_action(sched, st), "W": _weight_action(sched, st)}


def _forward_action(sched: Schedule, st: State) -> Callable:
    n_micro, last_stage, rank_of = sched.n_micro, sched.n_stages - 1, sched.rank_of
    fixed = [ra.forwards is not None for ra in sched.ranks]
    f, kept, held_limit, f_done = st.f, st.kept, st.held_limit, st.f_done
    held, n_held, kept_by, losses = st.held, st.n_held, st.kept_by, st.losses
    next_f, pending_f, next_f_mb = st.next_f, st.pending_f, st.next_f_mb

    def forward(r: int, start: float, cand: Candidate) -> tuple | None:
        s, mb = -cand[2], cand[3]
        if fixed[r]:
            next_f[r] += 1
        pending_f[r] -= 1
        next_f_mb[s] += 1
        end = start + f[s]
        f_done[s * n_micro + mb] = end
        held[r] += 1.0
        n_held[r] += 1
        if s == last_stage:
            losses[r] += 1
        if kept is not None:
            kept_by[r] += kept[s]
        if held_limit is not None and held[r] + kept_by[r] > held_limit[r]:
            return None
        return s, mb, end, rank_of[s + 1] if s < last_stage else -1  # readies the next stage's forward

    return forward


def _backward_action(sched: Schedule, st: State) -> Callable:
    n_micro, rank_of = sched.n_micro, sched.rank_of
    fixed = [ra.backwards is not None for ra in sched.ranks]
    b_eff, b_done = st.b_eff, st.b_done
    next_b, next_b_mb = st.next_b, st.next_b_mb
    release = backward_release(sched, st)

    def backward(r: int, start: float, cand: Candidate) -> tuple:
        s, mb = -cand[3], cand[2]
        if fixed[r]:
            next_b[r] += 1
        next_b_mb[s] += 1
        end = start + b_eff[s]
        b_done[s * n_micro + mb] = end
        release(r, s, mb)
        return s, mb, end, rank_of[s - 1] if s > 0 else -1  # readies the previous stage's backward

    return backward


def backward_release(sched: Schedule, st: State) -> Callable:
    """release(r, s, mb): what rank r's backward of (stage s, micro-batch mb) frees. Split, all but the
    weight pass's share of the activation set, the weight gradient then waiting; else the whole set, its
    gradients counted."""
    split, share, held, n_held, pending_w = sched.split_backward, st.w_memory_share, st.held, st.n_held, st.pending_w
    grads_done = _gradient_bookkeeping(sched, st)

    def release(r: int, s: int, mb: int) -> None:
        if split:
            held[r] -= 1.0 - share  # the rest stays until the weight gradient
            pending_w[r].append((s, mb))
        else:
            n_held[r] -= 1
            held[r] -= 1.0
            grads_done(r, s)

    return release


def _weight_action(sched: Schedule, st: State) -> Callable:
    w = st.w
    release = weight_release(sched, st)

    def weight(r: int, start: float, cand: Candidate) -> tuple:
        s, mb = cand[3], cand[2]
        release(r, s)
        return s, mb, start + w[s], -1

    return weight


def weight_release(sched: Schedule, st: State) -> Callable:
    """release(r, s): what rank r's weight gradient of its oldest waiting (stage s, micro-batch) frees:
    the rest of the activation set (the input-gradient pass kept the graph), its gradients counted."""
    share, held, n_held, pending_w = st.w_memory_share, st.held, st.n_held, st.pending_w
    grads_done = _gradient_bookkeeping(sched, st)

    def release(r: int, s: int) -> None:
        pending_w[r].popleft()
        n_held[r] -= 1
        held[r] -= share
        grads_done(r, s)

    return release


def _gradient_bookkeeping(sched: Schedule, st: State) -> Callable:
    """grads_done(r, s): stage s on rank r has computed one micro-batch's weight gradients (its B, or
    its W where split): move the rank's memory phase on, and free the last stage's loss graph."""
    last_stage, grads_begun, phase, left, losses = (sched.n_stages - 1, st.grads_begun, st.phase, st.backwards_left,
                                                    st.losses)

    def grads_done(r: int, s: int) -> None:
        if not grads_begun[s]:
            grads_begun[s] = True
            phase[r] += 2
        left[s] -= 1
        if s == last_stage:
            losses[r] -= 1
            if not left[s]:
                phase[r] += 1

    return grads_done
