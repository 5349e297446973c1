"""Pipeline bounds without simulating: each rank's work and a makespan no execution can beat.

Both read only the schedule's stage placement (schedule.py), so the planner can bound thousands of
(split, schedule) leaves cheaply; the simulation (simulation.py) reaches these bounds' closed forms.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from meshplan.cost_models.pipeline.schedule import SPLIT_BACKWARD, V_SHAPED, stage_rank


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
