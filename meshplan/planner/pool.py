"""The K-best pool and the tally of every leaf: what the search keeps, what it prunes against.

The pool holds the K fastest fitting plans scored so far (a heap), the best that did not fit, every
exactly scored leaf, and the counts by which each leaf of the space ends: rejected (by reason),
scored exactly, dominated or pruned by a bound. Its K-th best step time is what every bound must
beat; with worker processes it also reads and feeds the workers' shared K best (workers.py).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from meshplan.cost_models.layout import Layout
from meshplan.planner.constraints import REASONS
from meshplan.planner.results import Candidate, NonFit

DOMINATED = "dominated (compile / async TP off: slower at equal memory)"
BOUNDED = "pruned: time bound >= K-th best"


class Pool:
    def __init__(self, top_k: int):
        self.top_k = top_k
        self.rejections = {r: 0 for r in REASONS}
        self.n_exact = self.n_sim = self.n_dom = self.n_bounded = self.size = self.n_stopped = 0
        self.n_resimulated = 0  # near-cut leaves simulated again on their own durations (scoring.py)
        self.top: list[tuple[float, int, Candidate]] = []  # max-heap by step via negation
        self.nonfit: list[NonFit] = []
        # Every exactly scored leaf, fitting or not (the candidates CSV); a leaf whose simulation stopped
        # at the memory limit has no step time and is only counted, as a no-fit rejection.
        self.scored: list[Candidate] = []
        # One tie-breaker for every heap of the search (the pool's and the search's queue), so equal
        # bounds pop in the order they were made.
        self.tie = itertools.count()
        self.shared_top = None  # with worker processes: the K best step times any of them has found

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

    def ranked(self) -> list[Candidate]:
        """The K best, fastest first."""
        return [c for _, _, c in sorted(self.top, key=lambda x: -x[0])]

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
        counts = (self.size, self.n_exact, self.n_sim, self.n_dom, self.n_bounded, self.n_stopped, self.n_resimulated)
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
        size, n_exact, n_sim, n_dom, n_bounded, n_stopped, n_resimulated = found["counts"]
        self.n_resimulated += n_resimulated
        self.size += size
        self.n_stopped += n_stopped
        self.n_exact += n_exact
        self.n_sim += n_sim
        self.n_dom += n_dom
        self.n_bounded += n_bounded
