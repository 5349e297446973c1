"""The cost model's pipeline schedules against PyTorch's own: the action lists that
torch.distributed.pipelining builds (`pipeline_order`) for the runtime's schedule classes, read
without a process group (stand-in stages carry the indices the classes read). The simulation must
hold exactly as many activation sets per rank as those lists ever do, and its makespan must stay
close to theirs run as a list scheduler over the same durations."""

from __future__ import annotations

import pytest
import torch.distributed.pipelining.schedules as pt

from meshplan.cost_models.pipeline import simulate, stage_rank
from meshplan.specs.rules import microbatch_reason

CLASSES = {"Interleaved1F1B": pt.ScheduleInterleaved1F1B, "LoopedBFS": pt.ScheduleLoopedBFS,
           "InterleavedZeroBubble": pt.ScheduleInterleavedZeroBubble, "ZBVZeroBubble": pt.ScheduleZBVZeroBubble,
           "DualPipeV": pt.ScheduleDualPipeV}


class _Stage:
    """What the schedule classes read of a stage when they build their action lists."""

    def __init__(self, index: int, pp: int, n_stages: int):
        self.stage_index, self.group_rank, self.group_size, self.num_stages = index, 0, pp, n_stages
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        self.submod = None
        self.has_backward = True


def pytorch_actions(schedule: str, pp: int, v: int, m: int) -> dict[int, list]:
    """Per rank, PyTorch's compute actions in order, overlapped pairs (DualPipeV) split into their parts."""
    n = pp * v
    stages = [_Stage(s, pp, n) for s in range(n) if stage_rank(s, pp, schedule) == 0]
    order = CLASSES[schedule](stages, m).pipeline_order

    def parts(a):
        return [x for sub in a.sub_actions for x in parts(sub)] if a.sub_actions else [a]
    return {r: [x for a in order[r] if a is not None for x in parts(a)] for r in range(pp)}


def held_peaks(actions: dict[int, list]) -> list[int]:
    """Most activation sets a rank holds: from its forward to its full backward or weight pass."""
    out = []
    for r in sorted(actions):
        held, peak = set(), 0
        for a in actions[r]:
            kind, key = a.computation_type.name, (a.stage_index, a.microbatch_index)
            if kind == "FORWARD":
                held.add(key)
            elif kind in ("FULL_BACKWARD", "BACKWARD_WEIGHT"):
                held.discard(key)
            peak = max(peak, len(held))
        out.append(peak)
    return out


def list_makespan(actions: dict[int, list], n_stages: int, f: float, b: float, w: float) -> float:
    """PyTorch's per-rank orders run as given, each action as soon as its rank and inputs allow."""
    dur = {"FORWARD": f, "BACKWARD_INPUT": b, "BACKWARD_WEIGHT": w, "FULL_BACKWARD": b + w}
    done: dict[tuple, float] = {}
    free, pos = {r: 0.0 for r in actions}, {r: 0 for r in actions}
    moved = True
    while moved:
        moved = False
        for r, acts in actions.items():
            while pos[r] < len(acts):
                a = acts[pos[r]]
                kind, s, mb = a.computation_type.name, a.stage_index, a.microbatch_index
                if kind == "FORWARD":
                    needs = [("F", s - 1, mb)] if s > 0 else []
                elif kind == "BACKWARD_WEIGHT":
                    needs = [("B", s, mb)]
                else:
                    needs = [("B", s + 1, mb)] if s < n_stages - 1 else [("F", s, mb)]
                if any(k not in done for k in needs):
                    break
                free[r] = max([free[r]] + [done[k] for k in needs]) + dur[kind]
                done[("F" if kind == "FORWARD" else "W" if kind == "BACKWARD_WEIGHT" else "B", s, mb)] = free[r]
                pos[r] += 1
                moved = True
    assert all(pos[r] == len(acts) for r, acts in actions.items()), "PyTorch's order deadlocked"
    return max(free.values())


GRID = [(schedule, pp, v, m) for schedule in CLASSES for pp in (2, 3, 4, 8)
        for v in ((2,) if schedule in ("ZBVZeroBubble", "DualPipeV") else (2, 3))
        for m in (pp - 1, pp, pp + 1, pp + 2, 2 * pp, 2 * pp + 2, 3 * pp + 1, 4 * pp, 6 * pp)
        if microbatch_reason(schedule, pp, v, m) is None]  # the counts the planner and runtime accept


@pytest.mark.parametrize("schedule,pp,v,m", GRID)
def test_simulation_holds_what_pytorchs_order_holds(schedule, pp, v, m):
    n = pp * v
    sim = simulate(schedule, pp, v, m, [1.0] * n, [1.0] * n, [1.0] * n)
    assert [int(x) for x in sim.peak_in_flight] == held_peaks(pytorch_actions(schedule, pp, v, m))


@pytest.mark.parametrize("schedule", ["InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"])
@pytest.mark.parametrize("pp,m", [(2, 8), (4, 8), (4, 16), (8, 16)])
@pytest.mark.parametrize("f,b,w", [(0.5, 0.5, 0.5), (1.0, 1.3, 0.7)])
def test_split_backward_makespan_close_to_pytorchs_order(schedule, pp, m, f, b, w):
    v, n = 2, 2 * pp
    ours = simulate(schedule, pp, v, m, [f] * n, [b] * n, [w] * n).makespan
    theirs = list_makespan(pytorch_actions(schedule, pp, v, m), n, f, b, w)
    assert ours == pytest.approx(theirs, rel=0.05)
