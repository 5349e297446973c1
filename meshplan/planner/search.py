"""Branch and bound over the whole declared space, scored by the cost model.

Leaves are complete layouts. They are grouped into classes that share everything but the
pipeline schedule, virtual stages and layer split: (mesh degrees, mesh order, micro-batch, SP,
activation checkpointing, float8, reshard). A class gets two rigorous bounds from the cost model:
  - time: the step with the makespan replaced by the average pipeline rank's work (no schedule,
    split or placement of stages can finish before the average rank's work is done);
  - memory: the average pipeline rank's peak with one micro-batch in flight.
A class whose memory bound exceeds the device is rejected whole; the rest are expanded in order
of their time bound, leaf by leaf (a leaf's own bound is its busiest rank's work; only leaves
that can still enter the top K are simulated), until the next bound cannot beat the K-th best.
Every leaf ends counted exactly once: rejected (with its reason), scored exactly, dominated
(compile / async TP off, which the model proves slower at equal memory), or pruned by a bound.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshplan.cost_models.estimate import (Estimate, StageDurations, StepParts, block_key, compose_step,
                                           estimate_layout, group_spans, rank_busy, stage_durations, stage_inputs,
                                           step_parts)
from meshplan.cost_models.layout import Layout, even_split, runtime_paths
from meshplan.cost_models.memory import GIB, STATE_BYTES, rank_memory, stage_params

from meshplan.cost_models.pipeline import (bound_kind, in_flight_limit, linear_bound_rows, makespan_lower_bound,
                                           simulate_cached)
from meshplan.planner.constraints import (BATCH, MICROBATCHES, NO_FIT, PP_LAYERS, REASONS, SP_SEQ, SPLIT,
                                          ac_schedule_reason, batch_reason, mesh_reason, microbatch_reason,
                                          schedule_reason, sp_reason)
from meshplan.planner.placement import distinct_orders, placement_for
from meshplan.planner.sac_ilp import SacItems, pareto_subsets, solve_sac_ilp
from meshplan.planner.space import EVEN, SAC_ILP, Mesh, Space
from meshplan.planner.stage_split import balanced_split
from meshplan.planner.workers import default_jobs, search_on_workers
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import SAC_OPS, Plan

DOMINATED = "dominated (compile / async TP off: slower at equal memory)"
TOO_BIG = "too big"  # evaluate's answer when the simulation stopped: a rank held more than fits
BOUNDED_LEAF = "bounded"  # fitting_sac's answer when every subset still in question is bounded out
BOUNDED = "pruned: time bound >= K-th best"


@dataclass
class Candidate:
    layout: Layout
    order: tuple[str, ...]
    step_time_s: float
    peak_memory_gib: float
    estimate: Estimate | None = None
    placement: dict[str, str] | None = None

    def to_plan(self, base: Plan) -> Plan:
        lay = self.layout
        p = base.copy()
        t, par, mem = p.training, p.parallel, p.memory
        t.seq_len, t.global_batch, t.micro_batch, t.dtype = lay.seq_len, lay.global_batch, lay.micro_batch, lay.dtype
        par.dp_replicate, par.dp_shard, par.tp, par.cp, par.pp = lay.dp_replicate, lay.dp_shard, lay.tp, lay.cp, lay.pp
        par.sequence_parallel, par.async_tp = lay.sp, lay.async_tp
        par.pp_schedule, par.pp_virtual_stages = lay.schedule, lay.v
        even = even_split(lay.spec.n_layers, lay.n_stages)
        par.pp_layers = list(lay.stage_layers) if lay.pp > 1 and lay.stage_layers != even else None
        mem.activation_checkpointing = lay.ac
        mem.sac_ops = list(lay.sac_ops) if isinstance(lay.sac_ops, tuple) else None
        mem.float8, mem.reshard_after_forward = lay.float8, lay.reshard_after_forward
        p.compile = lay.compile
        p.placement = dict(self.placement) if self.placement else None
        p.mesh_order = list(self.order)
        return p


@dataclass
class NonFit:
    layout: Layout
    order: tuple[str, ...]
    step_time_s: float  # exact, or a lower bound when not `exact`
    peak_memory_gib: float  # exact, or a lower bound when not `exact`
    exact: bool


@dataclass
class SearchResult:
    ranked: list[Candidate]
    space_size: int
    rejections: dict[str, int]
    n_exact: int
    n_simulated: int  # pipeline simulations, those stopped early included
    n_dominated: int
    n_bounded: int
    non_fitting: list[NonFit]
    usable_memory_gib: float
    search_time_s: float
    assumptions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    base_plan: Plan | None = None
    sac_ilp_check: str = ""
    scored: list[Candidate] = field(default_factory=list)  # every exactly scored leaf (fits or not)
    profile: ClusterProfile | None = None
    n_stopped: int = 0  # simulations stopped once a rank held more than fits (no step time, not scored)

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    def best_plan(self) -> Plan | None:
        return self.ranked[0].to_plan(self.base_plan) if self.ranked else None

    def counts(self) -> dict[str, Any]:
        rejected = sum(self.rejections.values())
        return {"space": self.space_size, "scored_exactly": self.n_exact, "simulated": self.n_simulated,
                "simulations_stopped": self.n_stopped,
                "dominated": self.n_dominated, "pruned_by_bound": self.n_bounded, "rejected": rejected,
                "rejected_by_reason": {k: v for k, v in self.rejections.items() if v},
                "accounted": self.n_exact + self.n_dominated + self.n_bounded + rejected}


@dataclass(order=True)
class _Class:
    bound: float
    tie: int
    layout: Layout = field(compare=False)
    order: tuple[str, ...] = field(compare=False)
    sac: Any = field(compare=False)
    leaves: int = field(compare=False)  # leaves still represented (after dominance)


@dataclass
class _LeafGroups:
    """A pipelined class's leaves, grouped by (v, split, bound kind) and sorted by their shared bound:
    one heap entry per class, opened a group at a time, so leaves that never come up cost nothing."""

    cls: _Class
    fast: Layout
    ref: tuple
    groups: list[tuple[float, int, tuple[int, ...], list[str]]]  # (bound, v, layers, schedules)
    next: int = 0

    def remaining(self) -> int:
        return sum(len(g[3]) for g in self.groups[self.next:])


class _Search:
    def __init__(self, space: Space, prof: ClusterProfile, top_k: int):
        self.space, self.prof, self.top_k = space, prof, top_k
        self.spec = space.plan.model
        self.usable = prof.device.usable_memory_gib
        self.rejections = {r: 0 for r in REASONS}
        self.n_exact = self.n_sim = self.n_dom = self.n_bounded = self.size = self.n_stopped = 0
        self.top: list[tuple[float, int, Candidate]] = []  # max-heap by step via negation
        self.nonfit: list[NonFit] = []
        # Every exactly scored leaf, fitting or not (the candidates CSV); a leaf whose simulation stopped
        # at the memory limit has no step time and is only counted, as a no-fit rejection.
        self.scored: list[Candidate] = []
        self.tie = itertools.count()
        self.shared_top = None  # with worker processes: the K best step times any of them has found
        self._sac_cache: dict = {}
        self._pareto: dict = {}
        self._sac_choice: dict = {}
        self._layer_cache: dict = {}
        self._sim_cache: dict = {}
        self._sim_over: dict = {}
        self._split_cache: dict = {}
        self._leaf_tables: dict = {}
        self._rank_groups: dict = {}
        self._mesh_layouts: dict = {}
        self._flat_steps: dict = {}

    # -- bookkeeping ---------------------------------------------------------------------
    def reject(self, reason: str, n: int) -> None:
        self.rejections[reason] += n

    def own_kth(self) -> float:
        return -self.top[0][0] if len(self.top) >= self.top_k else float("inf")

    def kth(self) -> float:
        """What a bound must beat: the K-th best step time found so far, by this process or, with
        workers, by any of them together (see workers.SharedTopK)."""
        own = self.own_kth()
        if self.shared_top is not None:
            return min(own, self.shared_top.kth.value)
        return own

    def keep(self, cand: Candidate, share: bool = True) -> None:
        """Into this process's top K; `share`: also offer its step time to the other workers (once per plan)."""
        item = (-cand.step_time_s, next(self.tie), cand)
        if len(self.top) < self.top_k:
            heapq.heappush(self.top, item)
        elif cand.step_time_s < self.own_kth():
            heapq.heapreplace(self.top, item)
        if share and self.shared_top is not None:
            self.shared_top.offer(cand.step_time_s)

    def note_nonfit(self, lay: Layout, order, step: float, peak: float, exact: bool) -> None:
        self.add_nonfit(NonFit(lay, order, step, peak, exact))

    def add_nonfit(self, nf: NonFit) -> None:
        self.nonfit.append(nf)
        if len(self.nonfit) > 64:
            self.nonfit.sort(key=lambda n: n.step_time_s)
            del self.nonfit[16:]

    # -- searching on worker processes (workers.py) ------------------------------------
    def findings(self) -> dict[str, Any]:
        """What a worker found, for the parent to absorb."""
        counts = (self.size, self.n_exact, self.n_sim, self.n_dom, self.n_bounded, self.n_stopped)
        return {"rejections": self.rejections, "top": [c for _, _, c in self.top], "nonfit": self.nonfit,
                "scored": self.scored, "counts": counts}

    def absorb(self, found: dict[str, Any]) -> None:
        for reason, n in found["rejections"].items():
            self.reject(reason, n)
        for cand in found["top"]:
            self.keep(cand, share=False)  # the worker offered it already: twice would count it twice
        for nf in found["nonfit"]:
            self.add_nonfit(nf)
        self.scored += found["scored"]
        size, n_exact, n_sim, n_dom, n_bounded, n_stopped = found["counts"]
        self.size += size
        self.n_stopped += n_stopped
        self.n_exact += n_exact
        self.n_sim += n_sim
        self.n_dom += n_dom
        self.n_bounded += n_bounded

    # -- counting leaves -----------------------------------------------------------------
    def schedule_leaves(self, pp: int) -> int:
        return len(self.space.schedule_options(pp)) * len(self.space.split_options(pp))

    def class_variants(self, tp: int) -> int:
        return len(self.space.compile_options()) * len(self.space.async_options(tp))

    def knob_leaves(self, m: Mesh) -> int:
        """Leaves under one (mesh, order, micro-batch)."""
        s = self.space
        return (len(s.sp_options(m.tp)) * len(s.ac_options()) * len(s.float8_options())
                * len(s.reshard_options(m)) * self.schedule_leaves(m.pp) * self.class_variants(m.tp))

    # -- layouts -------------------------------------------------------------------------
    def layout(self, m: Mesh, mb: int, sp: bool, ac: str, sac: Any, f8: bool, reshard: bool) -> Layout:
        proto = self._mesh_layouts.get(m)
        if proto is None:
            s = self.space
            proto = self._mesh_layouts[m] = runtime_paths(Layout(
                spec=self.spec, gpus=s.plan.gpus, seq_len=s.seq_len, global_batch=s.global_batch, micro_batch=1,
                dtype=s.dtype, dp_replicate=m.dp_replicate, dp_shard=m.dp_shard, tp=m.tp, sp=False,
                async_tp=max(s.async_options(m.tp)), pp=m.pp, schedule="1F1B", v=1,
                stage_layers=even_split(self.spec.n_layers, m.pp), cp=m.cp, ac="none", sac_ops=None, float8=False,
                reshard_after_forward=True, compile=max(s.compile_options())), self.prof)
        return proto.with_(micro_batch=mb, sp=sp and m.tp > 1, ac=ac, sac_ops=sac if isinstance(sac, tuple) else None,
                           float8=f8, reshard_after_forward=reshard)

    def static_memory_gib(self, m: Mesh) -> float:
        """Model states alone (fp32 params + AdamW moments; gradients need not exist at the peak, see
        memory.py) on the most loaded rank: a bound below any peak."""
        params = self.spec.num_params() / (m.tp * m.pp)
        return (STATE_BYTES["params"] + STATE_BYTES["optimizer"]) * params / (m.dp_shard * m.cp) / GIB

    # -- the search ----------------------------------------------------------------------
    def run(self, jobs: int = 1) -> None:
        meshes = self.space.meshes()
        if not search_on_workers(self, meshes, jobs):
            self.search_meshes(meshes)

    def search_meshes(self, meshes: list[Mesh]) -> None:
        self.drain(self.mesh_queue(meshes))

    def mesh_queue(self, meshes: list[Mesh]) -> list[tuple[float, int, str, Any]]:
        """Count the space, reject whole meshes, and bound the rest: the nodes the search starts from."""
        s = self.space
        mbs = s.micro_batches()
        queue: list[tuple[float, int, str, Any]] = []
        for m in meshes:
            per_mb = self.knob_leaves(m)
            orders = self.orders(m)
            leaves = per_mb * len(mbs) * len(orders)
            self.size += leaves
            reason = mesh_reason(self.spec, self.prof, s.seq_len, m.tp, m.cp)
            if reason is None and m.pp > self.spec.n_layers:
                reason = PP_LAYERS
            if reason:
                self.reject(reason, leaves)
                continue
            if self.static_memory_gib(m) > self.usable:
                self.reject(NO_FIT, leaves)
                continue
            for mb in mbs:
                if batch_reason(s.global_batch, m.dp, mb):
                    self.reject(BATCH, per_mb * len(orders))
                    continue
                for order, _ in orders:
                    node = self.mesh_node(m, mb, order, per_mb)
                    if node is not None:
                        queue.append((node[0], next(self.tie), "mesh", node[1:]))
        return queue

    def drain(self, queue: list[tuple[float, int, str, Any]]) -> None:
        """One best-first queue of mesh nodes, knob classes and leaves awaiting simulation, by time bound."""
        heapq.heapify(queue)
        while queue:
            bound, _, kind, item = heapq.heappop(queue)
            if bound >= self.kth():
                self.n_bounded += sum(self.leaves_of(k, x) for _, _, k, x in [(bound, 0, kind, item)] + queue)
                break
            if kind == "mesh":
                for c in self.classes(*item[:3]):
                    heapq.heappush(queue, (c.bound, c.tie, "class", c))
            elif kind == "class":
                if not self.class_fits(item):
                    continue
                for leaf_bound, leaf_kind, leaf in self.expand(item):
                    heapq.heappush(queue, (leaf_bound, next(self.tie), leaf_kind, leaf))
            elif kind == "groups":
                for leaf_bound, leaf_kind, leaf in self.open_group(item):
                    heapq.heappush(queue, (leaf_bound, next(self.tie), leaf_kind, leaf))
            elif kind == "pending":
                leaf_bound, *leaf = self.refine(*item)
                if leaf_bound >= self.kth():
                    self.n_bounded += 1
                else:
                    heapq.heappush(queue, (leaf_bound, next(self.tie), "leaf", tuple(leaf)))
            else:
                self.score(*item)

    def leaves_of(self, kind: str, item: Any) -> int:
        if kind == "mesh":
            return item[3]
        if kind == "groups":
            return item.remaining()
        return item.leaves if kind == "class" else 1

    def mesh_node(self, m: Mesh, mb: int, order, leaves: int):
        """(time bound, mesh, mb, order, leaves) over every knob setting, or None if nothing can fit.

        Memory: the smallest-memory knobs (full AC, SP, float8, reshard) bound every class below.
        Time: the fastest knobs (no AC, no reshard, either SP and float8 choice) bound them."""
        s = self.space
        sps = [x for x in s.sp_options(m.tp) if not sp_reason(s.seq_len, m.tp, m.cp, x)]
        if not sps:
            self.reject(SP_SEQ, leaves)
            return None
        acs = [a for a, _ in s.ac_options()]
        small_ac = "full" if "full" in acs else "selective" if "selective" in acs else "none"
        small = self.layout(m, mb, max(sps), small_ac, () if small_ac == "selective" else None,
                            max(s.float8_options()), max(s.reshard_options(m)))
        mem = self.rank_memory_bound_gib(small)
        if mem > self.usable:
            self.reject(NO_FIT, leaves)
            self.note_nonfit(small, order, self.class_time_bound(small, order), mem, exact=False)
            return None
        fast_ac = "none" if "none" in acs else "selective" if "selective" in acs else "full"
        bound = min(self.class_time_bound(self.layout(m, mb, sp, fast_ac, tuple(SAC_OPS) if fast_ac == "selective" else None,
                                                      f8, min(s.reshard_options(m))), order)
                    for sp in sps for f8 in s.float8_options())
        return bound, m, mb, order, leaves

    def orders(self, m: Mesh) -> list[tuple[tuple[str, ...], dict]]:
        probe = self.layout(m, 1, False, "none", None, False, True)
        return distinct_orders(probe, self.prof)

    def classes(self, m: Mesh, mb: int, order) -> list[_Class]:
        s = self.space
        n_sched = self.schedule_leaves(m.pp)
        variants = self.class_variants(m.tp)
        out = []
        for sp in s.sp_options(m.tp):
            per_sp = len(s.ac_options()) * len(s.float8_options()) * len(s.reshard_options(m)) * n_sched * variants
            if sp_reason(s.seq_len, m.tp, m.cp, sp):
                self.reject(SP_SEQ, per_sp)
                continue
            for (ac, sac), f8, reshard in itertools.product(s.ac_options(), s.float8_options(), s.reshard_options(m)):
                lay = self.layout(m, mb, sp, ac, sac, f8, reshard)
                self.n_dom += n_sched * variants - n_sched
                # For the SAC ILP class, the fastest member saves everything, the smallest saves nothing.
                fast = lay.with_(sac_ops=tuple(SAC_OPS)) if sac == SAC_ILP else lay
                bound = self.class_time_bound(fast, order)
                if bound >= self.kth():  # the K-th best only improves: this class will never be expanded
                    self.n_bounded += n_sched
                    continue
                out.append(_Class(bound, next(self.tie), lay, order, sac, n_sched))
        return out

    def class_fits(self, c: _Class) -> bool:
        """The memory bound, checked when the class comes up (most classes never do)."""
        small = c.layout.with_(sac_ops=()) if c.sac == SAC_ILP else c.layout
        mem = self.rank_memory_bound_gib(small)
        if mem <= self.usable:
            return True
        self.reject(NO_FIT, c.leaves)
        fast = c.layout.with_(sac_ops=tuple(SAC_OPS)) if c.sac == SAC_ILP else c.layout
        self.note_nonfit(fast, c.order, c.bound, mem, exact=False)
        return False

    def class_time_bound(self, lay: Layout, order) -> float:
        """The average pipeline rank's work plus the per-step overhead: no schedule or split does better."""
        if lay.pp == 1:
            return self.flat_step(lay, order)[1]
        per_layer, head_emb = self.per_layer_times(lay, order)
        total = lay.n_micro * (lay.spec.n_layers * per_layer + head_emb)
        return total / lay.pp + self.prof.overheads.step_overhead_s

    def flat_step(self, lay: Layout, order) -> tuple[StepParts, float]:
        """A layout without pipeline: its parts and exact step time (its class bound and its score)."""
        key = (lay, order)
        got = self._flat_steps.get(key)
        if got is None:
            parts = step_parts(lay, self.prof, order)
            got = self._flat_steps[key] = (parts, compose_step(lay, self.prof, parts, parts.busy[0])[0])
        return got

    def per_layer_times(self, lay: Layout, order) -> tuple[float, float]:
        """(one layer's F+B+W, embedding + head F+B) per micro-batch: the work any split distributes."""
        key = block_key(lay, group_spans(lay, self.prof, order))
        got = self._layer_cache.get(key)
        if got is None:
            got = self._layer_cache[key] = self._per_layer_times(lay, order)
        return got

    def _per_layer_times(self, lay: Layout, order) -> tuple[float, float]:
        a_f, a_bw, emb, head, _ = self.linear_costs(lay, stage_inputs(lay, self.prof, order))
        return a_f + a_bw, emb + head

    def rank_memory_bound_gib(self, lay: Layout) -> float:
        """Below the peak of any stage split: the lightest of the first, second and last pipeline ranks
        of the even split with one micro-batch in flight (memory is about linear in a rank's layers,
        so the average rank of any split weighs at least the lightest rank of the even one).
        Stops at the first rank under the usable memory: the bound then fits, whatever the rest say."""
        lightest = float("inf")
        for r in dict.fromkeys((min(1, lay.pp - 1), lay.pp - 1, 0)):  # middle ranks are usually lightest
            lightest = min(lightest, rank_memory(lay, r, 1.0, self.prof.overheads).total / GIB)
            if lightest <= self.usable:
                break
        return lightest

    # -- expanding a class into its leaves -----------------------------------------------
    def expand(self, c: _Class) -> list[tuple[float, str, tuple]]:
        """Score a pipeline-free class at once. A pipelined class yields its valid leaves as pending
        items bounded by the schedule's makespan bound on the class's fastest durations; a leaf's own
        SAC choice, durations and step are worked out only if it is popped (`refine`)."""
        base = c.layout
        if base.pp == 1:
            self.score(self.with_sac(base, c.order, c.sac), c.order, None, c.sac == SAC_ILP)
            return []
        s = self.space
        # For the SAC ILP class the save-everything member is the fastest: its bound holds for the class.
        fast = base.with_(sac_ops=tuple(SAC_OPS)) if c.sac == SAC_ILP else base
        ref = stage_inputs(fast, self.prof, c.order)  # spans, block time, head and embedding: split-free
        a_f, a_bw, emb, head, p2p = self.linear_costs(fast, ref)
        per_layer = self.per_layer_times(base, c.order)[0]  # the class's own layers balance the split
        m = base.n_micro
        # A hair under the exact bound, so float rounding in the linear form never prunes a leaf too early.
        x = np.array([a_f, a_bw, m * (a_f + a_bw), m * emb, m * head, emb, p2p]) * (1 - 1e-12)
        overhead = self.prof.overheads.step_overhead_s
        groups = []
        by_v: dict[int, list[str]] = {}
        for sched, v in s.schedule_options(base.pp):
            by_v.setdefault(v, []).append(sched)
        for v, scheds in by_v.items():
            seen_splits: set = set()
            for split in s.split_options(base.pp):
                reason = self.split_reason(base.pp, scheds[0], v, split)
                if reason in (PP_LAYERS, SPLIT):
                    self.reject(reason, len(scheds))
                    continue
                layers = self.stage_layers(base.pp * v, split, per_layer, emb, head)
                if layers in seen_splits:
                    self.n_dom += len(scheds)  # the balanced split came out even: the same leaves, scored once
                    continue
                seen_splits.add(layers)
                valid_by_kind, rejected, rows = self.leaf_table(base.pp, v, scheds, layers, m, base.ac)
                for reason, n in rejected.items():
                    self.reject(reason, n)
                if not valid_by_kind:
                    continue
                # Durations depend on v, the split and the saved op kinds, not on the schedule: one
                # product bounds every schedule kind of this split.
                bounds = (rows @ x).reshape(len(valid_by_kind), base.pp).max(axis=1).tolist()
                for quick, kind_scheds in zip(bounds, valid_by_kind):
                    if quick + overhead >= self.kth():
                        self.n_bounded += len(kind_scheds)
                    else:
                        groups.append((quick + overhead, v, layers, kind_scheds))
        if not groups:
            return []
        groups.sort(key=lambda g: g[0])
        return [(groups[0][0], "groups", _LeafGroups(c, fast, ref, groups))]

    def open_group(self, lg: _LeafGroups) -> list[tuple[float, str, tuple]]:
        """The next group's leaves as pending items, and the class again with the group after it."""
        bound, v, layers, scheds = lg.groups[lg.next]
        lg.next += 1
        quick = bound - self.prof.overheads.step_overhead_s
        out = [(bound, "pending", (lg.cls, lg.fast, lg.ref, sched, v, layers, quick)) for sched in scheds]
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

    def refine(self, c: _Class, fast: Layout, ref: tuple, sched: str, v: int, layers: tuple[int, ...],
               quick: float) -> tuple[float, Layout, tuple, StepParts | None, bool]:
        """A pending leaf made exact but for the schedule simulation: (step bound, layout, order, parts,
        whether score still chooses its SAC subset)."""
        base = c.layout
        lay = base.with_(schedule=sched, v=v, stage_layers=layers)
        guess, lay = self.with_sac(lay, c.order, c.sac), self.with_sac(lay, c.order, c.sac, optimistic=True)
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

    def linear_costs(self, lay: Layout, ref: tuple) -> tuple[float, float, float, float, float]:
        """(a_f, a_bw, emb, head, p2p) of linear_bound_rows, read off stage_durations on three stages:
        a layer's forward and backward + weight per micro-batch, the embedding's forward, the head's
        forward + backward and the stage-to-stage send."""
        probe = lay.with_(pp=3, v=1)

        def durations(layers: tuple[int, ...]) -> StageDurations:
            return stage_durations(probe.with_(stage_layers=layers), self.prof, *ref)

        ends, mid = durations((0, 0, 0)), durations((0, 1, 0))
        return (mid.forward[1], mid.backward[1] + mid.weight[1], ends.forward[0], ends.forward[2] + ends.backward[2],
                ends.p2p)

    def split_reason(self, pp: int, sched: str, v: int, split: Any) -> str | None:
        key = ("split", pp, sched, v, split)
        if key not in self._leaf_tables:
            self._leaf_tables[key] = schedule_reason(self.spec.n_layers, pp, sched, v,
                                                     list(split) if isinstance(split, tuple) else None)
        return self._leaf_tables[key]

    def stage_layers(self, n_stages: int, split: Any, per_layer: float, emb: float, head: float) -> tuple[int, ...]:
        """The layers per stage of a split option: `per_layer`, `emb` and `head` are the work of a layer
        and of the ends (the embedding, the head with the loss) that a balanced split evens out."""
        if isinstance(split, tuple):
            return split
        if split == EVEN:
            return even_split(self.spec.n_layers, n_stages)
        # The balanced split depends only on the stage count and the ends' extra work in layers.
        key = (n_stages, round(emb / per_layer, 3), round(head / per_layer, 3))
        out = self._split_cache.get(key)
        if out is None:
            extras = [emb] + [0.0] * (n_stages - 2) + [head]
            out = self._split_cache[key] = balanced_split(self.spec.n_layers, extras, per_layer)
        return out

    def score(self, lay: Layout, order, parts: StepParts | None = None, sac_ilp: bool = False) -> None:
        got = self.fitting_sac(lay, order) if sac_ilp else self.evaluate(lay, order, parts)
        if got is None:
            self.reject(MICROBATCHES, 1)
            return
        if got is TOO_BIG:
            self.reject(NO_FIT, 1)
            return
        if got is BOUNDED_LEAF:
            self.n_bounded += 1
            return
        lay, step, peak, _ = got
        cand = Candidate(lay, order, step, peak)
        self.scored.append(cand)
        if peak > self.usable:
            self.rejections[NO_FIT] += 1
            self.note_nonfit(lay, order, step, peak, exact=True)
            return
        self.n_exact += 1
        self.keep(cand)

    def evaluate(self, lay: Layout, order, parts: StepParts | None = None) -> tuple | None:
        """(layout, step time, peak GiB, in flight per rank) with the schedule simulated; None if the
        schedule cannot run, TOO_BIG if a rank's activations in flight pass what fits."""
        if lay.pp == 1:
            return lay, self.flat_step(lay, order)[1], self.peak_memory_gib(lay, (1.0,)), (1.0,)
        parts = parts or step_parts(lay, self.prof, order)
        try:
            got = self.simulate_scaled(lay, parts.durations, self.held_limits(lay))
        except RuntimeError:
            return None
        if got is None:
            return TOO_BIG
        makespan, in_flight = got
        return lay, compose_step(lay, self.prof, parts, makespan)[0], self.peak_memory_gib(lay, in_flight), in_flight

    def fitting_sac(self, lay: Layout, order) -> tuple | None:
        """The SAC ILP's answer made exact: the least-recompute Pareto subset whose simulated peak fits
        on every rank. The guess (`lay.sac_ops`) is simulated first; its activations in flight (set by
        the schedule, hardly by the durations) price the other subsets, and the one that looks best is
        simulated to confirm, walking on to smaller subsets while the simulated peak still misses."""
        subsets = self.pareto(self.sac_items(lay, order))
        tried: dict[int, tuple | None] = {}

        def at(j: int):
            if j not in tried:
                tried[j] = self.evaluate(lay.with_(sac_ops=subsets[j]), order)
            return tried[j]

        i = subsets.index(lay.sac_ops) if lay.sac_ops in subsets else len(subsets) - 1
        guess = at(i)
        if guess is None:
            return None
        if guess is TOO_BIG or guess[2] > self.usable:
            # Walk on toward smaller subsets one simulation at a time. (Whether the guess's simulation ran
            # to the end or stopped at the memory limit depends on what was cached before; the walk must not.)
            j = i + 1
        else:
            in_flight = guess[3]

            def looks_fitting(j: int) -> bool:
                return self.peak_memory_gib(lay.with_(sac_ops=subsets[j]), in_flight) <= self.usable

            j = i
            while j > 0 and looks_fitting(j - 1):
                j -= 1
        for k in range(j, len(subsets)):
            if k not in tried:
                sub = lay.with_(sac_ops=subsets[k])
                parts = self.flat_step(sub, order)[0] if sub.pp == 1 else step_parts(sub, self.prof, order)
                if self.leaf_bound(sub, parts) >= self.kth():
                    # Later subsets recompute more, so they are no faster: whichever fits cannot enter the top K.
                    return BOUNDED_LEAF
                tried[k] = self.evaluate(sub, order, parts)
            got = tried[k]
            if got is not None and got is not TOO_BIG and got[2] <= self.usable:
                return got
        return guess  # nothing fits: the guess, counted as not fitting

    def leaf_bound(self, lay: Layout, parts: StepParts) -> float:
        """The leaf's step with its schedule's makespan lower bound: no simulation of it does better."""
        d = parts.durations
        makespan = makespan_lower_bound(lay.schedule, lay.pp, lay.v, lay.n_micro, d.forward, d.backward, d.weight,
                                        d.p2p)
        return compose_step(lay, self.prof, parts, makespan)[0]

    def peak_memory_gib(self, lay: Layout, in_flight: tuple[float, ...]) -> float:
        """The highest rank peak. Ranks holding the same layers and ends differ only in activations in
        flight, and a rank's peak grows with those: one rank per such group is enough."""
        heaviest = [max(ranks, key=lambda r: in_flight[r]) for ranks in self.rank_groups(lay)]
        return max(rank_memory(lay, r, in_flight[r], self.prof.overheads).total for r in heaviest) / GIB

    def rank_groups(self, lay: Layout) -> list[list[int]]:
        """Pipeline ranks grouped by the layers and ends they hold (the same for every layout alike)."""
        key = (lay.pp, lay.schedule, lay.stage_layers, lay.tp)
        got = self._rank_groups.get(key)
        if got is None:
            groups: dict[tuple, list[int]] = {}
            for r in range(lay.pp):
                sp = stage_params(lay, r)
                groups.setdefault((sp.layers, sp.embedding, sp.head), []).append(r)
            got = self._rank_groups[key] = list(groups.values())
        return got

    def simulate_scaled(self, lay: Layout, d, held_limit: tuple[float, ...]) -> tuple[float, tuple[float, ...]] | None:
        """The schedule simulation on durations in units of the first stage's forward, rounded to
        1%: leaves of neighbouring classes differ mostly by a scale, so one simulation serves many.
        The top K are re-simulated exactly (estimate_layout) before they are ranked and written.
        None if a rank would hold more activations than `held_limit` allows (the simulation stops there)."""
        unit = d.forward[0] or max(d.forward) or 1.0

        def norm(xs):
            return tuple(round(x / unit, 2) for x in xs)

        key = (lay.schedule, lay.pp, lay.v, lay.n_micro, norm(d.forward), norm(d.backward), norm(d.weight),
               round(d.p2p / unit, 2))
        got = self._sim_cache.get(key)
        if got is None:
            over = self._sim_over.get(key)  # limits a stopped simulation of these durations passed
            if over is not None and all(a >= b for a, b in zip(over, held_limit)):
                return None
            f, b, w = ([x * unit for x in key[i]] for i in (4, 5, 6))
            makespan, _, in_flight, exceeded = simulate_cached(lay.schedule, lay.pp, lay.v, lay.n_micro, tuple(f),
                                                               tuple(b), tuple(w), key[7] * unit, held_limit)
            self.n_sim += 1
            if exceeded:
                self.n_stopped += 1
                self._sim_over[key] = held_limit
                return None
            got = self._sim_cache[key] = (makespan / unit, in_flight)
        return got[0] * unit, got[1]

    def held_limits(self, lay: Layout) -> tuple[float, ...]:
        """Per pipeline rank, the most activation sets it can hold and still fit (inf: any number). Memory
        grows with what a rank holds, so a bisection over whole sets finds it; -1 if even none fits."""
        cap = lay.n_micro * lay.v  # no rank holds more than all its (stage, micro-batch) pairs
        limits = [0.0] * lay.pp
        for ranks in self.rank_groups(lay):
            r = ranks[0]

            def fits(h: int) -> bool:
                return rank_memory(lay, r, float(h), self.prof.overheads).total / GIB <= self.usable

            if fits(cap):
                limit = float("inf")
            elif not fits(0):
                limit = -1.0
            else:
                lo, hi = 0, cap  # fits(lo), not fits(hi)
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
                limit = float(lo)
            for rank in ranks:
                limits[rank] = limit
        return tuple(limits)

    # -- selective activation checkpointing: the SAC ILP ---------------------------------
    def with_sac(self, lay: Layout, order, sac: Any, optimistic: bool = False) -> Layout:
        """Resolve the SAC ILP choice for this leaf: see _choose_sac."""
        if sac != SAC_ILP:
            return lay
        key = (lay, order, optimistic)
        chosen = self._sac_choice.get(key)
        if chosen is None:
            chosen = self._sac_choice[key] = self._choose_sac(lay, order, optimistic)
        return lay.with_(sac_ops=chosen)

    def _choose_sac(self, lay: Layout, order, optimistic: bool) -> tuple[str, ...]:
        """The least-recompute Pareto subset of the SAC ILP whose peak fits on every pipeline rank, each
        rank holding its schedule's in-flight limit: the guess score starts from, walking on against
        the simulated peak. `optimistic`: one micro-batch in flight per rank, no fewer than any
        simulation holds, so no subset faster than this one can fit (what a rigorous bound needs)."""
        if optimistic or lay.pp == 1:
            held = (1.0,) * lay.pp
        else:
            held = tuple(float(in_flight_limit(lay.schedule, lay.pp, lay.v, r, lay.n_micro)) for r in range(lay.pp))
        subsets = self.pareto(self.sac_items(lay, order))
        # Along the Pareto list bytes saved only fall, so memory does too: bisect for the first that fits.
        lo, hi = 0, len(subsets) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.peak_memory_gib(lay.with_(sac_ops=subsets[mid]), held) <= self.usable:
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
        from meshplan.cost_models.activations import activation_bytes_per_token

        spans = group_spans(lay, self.prof, order)
        key = (lay.micro_batch, lay.cp, lay.tp, lay.sp, lay.float8, lay.compile, spans["tp"], spans["cp"])
        items = self._sac_cache.get(key)
        if items is not None:
            return items
        ref = lay.with_(ac="selective")

        def act(sub: tuple[str, ...]) -> float:
            return activation_bytes_per_token(lay.spec, lay.seq_len, lay.tp, lay.sp, "selective", sub, lay.act_bytes)

        def recompute(sub: tuple[str, ...]) -> float:
            return step_parts(ref.with_(sac_ops=sub), self.prof, order).bt.recompute

        base = act(())
        b = {k: act((k,)) - base for k in SAC_OPS}
        r_all = recompute(())
        r_one = {k: recompute(tuple(x for x in SAC_OPS if x != k)) for k in SAC_OPS}
        active = [k for k in SAC_OPS if r_one[k] > 0]
        e = (sum(r_one[k] for k in active) - r_all) / (len(active) - 1) if len(active) > 1 else 0.0
        t = {k: (r_one[k] - e if k in active else 0.0) for k in SAC_OPS}
        items = self._sac_cache[key] = SacItems(SAC_OPS, b, base, t, e)
        return items


def search(plan: Plan, profile: ClusterProfile, top_k: int = 10, excludes: dict[str, list] | None = None,
           jobs: int | None = None) -> SearchResult:
    """Search every auto field of `plan` (the rest fixed); the best top_k plans that fit.
    jobs: processes to search on (default: the CPUs available, up to DEFAULT_MAX_JOBS)."""
    t0 = time.perf_counter()
    space = Space.from_plan(plan, profile, excludes)
    s = _Search(space, profile, top_k)
    s.run(default_jobs() if jobs is None else jobs)
    ranked = [c for _, _, c in sorted(s.top, key=lambda x: -x[0])]
    for cand in ranked:
        # The exact estimate (exact schedule simulation) replaces the screening figures.
        cand.estimate = estimate_layout(cand.layout, profile, cand.order)
        cand.step_time_s, cand.peak_memory_gib = cand.estimate.step_time_s, cand.estimate.peak_memory_gib
        cand.placement = placement_for(cand.layout, cand.order, profile)
    ranked = [c for c in ranked if c.estimate.fits]
    ranked.sort(key=lambda c: (c.estimate.step_time_s, c.estimate.peak_memory_gib))
    nonfit = sorted(s.nonfit, key=lambda n: n.step_time_s)[:5]
    result = SearchResult(ranked, s.size, s.rejections, s.n_exact, s.n_sim, s.n_dom, s.n_bounded, nonfit,
                          s.usable, time.perf_counter() - t0, list(space.assumptions), [], space.plan,
                          scored=s.scored, profile=profile, n_stopped=s.n_stopped)
    if ranked and ranked[0].layout.ac == "selective" and isinstance(ranked[0].layout.sac_ops, tuple):
        result.sac_ilp_check = _check_sac_with_pulp(s, ranked[0])
    return result


def _check_sac_with_pulp(s: _Search, best: Candidate) -> str:
    """Re-solve the winner's SAC choice with pulp's ILP solver: it must agree with the enumeration."""
    lay = best.layout
    items = s.sac_items(lay, best.order)
    budget = items.bytes_of(lay.sac_ops)
    chosen = solve_sac_ilp(items, budget)
    if chosen is None:
        return "pulp: infeasible"
    same = abs(items.time_of(chosen) - items.time_of(lay.sac_ops)) <= 1e-12 * max(1.0, items.time_of(lay.sac_ops))
    return f"pulp ILP {'agrees' if same else 'DISAGREES'}: saves {', '.join(chosen) or 'nothing'}"
