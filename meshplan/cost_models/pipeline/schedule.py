"""A pipeline schedule as data: where each stage lives and what each rank may run, in which order.

A schedule is a stage->rank mapping, a forward and a backward order per rank (or None where the
schedule picks greedily among its stages), an in-flight limit per rank and whether backward is
split into input-gradient (B) and weight-gradient (W) work. Nothing here knows durations: the
simulation (simulation.py) times these actions, the bounds (bounds.py) bound them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.specs.rules import SPLIT_BACKWARD_SCHEDULES as SPLIT_BACKWARD, microbatch_rounds

V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
FORWARD_FIRST = ("GPipe", "LoopedBFS")

Action = tuple[int, int]  # (stage, micro-batch)


def stage_rank(stage: int, pp: int, schedule: str) -> int:
    """Loop placement (stage s on rank s % pp), or V-shape (rank r holds stages r and 2pp-1-r)."""
    if schedule in V_SHAPED:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def rounds_size(pp: int, n_micro: int) -> int:
    """Micro-batches per round of PyTorch's interleaved schedules (specs.rules.microbatch_reason
    refuses counts that do not split into equal rounds)."""
    return n_micro // microbatch_rounds(pp, n_micro)


def in_flight_limit(schedule: str, pp: int, v: int, rank: int, n_micro: int) -> int:
    """How many (stage, micro-batch) activation sets a rank may hold before it must free one: by its
    backward, or under a split backward by its weight pass (the input-gradient pass keeps the graph).
    The split-backward limits are the most PyTorch's own action lists (`pipeline_order`) ever hold."""
    total = n_micro * v
    if schedule in FORWARD_FIRST:
        return total
    if schedule == "1F1B":
        return min(pp - rank, total)
    per_round = rounds_size(pp, n_micro)
    if schedule == "Interleaved1F1B":
        # The warm-up (every chunk but the last of a round, plus two per later rank) and the one
        # forward of the steady 1F1B phase.
        return min((v - 1) * per_round + 2 * (pp - rank - 1) + 1, total)
    if schedule == "InterleavedZeroBubble":
        # ZB1P: every chunk but the last of a round, plus pp sets its weight passes have not freed.
        return min((v - 1) * per_round + pp, total)
    if schedule == "ZBVZeroBubble":
        return min(2 * pp, n_micro + 1 + rank, total)
    if schedule == "DualPipeV":
        return min(2 * pp + 1, total)
    raise ValueError(schedule)


def forward_order(schedule: str, pp: int, v: int, rank: int, n_micro: int) -> list[Action] | None:
    """Fixed (stage, micro-batch) forward order of a rank, or None where the schedule picks greedily."""
    stages = [c * pp + rank for c in range(v)]
    if schedule in ("GPipe", "1F1B"):
        return [(rank, mb) for mb in range(n_micro)]
    if schedule == "LoopedBFS":
        return [(s, mb) for s in stages for mb in range(n_micro)]
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble"):
        return _interleaved_forward_order(pp, v, n_micro, stages)
    return None


def _interleaved_forward_order(pp: int, v: int, n_micro: int, stages: list[int]) -> list[Action]:
    """Megatron's interleaved order as PyTorch runs it: a round of micro-batches (at least pp) through
    one chunk, then the same round through the next chunk."""
    per_round = rounds_size(pp, n_micro)
    order = []
    for k in range(n_micro * v):
        group, within = divmod(k, per_round * v)
        chunk, offset = divmod(within, per_round)
        mb = group * per_round + offset
        if mb < n_micro:
            order.append((stages[chunk], mb))
    seen = set(order)
    order += [(s, mb) for mb in range(n_micro) for s in stages if (s, mb) not in seen]
    return order


def backward_order(schedule: str, pp: int, v: int, rank: int, n_micro: int) -> list[Action] | None:
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


@dataclass(frozen=True)
class RankActions:
    """What one pipeline rank runs: its stages, fixed forward / backward orders (both None: greedy
    over its stages, each stage's micro-batches in order) and how many activation sets it may hold."""

    stages: tuple[int, ...]
    forwards: tuple[Action, ...] | None
    backwards: tuple[Action, ...] | None
    limit: int


@dataclass(frozen=True)
class Schedule:
    """One schedule at one (pp, v, micro-batch count), as data the simulation walks."""

    name: str
    pp: int
    v: int
    n_micro: int
    split_backward: bool  # B and W run as separate blocks
    forward_first: bool  # ready forwards always go before ready backwards
    rank_of: tuple[int, ...]  # rank of each stage
    ranks: tuple[RankActions, ...]

    @property
    def n_stages(self) -> int:
        return self.pp * self.v


@lru_cache(maxsize=1024)
def build_schedule(schedule: str, pp: int, v: int, n_micro: int) -> Schedule:
    """The per-rank action lists of `schedule` with pp ranks, v stages per rank and n_micro micro-batches
    (immutable, so one is shared by every simulation of these numbers)."""
    n_stages = pp * v
    rank_of = tuple(stage_rank(s, pp, schedule) for s in range(n_stages))
    ranks = tuple(RankActions(stages=tuple(s for s in range(n_stages) if rank_of[s] == r),
                              forwards=_frozen(forward_order(schedule, pp, v, r, n_micro)),
                              backwards=_frozen(backward_order(schedule, pp, v, r, n_micro)),
                              limit=in_flight_limit(schedule, pp, v, r, n_micro))
                  for r in range(pp))
    if any((ra.forwards is None) != (ra.backwards is None) for ra in ranks):
        raise ValueError(f"{schedule}: a rank's forward and backward orders must both be fixed or both greedy")
    return Schedule(schedule, pp, v, n_micro, schedule in SPLIT_BACKWARD, schedule in FORWARD_FIRST, rank_of, ranks)


def _frozen(order: list[Action] | None) -> tuple[Action, ...] | None:
    return None if order is None else tuple(order)
