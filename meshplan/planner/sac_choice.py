"""Selective activation checkpointing by the SAC ILP: which op kinds a leaf saves.

Item values (bytes saved and recompute seconds per op kind) are read off the cost model; their
Pareto subsets (sac_ilp.py) are ordered by bytes saved, so memory falls along the list and the
least-recompute subset that fits is found by bisection. The winner's choice is re-solved with
pulp's ILP solver as a check.
"""

from __future__ import annotations

from typing import Any

from meshplan.cost_models.activations import activation_bytes_per_token
from meshplan.cost_models.estimate import group_spans, step_parts
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import ONE_RANK_PHASES, passed_phases
from meshplan.cost_models.pipeline import in_flight_limit
from meshplan.planner.peaks import Peaks
from meshplan.planner.results import Candidate
from meshplan.planner.sac_ilp import SacItems, pareto_subsets, solve_sac_ilp
from meshplan.planner.space import SAC_ILP
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import SAC_OPS


class SacChoice:
    def __init__(self, prof: ClusterProfile, usable_gib: float, peaks: Peaks):
        self.prof, self.usable, self.peaks = prof, usable_gib, peaks
        self._sac_cache: dict = {}
        self._pareto: dict = {}
        self._sac_choice: dict = {}

    def with_sac(self, lay: Layout, order, sac: Any, optimistic: bool = False) -> Layout:
        """Resolve the SAC ILP choice for this leaf: see choose."""
        if sac != SAC_ILP:
            return lay
        key = (lay, order, optimistic)
        chosen = self._sac_choice.get(key)
        if chosen is None:
            chosen = self._sac_choice[key] = self.choose(lay, order, optimistic)
        return lay.with_(sac_ops=chosen)

    def choose(self, lay: Layout, order, optimistic: bool) -> tuple[str, ...]:
        """The least-recompute Pareto subset of the SAC ILP whose peak fits on every pipeline rank, each
        rank holding its schedule's in-flight limit: the guess score starts from, walking on against
        the simulated peak. `optimistic`: one micro-batch in flight per rank, no fewer than any
        simulation holds, so no subset faster than this one can fit (what a rigorous bound needs)."""
        held = _phases(lay, optimistic)
        subsets = self.pareto(self.sac_items(lay, order))
        # Along the Pareto list bytes saved only fall, so memory does too: bisect for the first that fits.
        lo, hi = 0, len(subsets) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.peaks.peak_memory_gib(lay.with_(sac_ops=subsets[mid]), held) <= self.usable:
                hi = mid
            else:
                lo = mid + 1
        return subsets[lo]

    def pareto(self, items: SacItems) -> list[tuple[str, ...]]:
        subsets = self._pareto.get(id(items))
        if subsets is None:
            subsets = self._pareto[id(items)] = pareto_subsets(items)
        return subsets

    def sac_items(self, lay: Layout, order) -> SacItems:
        """ILP item values read off the cost model one op kind at a time (bytes and recompute seconds)."""
        spans = group_spans(lay, self.prof, order)
        key = (lay.micro_batch, lay.cp, lay.tp, lay.sp, lay.float8, lay.compile, spans["tp"], spans["cp"], lay.ep)
        items = self._sac_cache.get(key)
        if items is None:
            items = self._sac_cache[key] = self._items(lay, order)
        return items

    def _items(self, lay: Layout, order) -> SacItems:
        ref = lay.with_(ac="selective")
        spec = lay.spec
        # Per layer, averaged over the model's blocks where they differ (an MoE model's dense first layers).
        kinds = [(layers[0], len(layers) / spec.n_layers) for layers in spec.block_kinds().values()]

        def act(sub: tuple[str, ...]) -> float:
            return sum(w * activation_bytes_per_token(spec, lay.seq_len, lay.tp, lay.sp, "selective", sub, lay.act_bytes,
                                                      layer=k, ep=lay.ep, imbalance=lay.moe_imbalance)
                       for k, w in kinds)

        def recompute(sub: tuple[str, ...]) -> float:
            bts = step_parts(ref.with_(sac_ops=sub), self.prof, order).bts
            return sum(w * bts[k].recompute for k, w in kinds)

        base = act(())
        b = {k: act((k,)) - base for k in SAC_OPS}
        r_all = recompute(())
        r_one = {k: recompute(tuple(x for x in SAC_OPS if x != k)) for k in SAC_OPS}
        active = [k for k in SAC_OPS if r_one[k] > 0]
        e = (sum(r_one[k] for k in active) - r_all) / (len(active) - 1) if len(active) > 1 else 0.0
        t = {k: (r_one[k] - e if k in active else 0.0) for k in SAC_OPS}
        return SacItems(SAC_OPS, b, base, t, e)

    def check_with_pulp(self, best: Candidate) -> str:
        """Re-solve the winner's SAC choice with pulp's ILP solver: it must agree with the enumeration."""
        lay = best.layout
        items = self.sac_items(lay, best.order)
        budget = items.bytes_of(lay.sac_ops)
        chosen = solve_sac_ilp(items, budget)
        if chosen is None:
            return "pulp: infeasible"
        same = abs(items.time_of(chosen) - items.time_of(lay.sac_ops)) <= 1e-12 * max(1.0, items.time_of(lay.sac_ops))
        return f"pulp ILP {'agrees' if same else 'DISAGREES'}: saves {', '.join(chosen) or 'nothing'}"


def _phases(lay: Layout, optimistic: bool) -> tuple:
    """Memory phases (pipeline ScheduleResult.phases) to price a subset at before any simulation.
    Optimistic: only states every rank passes through (memory.passed_phases), so no faster subset can
    fit. Else each rank at its schedule's in-flight limit with every accumulator."""
    if optimistic:
        return (passed_phases(lay),) * lay.pp
    if lay.pp == 1:
        return ONE_RANK_PHASES
    n = 2 * lay.v + 2
    return tuple((None,) * (n - 2) + ((float(in_flight_limit(lay.schedule, lay.pp, lay.v, r, lay.n_micro)), 0.0, 1.0),
                                       None) for r in range(lay.pp))
