"""Scoring a leaf exactly: its schedule simulated, its step time and peak memory, into the pool.

A leaf without pipeline is exact from the cost model alone. A pipelined leaf's schedule is
simulated on durations scaled to its first stage's forward and rounded (one simulation serves many
leaves of neighbouring classes), stopped as soon as a rank holds more than fits, and simulated
again on its own durations if that puts it near enough the K-th best to make the cut. An SAC ILP leaf's
subset is settled here against the simulated peak. Every leaf ends counted in the pool: scored
(fitting or not), rejected (no schedule, no fit) or bounded out.
"""

from __future__ import annotations

from meshplan.cost_models.estimate import StageDurations, StepParts, compose_step, step_parts
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import ONE_RANK_PHASES, weight_pass_share
from meshplan.cost_models.pipeline import simulate_cached
from meshplan.planner.bounds import Bounds
from meshplan.planner.constraints import NO_FIT
from meshplan.planner.peaks import Peaks
from meshplan.planner.pool import Pool
from meshplan.planner.results import Candidate
from meshplan.planner.sac_choice import SacChoice
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.rules import MICROBATCHES

# How far above the K-th best time a leaf's screening simulation may put it and still be simulated exactly
# before the pool takes or leaves it. Rounding every duration to 1 % of the first stage's forward moved the
# makespan by at most 0.54 % in every schedule but ZBVZeroBubble (0.99 %) and DualPipeV (1.39 %), over the
# 2,751 screening simulations of three searches (benchmarks/scaled_simulation_error.py, results/
# scaled_simulation_error.txt): about twice the largest, so a leaf whose exact time makes the cut is not
# left out on its screening.
RESIMULATE_WITHIN = 0.03
TOO_BIG = "too big"  # evaluate's answer when the simulation stopped: a rank held more than fits
BOUNDED_LEAF = "bounded"  # fitting_sac's answer when every subset still in question is bounded out


class Scoring:
    def __init__(self, prof: ClusterProfile, usable_gib: float, pool: Pool, bounds: Bounds, peaks: Peaks,
                 sac: SacChoice):
        self.prof, self.usable = prof, usable_gib
        self.pool, self.bounds, self.peaks, self.sac = pool, bounds, peaks, sac
        self._sim_cache: dict = {}
        self._sim_over: dict = {}

    def score(self, lay: Layout, order, parts: StepParts | None = None, sac_ilp: bool = False) -> None:
        pool = self.pool
        got = self.fitting_sac(lay, order) if sac_ilp else self.evaluate(lay, order, parts)
        if got is None:
            pool.reject(MICROBATCHES, 1)
            return
        if got is TOO_BIG:
            pool.reject(NO_FIT, 1)
            return
        if got is BOUNDED_LEAF:
            pool.n_bounded += 1
            return
        if got[0].pp > 1 and got[1] < pool.kth() * (1 + RESIMULATE_WITHIN):
            # Near enough the cut to make it: ranked by its exact schedule, so the top K hold exact times
            # alone, the K-th that every bound must beat is exact, and which leaves make the cut does
            # not hang on the order they were scored in (nor on which worker scored them).
            # The screening's step parts serve again where the layout is the one it was scored as.
            got = self.evaluate(got[0], order, parts if got[0] is lay else None, exact=True)
            if got is None or got is TOO_BIG:
                pool.reject(MICROBATCHES if got is None else NO_FIT, 1)
                return
        lay, step, peak, _ = got
        cand = Candidate(lay, order, step, peak)
        pool.scored.append(cand)
        if peak > self.usable:
            pool.rejections[NO_FIT] += 1
            pool.note_nonfit(lay, order, step, peak, exact=True)
            return
        pool.n_exact += 1
        pool.keep(cand)

    def evaluate(self, lay: Layout, order, parts: StepParts | None = None, exact: bool = False) -> tuple | None:
        """(layout, step time, peak GiB, memory phases per rank) with the schedule simulated, on durations
        rounded to 1 % (simulate_scaled) or, `exact`, as they are; None if the schedule cannot run, TOO_BIG
        if a rank's activations in flight pass what fits."""
        if lay.pp == 1:
            return lay, self.bounds.flat_step(lay, order)[1], self.peaks.peak_memory_gib(lay, ONE_RANK_PHASES), \
                ONE_RANK_PHASES
        parts = parts or step_parts(lay, self.prof, order)
        try:
            simulate = self.simulate_exact if exact else self.simulate_scaled
            got = simulate(lay, parts.durations, self.peaks.held_limits(lay))
        except RuntimeError:
            return None
        if got is None:
            return TOO_BIG
        makespan, phases = got
        step = compose_step(lay, self.prof, parts, makespan)[0]
        return lay, step, self.peaks.peak_memory_gib(lay, phases), phases

    def fitting_sac(self, lay: Layout, order) -> tuple | None:
        """The SAC ILP's answer made exact: the least-recompute Pareto subset whose simulated peak fits
        on every rank. The guess (`lay.sac_ops`) is simulated first; its activations in flight (set by
        the schedule, hardly by the durations) price the other subsets, and the one that looks best is
        simulated to confirm, walking on to smaller subsets while the simulated peak still misses."""
        subsets = self.sac.pareto(self.sac.sac_items(lay, order))
        tried: dict[int, tuple | None] = {}
        i = subsets.index(lay.sac_ops) if lay.sac_ops in subsets else len(subsets) - 1
        guess = tried[i] = self.evaluate(lay.with_(sac_ops=subsets[i]), order)
        if guess is None:
            return None
        if guess is TOO_BIG or guess[2] > self.usable:
            # Walk on toward smaller subsets one simulation at a time. (Whether the guess's simulation ran
            # to the end or stopped at the memory limit depends on what was cached before; the walk must not.)
            j = i + 1
        else:
            j = self._first_looking_fit(lay, subsets, i, guess[3])
        for k in range(j, len(subsets)):
            if k not in tried:
                sub = lay.with_(sac_ops=subsets[k])
                parts = self.bounds.flat_step(sub, order)[0] if sub.pp == 1 else step_parts(sub, self.prof, order)
                if self.bounds.leaf_bound(sub, parts) >= self.pool.kth():
                    # Later subsets recompute more, so they are no faster: whichever fits cannot enter the top K.
                    return BOUNDED_LEAF
                tried[k] = self.evaluate(sub, order, parts)
            got = tried[k]
            if got is not None and got is not TOO_BIG and got[2] <= self.usable:
                return got
        return guess  # nothing fits: the guess, counted as not fitting

    def _first_looking_fit(self, lay: Layout, subsets: list, i: int, phases: tuple) -> int:
        """From subset i toward faster ones: the fastest whose peak, at the guess's in-flight, fits."""
        j = i
        while j > 0 and self.peaks.peak_memory_gib(lay.with_(sac_ops=subsets[j - 1]), phases) <= self.usable:
            j -= 1
        return j

    def simulate_exact(self, lay: Layout, d: StageDurations,
                       held_limit: tuple[float, ...]) -> tuple[float, tuple] | None:
        """The schedule simulation on the leaf's own durations, as estimate_layout runs it; None if a
        rank would hold more activations than `held_limit` allows."""
        makespan, _, exceeded, phases = simulate_cached(lay.schedule, lay.pp, lay.v, lay.n_micro,
                                                        tuple(d.forward), tuple(d.backward), tuple(d.weight),
                                                        d.p2p, held_limit, weight_pass_share(lay))
        self.pool.n_resimulated += 1
        return None if exceeded else (makespan, phases)

    def simulate_scaled(self, lay: Layout, d: StageDurations,
                        held_limit: tuple[float, ...]) -> tuple[float, tuple] | None:
        """The schedule simulation on durations in units of the first stage's forward, rounded to
        1%: leaves of neighbouring classes differ mostly by a scale, so one simulation serves many.
        A leaf this puts within RESIMULATE_WITHIN of the K-th best is simulated exactly (score), and the
        K kept get their full estimate (estimate_layout) before they are ranked and written.
        None if a rank would hold more activations than `held_limit` allows (the simulation stops there)."""
        unit = d.forward[0] or max(d.forward) or 1.0

        def norm(xs):
            return tuple(round(x / unit, 2) for x in xs)

        share = weight_pass_share(lay)
        key = (lay.schedule, lay.pp, lay.v, lay.n_micro, norm(d.forward), norm(d.backward), norm(d.weight),
               round(d.p2p / unit, 2), round(share, 2))
        got = self._sim_cache.get(key)
        if got is None:
            over = self._sim_over.get(key)  # limits a stopped simulation of these durations passed
            if over is not None and all(a >= b for a, b in zip(over, held_limit)):
                return None
            f, b, w = ([x * unit for x in key[i]] for i in (4, 5, 6))
            makespan, _, exceeded, phases = simulate_cached(lay.schedule, lay.pp, lay.v, lay.n_micro, tuple(f),
                                                            tuple(b), tuple(w), key[7] * unit, held_limit, key[8])
            self.pool.n_sim += 1
            if exceeded:
                self.pool.n_stopped += 1
                self._sim_over[key] = held_limit
                return None
            got = self._sim_cache[key] = (makespan / unit, phases)
        return got[0] * unit, got[1]
