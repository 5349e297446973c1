"""Lower bounds the search prunes with, read off the cost model (and memoised per search).

Time: a knob class cannot finish before its average pipeline rank's work is done, whatever the
schedule, split or placement of its stages; a leaf cannot beat its schedule's makespan lower
bound. Memory: no rank's peak is below the model states alone, nor below the lightest rank of the
even split with one micro-batch in flight. Without pipelining the class bound is the exact step.
"""

from __future__ import annotations

from meshplan.cost_models.estimate import (StageDurations, StepParts, block_key, compose_step, group_spans,
                                           stage_durations, stage_inputs, step_parts)
from meshplan.cost_models.host import pipeline_action_s
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import GIB, STATE_BYTES, passed_phases, peak_rank_memory
from meshplan.cost_models.pipeline import makespan_lower_bound
from meshplan.planner.space import Mesh
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.model import ModelSpec


def layer_costs(spec, bts: dict) -> list[float]:
    """Each layer's F+B+W per micro-batch, from its kind's block time (estimate.block_times)."""
    totals = {layer: bt.total for layer, bt in bts.items()}
    return [totals[rep] for rep in spec.representatives()]


class Bounds:
    def __init__(self, spec: ModelSpec, prof: ClusterProfile, usable_gib: float):
        self.spec, self.prof, self.usable = spec, prof, usable_gib
        self._layer_cache: dict = {}
        self._flat_steps: dict = {}
        self._memory_bounds: dict = {}

    # -- memory --------------------------------------------------------------------------
    def static_memory_gib(self, m: Mesh) -> float:
        """Model states alone (fp32 params + AdamW moments; gradients need not exist at the peak, see
        memory.py) on the most loaded rank: a bound below any peak."""
        params = self.spec.num_params() / (m.tp * m.pp)
        return (STATE_BYTES["params"] + STATE_BYTES["optimizer"]) * params / (m.dp_shard * m.cp) / GIB

    def rank_memory_bound_gib(self, lay: Layout) -> float:
        """Below the peak of any stage split: the lightest of the first, second and last pipeline ranks
        of the even split (memory is about linear in a rank's layers, so the average rank of any split
        weighs at least the lightest rank of the even one), each at the heaviest of the states every
        rank passes through (memory.passed_phases).
        Stops at the first rank under the usable memory: the bound then fits, whatever the rest say.
        Memoised: leaves repeat layouts (the 405B search asks 20,647 times for 12,150 of them), and async TP,
        which changes no tensor a rank holds, is keyed off."""
        key = lay.with_(async_tp=False) if lay.async_tp else lay
        got = self._memory_bounds.get(key)
        if got is None:
            got = self._memory_bounds[key] = self._rank_memory_bound_gib(key)
        return got

    def _rank_memory_bound_gib(self, lay: Layout) -> float:
        lightest = float("inf")
        phases = passed_phases(lay)
        for r in dict.fromkeys((min(1, lay.pp - 1), lay.pp - 1, 0)):  # middle ranks are usually lightest
            lightest = min(lightest, peak_rank_memory(lay, r, phases, self.prof.overheads).total / GIB)
            if lightest <= self.usable:
                break
        return lightest

    # -- time ----------------------------------------------------------------------------
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
        """(a layer's F+B+W on average over the model's layers, embedding + head F+B) per micro-batch: the
        work any split distributes."""
        key = block_key(lay, group_spans(lay, self.prof, order))
        got = self._layer_cache.get(key)
        if got is None:
            ref = stage_inputs(lay, self.prof, order)
            _, _, emb, head, _ = self.linear_costs(lay, ref)
            costs = layer_costs(lay.spec, ref[1])
            got = self._layer_cache[key] = (sum(costs) / len(costs), emb + head)
        return got

    def linear_costs(self, lay: Layout, ref: tuple) -> tuple[float, float, float, float, float]:
        """(a_f, a_bw, emb, head, p2p) of linear_bound_rows, read off stage_durations on three stages:
        a layer's forward and backward + weight per micro-batch (the cheapest kind of block's, where
        blocks differ: a bound on any layer), the embedding's forward, the head's forward + backward and
        the stage-to-stage send."""
        probe = lay.with_(pp=3, v=1)

        def durations(layers: tuple[int, ...]) -> StageDurations:
            return stage_durations(probe.with_(stage_layers=layers), self.prof, *ref)

        ends = durations((0, 0, 0))
        # Each duration carries one pipeline action's host time, which is not linear in layers: left out,
        # the bound stays below the makespan.
        act, w_act = pipeline_action_s(probe, self.prof.overheads)
        bts = ref[1].values()
        return (min(bt.forward_with_comm for bt in bts),
                min(bt.backward_input_with_comm + bt.backward_weight for bt in bts), ends.forward[0] - act,
                ends.forward[2] + ends.backward[2] - 2 * act, ends.p2p)

    def leaf_bound(self, lay: Layout, parts: StepParts) -> float:
        """The leaf's step with its schedule's makespan lower bound: no simulation of it does better."""
        d = parts.durations
        makespan = makespan_lower_bound(lay.schedule, lay.pp, lay.v, lay.n_micro, d.forward, d.backward, d.weight,
                                        d.p2p)
        return compose_step(lay, self.prof, parts, makespan)[0]
