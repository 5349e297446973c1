"""Expanding a knob class into its leaves: (schedule, virtual stages, layer split), bounded in bulk.

A pipeline-free class is scored at once. A pipelined class's valid leaves are grouped by (v,
split, bound kind) and bounded with one small matrix product per split (linear_bound_rows on the
class's fastest durations); groups are opened one at a time as the search reaches their bound, and
a leaf's own SAC choice, durations and step bound are worked out only when it comes up (`refine`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from meshplan.cost_models.estimate import StepParts, compose_step, rank_busy, stage_durations, stage_inputs
from meshplan.cost_models.layout import Layout, even_split
from meshplan.cost_models.pipeline import bound_kind, linear_bound_rows, makespan_lower_bound
from meshplan.planner.bounds import Bounds, layer_costs
from meshplan.planner.constraints import PP_LAYERS, SPLIT, schedule_reason
from meshplan.planner.enumeration import KnobClass, fastest_member
from meshplan.planner.pool import Pool
from meshplan.planner.sac_choice import SacChoice
from meshplan.planner.scoring import Scoring
from meshplan.planner.space import EVEN, SAC_ILP, Space
from meshplan.planner.stage_split import balanced_split, balanced_split_costs
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.rules import ac_schedule_reason, microbatch_reason

Group = tuple[float, int, tuple[int, ...], list[str]]  # (bound, v, layers, schedules)


@dataclass
class LeafGroups:
    """A pipelined class's leaves, grouped by (v, split, bound kind) and sorted by their shared bound:
    one heap entry per class, opened a group at a time, so leaves that never come up cost nothing."""

    cls: KnobClass
    fast: Layout
    ref: tuple
    groups: list[Group]
    next: int = 0

    def remaining(self) -> int:
        return sum(len(g[3]) for g in self.groups[self.next:])


class Leaves:
    def __init__(self, space: Space, prof: ClusterProfile, pool: Pool, bounds: Bounds, sac: SacChoice,
                 scoring: Scoring):
        self.space, self.prof, self.spec = space, prof, space.plan.model
        self.pool, self.bounds, self.sac, self.scoring = pool, bounds, sac, scoring
        self._leaf_tables: dict = {}
        self._split_reasons: dict = {}
        self._split_cache: dict = {}

    def expand(self, c: KnobClass) -> list[tuple[float, str, Any]]:
        """Score a pipeline-free class at once. A pipelined class yields its valid leaves as pending
        items bounded by the schedule's makespan bound on the class's fastest durations; a leaf's own
        SAC choice, durations and step are worked out only if it is popped (`refine`)."""
        base = c.layout
        if base.pp == 1:
            self.scoring.score(self.sac.with_sac(base, c.order, c.sac), c.order, None, c.sac == SAC_ILP)
            return []
        # For the SAC ILP class the save-everything member is the fastest: its bound holds for the class.
        fast = fastest_member(base, c.sac)
        ref = stage_inputs(fast, self.prof, c.order)  # spans, block time, head and embedding: split-free
        a_f, a_bw, emb, head, p2p = self.bounds.linear_costs(fast, ref)
        per_layer = self.bounds.per_layer_times(base, c.order)[0]  # the class's own layers balance the split
        m = base.n_micro
        # A hair under the exact bound, so float rounding in the linear form never prunes a leaf too early.
        x = np.array([a_f, a_bw, m * (a_f + a_bw), m * emb, m * head, emb, p2p]) * (1 - 1e-12)
        groups: list[Group] = []
        by_v: dict[int, list[str]] = {}
        for sched, v in self.space.schedule_options(base.pp):
            by_v.setdefault(v, []).append(sched)
        for v, scheds in by_v.items():
            seen_splits: set = set()
            for split in self.space.split_options(base.pp):
                layers = self._split_layers(base.pp, scheds, v, split, (per_layer, emb, head, ref), seen_splits)
                if layers is not None:
                    groups += self._split_groups(base, m, v, scheds, layers, x)
        if not groups:
            return []
        groups.sort(key=lambda g: g[0])
        return [(groups[0][0], "groups", LeafGroups(c, fast, ref, groups))]

    def _split_layers(self, pp: int, scheds: list[str], v: int, split: Any, work: tuple[float, float, float, tuple],
                      seen: set) -> tuple[int, ...] | None:
        """The layers per stage of one split option, or None (counted) if it is invalid or a repeat."""
        reason = self.split_reason(pp, scheds[0], v, split)
        if reason in (PP_LAYERS, SPLIT):
            self.pool.reject(reason, len(scheds))
            return None
        layers = self.stage_layers(pp * v, split, *work)
        if layers in seen:
            self.pool.n_dom += len(scheds)  # the balanced split came out even: the same leaves, scored once
            return None
        seen.add(layers)
        return layers

    def _split_groups(self, base: Layout, m: int, v: int, scheds: list[str], layers: tuple[int, ...],
                      x: np.ndarray) -> list[Group]:
        """One split's valid schedules, grouped by bound kind, each group with its bound (or bounded out)."""
        valid_by_kind, rejected, rows = self.leaf_table(base.pp, v, scheds, layers, m, base.ac)
        for reason, n in rejected.items():
            self.pool.reject(reason, n)
        if not valid_by_kind:
            return []
        overhead = self.prof.overheads.step_overhead_s
        # Durations depend on v, the split and the saved op kinds, not on the schedule: one
        # product bounds every schedule kind of this split.
        bounds = (rows @ x).reshape(len(valid_by_kind), base.pp).max(axis=1).tolist()
        out = []
        for quick, kind_scheds in zip(bounds, valid_by_kind):
            if quick + overhead >= self.pool.kth():
                self.pool.n_bounded += len(kind_scheds)
            else:
                out.append((quick + overhead, v, layers, kind_scheds))
        return out

    def open_group(self, lg: LeafGroups) -> list[tuple[float, str, Any]]:
        """The next group's leaves as pending items, and the class again with the group after it."""
        bound, v, layers, scheds = lg.groups[lg.next]
        lg.next += 1
        quick = bound - self.prof.overheads.step_overhead_s
        out: list[tuple[float, str, Any]] = [(bound, "pending", (lg.cls, lg.fast, lg.ref, sched, v, layers, quick))
                                             for sched in scheds]
        if lg.next < len(lg.groups):
            out.append((lg.groups[lg.next][0], "groups", lg))
        return out

    def leaf_table(self, pp: int, v: int, scheds: list[str], layers: tuple[int, ...], m: int, ac: str) -> tuple:
        """For one split: (valid schedules grouped by bound kind, rejections by reason, the kinds'
        linear_bound_rows stacked in the same order). The same for every class with these numbers."""
        key = (pp, v, layers, m, ac)
        got = self._leaf_tables.get(key)
        if got is None:
            by_kind: dict[tuple[bool, bool], list[str]] = {}
            rejected: dict[str, int] = {}
            for sched in scheds:
                reason = (schedule_reason(self.spec.n_layers, pp, sched, v, list(layers))
                          or microbatch_reason(sched, pp, v, m) or ac_schedule_reason(pp, sched, ac))
                if reason:
                    rejected[reason] = rejected.get(reason, 0) + 1
                else:
                    by_kind.setdefault(bound_kind(sched), []).append(sched)
            kinds = sorted(by_kind)
            rows = np.vstack([linear_bound_rows(pp, v, *k, layers) for k in kinds]) if kinds else None
            got = self._leaf_tables[key] = ([by_kind[k] for k in kinds], rejected, rows)
        return got

    def split_reason(self, pp: int, sched: str, v: int, split: Any) -> str | None:
        key = (pp, sched, v, split)
        if key not in self._split_reasons:
            self._split_reasons[key] = schedule_reason(self.spec.n_layers, pp, sched, v,
                                                       list(split) if isinstance(split, tuple) else None)
        return self._split_reasons[key]

    def stage_layers(self, n_stages: int, split: Any, per_layer: float, emb: float, head: float,
                     ref: tuple | None = None) -> tuple[int, ...]:
        """The layers per stage of a split option: `per_layer`, `emb` and `head` are the work of a layer
        and of the ends (the embedding, the head with the loss) that a balanced split evens out; where the
        model's blocks differ (dense first layers), each layer's own work from `ref`'s block times."""
        if isinstance(split, tuple):
            return split
        if split == EVEN:
            return even_split(self.spec.n_layers, n_stages)
        if ref is not None and len(ref[1]) > 1:
            costs = tuple(round(c / per_layer, 3) for c in layer_costs(self.spec, ref[1]))
            key = (n_stages, round(emb / per_layer, 3), round(head / per_layer, 3), costs)
            out = self._split_cache.get(key)
            if out is None:
                extras = [key[1]] + [0.0] * (n_stages - 2) + [key[2]]
                out = self._split_cache[key] = balanced_split_costs(list(costs), extras)
            return out
        # The balanced split depends only on the stage count and the ends' extra work in layers.
        key = (n_stages, round(emb / per_layer, 3), round(head / per_layer, 3))
        out = self._split_cache.get(key)
        if out is None:
            extras = [emb] + [0.0] * (n_stages - 2) + [head]
            out = self._split_cache[key] = balanced_split(self.spec.n_layers, extras, per_layer)
        return out

    def refine(self, c: KnobClass, fast: Layout, ref: tuple, sched: str, v: int, layers: tuple[int, ...],
               quick: float) -> tuple[float, Layout, tuple, StepParts | None, bool]:
        """A pending leaf made exact but for the schedule simulation: (step bound, layout, order, parts,
        whether score still chooses its SAC subset)."""
        lay = c.layout.with_(schedule=sched, v=v, stage_layers=layers)
        guess, lay = self.sac.with_sac(lay, c.order, c.sac), self.sac.with_sac(lay, c.order, c.sac, optimistic=True)
        same = lay.sac_ops == fast.sac_ops  # then the class's pieces and quick bound hold as they are
        inputs = ref if same else stage_inputs(lay, self.prof, c.order)
        d = stage_durations(lay, self.prof, *inputs)
        bound = quick if same else makespan_lower_bound(sched, lay.pp, v, lay.n_micro, d.forward, d.backward,
                                                         d.weight, d.p2p)
        # Durations do not depend on the schedule; each rank's work does (stage placement).
        parts = StepParts(*inputs, d, rank_busy(lay, d))
        # The bound is the optimistic subset's; an SAC ILP leaf's own subset is settled in score against
        # the simulated peak, starting from the guess.
        if guess.sac_ops != lay.sac_ops:
            return compose_step(lay, self.prof, parts, bound)[0], guess, c.order, None, True
        return compose_step(lay, self.prof, parts, bound)[0], lay, c.order, parts, c.sac == SAC_ILP
