"""The event loop of simulation.py, specialised to schedules whose ranks run fixed forward and backward
orders (GPipe, 1F1B, LoopedBFS, Interleaved1F1B, and InterleavedZeroBubble with its weight gradients
split off): most of what the planner simulates, and every MoE plan.

It makes the same choices with the same arithmetic as the general loop (simulation._run over
state.py's candidates, picker and actions), so its results are equal to the last bit
(tests/foundation/test_fixed_order_simulation.py). What it saves is the general loop's generality:
a rank offers at most one forward, one backward and (split) its oldest weight gradient, so its pick
is a few readiness look-ups and comparisons instead of a list of candidate tuples built and sorted
through four closures; and a neighbour's pick is made again only when the block just run is the one
its next block waits on (otherwise nothing it reads has changed, and the general loop's new pick
would equal the old). A waiting weight gradient is always ready (its backward ran on the same rank,
before the rank's free time): it runs first once urgent (state._oldest_weight), else only when no
forward or backward is ready.
"""

from __future__ import annotations

from meshplan.cost_models.pipeline.schedule import Schedule
from meshplan.cost_models.pipeline.state import State, backward_release, weight_release

_INF = float("inf")
_TOLERANCE = 1e-12  # state.picker's: a block ready within this of its rank's free time starts then


def is_fixed_order(sched: Schedule) -> bool:
    return all(ra.forwards is not None for ra in sched.ranks)


_F, _B, _W = 0, 1, 2  # the kind of a pick


def run_fixed_order(sched: Schedule, st: State, result, keep_blocks: bool, block_type) -> None:
    """Simulate into `result` (simulation.ScheduleResult): blocks if kept, busy time, peak in flight,
    memory phases, makespan and whether a rank passed its held limit."""
    pp, n_micro, last_stage = sched.pp, sched.n_micro, sched.n_stages - 1
    rank_of, forward_first, split = sched.rank_of, sched.forward_first, sched.split_backward
    orders = [ra.forwards for ra in sched.ranks]
    b_orders = [ra.backwards for ra in sched.ranks]
    n_forwards, n_backwards = [len(o) for o in orders], [len(o) for o in b_orders]
    limits = [ra.limit for ra in sched.ranks]
    f, b_eff, w, p2p_fwd, p2p_bwd = st.f, st.b_eff, st.w, st.p2p_fwd, st.p2p_bwd
    f_done, b_done = st.f_done, st.b_done
    free, held, n_held, kept_by = st.free, st.held, st.n_held, st.kept_by
    next_f, next_b, pending_f, pending_w = st.next_f, st.next_b, st.pending_f, st.pending_w
    kept, held_limit = st.kept, st.held_limit
    phase, losses = st.phase, st.losses
    busy, peak, blocks, phases = result.busy, result.peak_in_flight, result.blocks, result.phases
    last_was_b = [True] * pp  # state.State.last_kind starts at "B"

    def pick(r: int) -> tuple | None:
        """(start, kind, stage, micro-batch) of rank r's next block, None if it has none ready."""
        waiting = pending_w[r]
        if waiting and (len(waiting) > pp or n_held[r] >= limits[r]):  # an urgent weight gradient goes first
            s_w, mb_w = waiting[0]
            return free[r], _W, s_w, mb_w
        t_f = t_b = None
        if n_held[r] < limits[r] and pending_f[r]:
            s_f, mb_f = orders[r][next_f[r]]
            if s_f == 0:
                t_f = 0.0
            else:
                done = f_done[(s_f - 1) * n_micro + mb_f]
                if done is not None:
                    t_f = done + p2p_fwd[s_f]
        if next_b[r] < n_backwards[r]:
            s_b, mb_b = b_orders[r][next_b[r]]
            fwd_done = f_done[s_b * n_micro + mb_b]
            if fwd_done is not None:
                if s_b == last_stage:
                    t_b = fwd_done
                else:
                    grad = b_done[(s_b + 1) * n_micro + mb_b]
                    if grad is not None:
                        grad += p2p_bwd[s_b]
                        t_b = grad if grad > fwd_done else fwd_done
        now = free[r] + _TOLERANCE
        f_ready = t_f is not None and t_f <= now
        b_ready = t_b is not None and t_b <= now
        if f_ready and b_ready:
            # Steady 1F1B: the other kind than last time (forward-first schedules: always forward).
            if forward_first or last_was_b[r]:
                return free[r], _F, s_f, mb_f
            return free[r], _B, s_b, mb_b
        if f_ready:
            return free[r], _F, s_f, mb_f
        if b_ready:
            return free[r], _B, s_b, mb_b
        if waiting:  # a weight gradient fills what would otherwise be idle
            s_w, mb_w = waiting[0]
            return free[r], _W, s_w, mb_w
        if t_f is None:
            return None if t_b is None else (t_b, _B, s_b, mb_b)
        if t_b is None:
            return t_f, _F, s_f, mb_f
        # Neither ready: the earlier; on a tie the backward (state.picker's candidate order).
        if t_f < t_b:
            return t_f, _F, s_f, mb_f
        return t_b, _B, s_b, mb_b

    release, release_weight = backward_release(sched, st), weight_release(sched, st)

    remaining = sched.n_stages * n_micro * (3 if split else 2)
    picks: list = [pick(r) for r in range(pp)]
    times = [got[0] if got is not None else _INF for got in picks]
    makespan = 0.0
    while remaining:
        first = min(times)
        if first == _INF:
            raise RuntimeError(f"{sched.name}: deadlock with pp={sched.pp} v={sched.v} m={sched.n_micro}")
        r = times.index(first)
        start, kind, s, mb = picks[r]
        other = -1
        if kind == _F:
            next_f[r] += 1
            pending_f[r] -= 1
            end = start + f[s]
            f_done[s * n_micro + mb] = end
            held[r] += 1.0
            n_held[r] += 1
            if s == last_stage:
                losses[r] += 1
            if kept is not None:
                kept_by[r] += kept[s]
            if held_limit is not None and held[r] + kept_by[r] > held_limit[r]:
                result.exceeded = True
                break
            if s < last_stage:  # the next stage's rank, if this forward is the one its next forward waits on
                o = rank_of[s + 1]
                if next_f[o] < n_forwards[o] and orders[o][next_f[o]] == (s + 1, mb):
                    other = o
        elif kind == _B:
            next_b[r] += 1
            end = start + b_eff[s]
            b_done[s * n_micro + mb] = end
            release(r, s, mb)
            if s > 0:  # the previous stage's rank, if this backward is the one its next backward waits on
                o = rank_of[s - 1]
                if next_b[o] < n_backwards[o] and b_orders[o][next_b[o]] == (s - 1, mb):
                    other = o
        else:
            release_weight(r, s)
            end = start + w[s]
        # simulation._recorder's bookkeeping of the finished block
        h = held[r]
        load = h + kept_by[r]
        if h > peak[r]:
            peak[r] = h
        ph, j = phases[r], phase[r]
        got = ph[j]
        if got is None or load > got[0] + got[1]:
            ph[j] = (h, kept_by[r], float(max(losses[r], got[2] if got else 0)))
        elif losses[r] > got[2]:
            ph[j] = (got[0], got[1], float(losses[r]))
        if keep_blocks:
            blocks.append(block_type(r, s, mb, "FBW"[kind], start, end))
        busy[r] += end - start
        free[r] = end
        if kind != _W:
            last_was_b[r] = kind == _B
        if end > makespan:
            makespan = end
        remaining -= 1
        got = picks[r] = pick(r)
        times[r] = got[0] if got is not None else _INF
        if other >= 0 and other != r:
            got = picks[other] = pick(other)
            times[other] = got[0] if got is not None else _INF
    result.makespan = makespan
