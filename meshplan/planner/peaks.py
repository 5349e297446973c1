"""A leaf's peak memory per pipeline rank, given the activations each rank holds in each memory phase.

Ranks that hold the same layers and ends differ only in what they hold in flight, so one rank per
such group and phase is priced. The same groups give each rank's held limit: the most activation sets
it can hold and still fit in its lightest phase, which stops a schedule simulation as soon as a plan
cannot fit.
"""

from __future__ import annotations

from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import (GIB, heaviest_phases, optimizer_step_memory, phase_memory, rank_memory,
                                         stage_params)
from meshplan.profiles.schema import ClusterProfile


class Peaks:
    def __init__(self, prof: ClusterProfile, usable_gib: float):
        self.prof, self.usable = prof, usable_gib
        self._rank_groups: dict = {}

    def peak_memory_gib(self, lay: Layout, phases: tuple) -> float:
        """The highest rank peak over the memory phases (ScheduleResult.phases). Ranks holding the same
        layers and ends differ only in activations in flight, and a rank's peak in a phase grows with
        those: one rank per such group and phase is enough."""
        peak = 0.0
        for ranks in self.rank_groups(lay):
            # Per phase, the rank of the group holding the most; then only phases no other outweighs.
            heaviest = {}
            for i in range(len(phases[ranks[0]])):
                r = max(ranks, key=lambda r: -1.0 if phases[r][i] is None else phases[r][i][0])
                heaviest[i] = r
            for i, load in heaviest_phases((i, phases[r][i]) for i, r in heaviest.items()):
                peak = max(peak, phase_memory(lay, heaviest[i], i, load, self.prof.overheads).total)
            peak = max(peak, optimizer_step_memory(lay, ranks[0], self.prof.overheads).total)
        return peak / GIB

    def rank_groups(self, lay: Layout) -> list[list[int]]:
        """Pipeline ranks grouped by the layers (of each block kind) and ends they hold (the same for every
        layout alike)."""
        key = (lay.pp, lay.schedule, lay.stage_layers, lay.tp)
        got = self._rank_groups.get(key)
        if got is None:
            groups: dict[tuple, list[int]] = {}
            for r in range(lay.pp):
                sp = stage_params(lay, r)
                groups.setdefault((sp.kinds, sp.embedding, sp.head), []).append(r)
            got = self._rank_groups[key] = list(groups.values())
        return got

    def held_limits(self, lay: Layout) -> tuple[float, ...]:
        """Per pipeline rank, the most activation sets it can hold and still fit in its lightest memory
        phase (no gradient accumulators, no loss), so that the limit stops no plan that fits (inf: any
        number). Memory grows with what a rank holds, so a bisection over whole sets finds it; -1 if even
        none fits."""
        limits = [0.0] * lay.pp
        for ranks in self.rank_groups(lay):
            limit = self._held_limit(lay, ranks[0])
            for rank in ranks:
                limits[rank] = limit
        return tuple(limits)

    def _held_limit(self, lay: Layout, r: int) -> float:
        cap = lay.n_micro * lay.v  # no rank holds more than all its (stage, micro-batch) pairs

        def gib(h: int) -> float:
            return rank_memory(lay, r, float(h), self.prof.overheads, accumulating=0, loss_live=False).total / GIB

        top, bottom = gib(cap), gib(0)
        if top <= self.usable:
            return float("inf")
        if bottom > self.usable:
            return -1.0
        lo, hi = 0, cap  # fits(lo), not fits(hi)
        # Memory is about linear in the sets held: the line through both ends nearly always names the
        # last set that fits, and two checks confirm it (fits is monotone, so that is the bisection's
        # answer); where it does not, bisect from the narrowed interval.
        g = min(cap - 1, max(0, int((self.usable - bottom) / (top - bottom) * cap)))
        if gib(g) <= self.usable:
            lo = g
            if g + 1 < cap:
                lo, hi = (g + 1, hi) if gib(g + 1) <= self.usable else (lo, g + 1)
        else:
            hi = g  # g > 0: fits(0)
            if g - 1 > 0:
                lo, hi = (g - 1, hi) if gib(g - 1) <= self.usable else (lo, g - 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if gib(mid) <= self.usable else (lo, mid)
        return float(lo)
