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

The pieces, one module each: enumeration.py (layouts and leaf counts), pruning.py (meshes and
classes rejected or bounded whole) with bounds.py (the cost-model bounds), leaves.py (a class
expanded into bounded leaf groups), scoring.py (a leaf simulated and scored exactly) with
peaks.py (per-rank peak memory) and sac_choice.py (the SAC ILP), pool.py (the K best and the
tally), workers.py (the same search on several processes). This module drives them best-first.
"""

from __future__ import annotations

import heapq
import time
from typing import Any

from meshplan.cost_models.estimate import estimate_layout
from meshplan.planner.bounds import Bounds
from meshplan.planner.collector import collections_held_back
from meshplan.planner.constraints import BATCH, batch_reason
from meshplan.planner.enumeration import Enumeration
from meshplan.planner.leaves import Leaves
from meshplan.planner.peaks import Peaks
from meshplan.planner.placement import placement_for
from meshplan.planner.pool import Pool
from meshplan.planner.pruning import Pruning
from meshplan.planner.results import Candidate, NonFit, SearchResult
from meshplan.planner.sac_choice import SacChoice
from meshplan.planner.scoring import Scoring
from meshplan.planner.space import Mesh, Space
from meshplan.planner.workers import default_jobs, search_on_workers
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import Plan

__all__ = ["Candidate", "NonFit", "SearchResult", "search"]

Node = tuple[float, int, str, Any]  # (time bound, tie, kind: mesh | class | groups | pending | leaf, item)


class _Search:
    """One search's pieces wired together, and the best-first queue that drives them."""

    def __init__(self, space: Space, prof: ClusterProfile, top_k: int):
        self.space, self.prof, self.top_k = space, prof, top_k
        self.usable = usable = prof.device.usable_memory_gib
        self.pool = Pool(top_k)
        self.enum = Enumeration(space, prof)
        self.bounds = Bounds(space.plan.model, prof, usable)
        self.peaks = Peaks(prof, usable)
        self.sac = SacChoice(prof, usable, self.peaks)
        self.scoring = Scoring(prof, usable, self.pool, self.bounds, self.peaks, self.sac)
        self.pruning = Pruning(space, prof, usable, self.pool, self.enum, self.bounds)
        self.leaves = Leaves(space, prof, self.pool, self.bounds, self.sac, self.scoring)

    def run(self, jobs: int = 1) -> None:
        meshes = self.space.meshes()
        if not search_on_workers(self, meshes, jobs):
            self.search_meshes(meshes)

    def search_meshes(self, meshes: list[Mesh]) -> None:
        self.drain(self.mesh_queue(meshes))

    def mesh_queue(self, meshes: list[Mesh]) -> list[Node]:
        """Count the space, reject whole meshes, and bound the rest: the nodes the search starts from."""
        s, pool = self.space, self.pool
        mbs = s.micro_batches()
        queue: list[Node] = []
        for m in meshes:
            per_mb = self.enum.knob_leaves(m)
            orders = self.enum.orders(m)
            leaves = per_mb * len(mbs) * len(orders)
            pool.size += leaves
            reason = self.pruning.mesh_reason(m)
            if reason:
                pool.reject(reason, leaves)
                continue
            for mb in mbs:
                if batch_reason(s.global_batch, m.dp, mb):
                    pool.reject(BATCH, per_mb * len(orders))
                    continue
                for order, _ in orders:
                    node = self.pruning.mesh_node(m, mb, order, per_mb)
                    if node is not None:
                        queue.append((node[0], next(pool.tie), "mesh", node[1:]))
        return queue

    def drain(self, queue: list[Node]) -> None:
        """One best-first queue of mesh nodes, knob classes and leaves awaiting simulation, by time bound."""
        pool = self.pool
        heapq.heapify(queue)
        while queue:
            bound, _, kind, item = heapq.heappop(queue)
            if bound >= pool.kth():
                pool.n_bounded += sum(leaves_of(k, x) for _, _, k, x in [(bound, 0, kind, item)] + queue)
                break
            for node in self.open(kind, item):
                heapq.heappush(queue, node)

    def open(self, kind: str, item: Any) -> list[Node]:
        """What a popped node opens into: classes, leaf groups, pending leaves or a leaf; a leaf is scored."""
        pool = self.pool
        if kind == "mesh":
            return [(c.bound, c.tie, "class", c) for c in self.pruning.classes(*item[:3])]
        if kind == "class":
            if not self.pruning.class_fits(item):
                return []
            return [(b, next(pool.tie), k, x) for b, k, x in self.leaves.expand(item)]
        if kind == "groups":
            return [(b, next(pool.tie), k, x) for b, k, x in self.leaves.open_group(item)]
        if kind == "pending":
            leaf_bound, *leaf = self.leaves.refine(*item)
            if leaf_bound >= pool.kth():
                pool.n_bounded += 1
                return []
            return [(leaf_bound, next(pool.tie), "leaf", tuple(leaf))]
        self.scoring.score(*item)
        return []


def leaves_of(kind: str, item: Any) -> int:
    """How many leaves a queued node stands for."""
    if kind == "mesh":
        return item[3]
    if kind == "groups":
        return item.remaining()
    return item.leaves if kind == "class" else 1


def search(plan: Plan, profile: ClusterProfile, top_k: int = 10, excludes: dict[str, list] | None = None,
           jobs: int | None = None) -> SearchResult:
    """Search every auto field of `plan` (the rest fixed); the best top_k plans that fit.
    jobs: processes to search on (default: the CPUs available, up to DEFAULT_MAX_JOBS)."""
    t0 = time.perf_counter()
    space = Space.from_plan(plan, profile, excludes)
    s = _Search(space, profile, top_k)
    with collections_held_back():
        s.run(default_jobs() if jobs is None else jobs)
    ranked = s.pool.ranked()
    for cand in ranked:
        # The exact estimate (exact schedule simulation) replaces the screening figures.
        cand.estimate = estimate_layout(cand.layout, profile, cand.order)
        cand.step_time_s, cand.peak_memory_gib = cand.estimate.step_time_s, cand.estimate.peak_memory_gib
        cand.placement = placement_for(cand.layout, cand.order, profile)
    ranked = [c for c in ranked if c.estimate.fits]
    ranked.sort(key=lambda c: (c.estimate.step_time_s, c.estimate.peak_memory_gib))
    p = s.pool
    nonfit = sorted(p.nonfit, key=lambda n: n.step_time_s)[:5]
    result = SearchResult(ranked, p.size, p.rejections, p.n_exact, p.n_sim, p.n_dom, p.n_bounded, nonfit,
                          s.usable, time.perf_counter() - t0, list(space.assumptions), [], space.plan,
                          scored=p.scored, profile=profile, n_stopped=p.n_stopped,
                          n_resimulated=p.n_resimulated)
    if ranked and ranked[0].layout.ac == "selective" and isinstance(ranked[0].layout.sac_ops, tuple):
        result.sac_ilp_check = s.sac.check_with_pulp(ranked[0])
    return result
