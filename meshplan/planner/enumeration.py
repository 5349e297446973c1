"""Enumeration of the space: the layouts of its meshes and knobs, their mesh orders and leaf counts.

A leaf is a complete layout. Leaves that share everything but the pipeline schedule, virtual
stages and layer split form a knob class (mesh degrees, mesh order, micro-batch, SP, activation
checkpointing, float8, reshard); this module builds their layouts and counts the leaves under a
mesh, a micro-batch or a class, so that every leaf can be accounted for without being built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan.cost_models.layout import Layout, default_imbalance, even_split, runtime_paths
from meshplan.planner.placement import distinct_orders
from meshplan.planner.space import SAC_ILP, Mesh, Space
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import SAC_OPS


@dataclass(order=True)
class KnobClass:
    """A node of the search: one knob setting of one (mesh, order, micro-batch), ordered by time bound."""

    bound: float
    tie: int
    layout: Layout = field(compare=False)
    order: tuple[str, ...] = field(compare=False)
    sac: Any = field(compare=False)
    leaves: int = field(compare=False)  # leaves still represented (after dominance)


def fastest_member(lay: Layout, sac: Any) -> Layout:
    """A class's fastest member: for the SAC ILP class the one that saves everything (the smallest saves nothing)."""
    return lay.with_(sac_ops=tuple(SAC_OPS)) if sac == SAC_ILP else lay


class Enumeration:
    def __init__(self, space: Space, prof: ClusterProfile):
        self.space, self.prof, self.spec = space, prof, space.plan.model
        self._mesh_layouts: dict = {}

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
                reshard_after_forward=True, compile=max(s.compile_options()), ep=m.ep,
                moe_imbalance=default_imbalance(self.spec)),
                self.prof)  # Layout's defaults are meshplan's own runtime, which the search plans
        return proto.with_(micro_batch=mb, sp=sp and m.tp > 1, ac=ac, sac_ops=sac if isinstance(sac, tuple) else None,
                           float8=f8, reshard_after_forward=reshard)

    def orders(self, m: Mesh) -> list[tuple[tuple[str, ...], dict]]:
        """The mesh orders of `m` that place its groups differently (placement.distinct_orders)."""
        probe = self.layout(m, 1, False, "none", None, False, True)
        return distinct_orders(probe, self.prof)
