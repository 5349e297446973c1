"""What a search returns: scored plans (Candidate), the best that did not fit (NonFit) and the
SearchResult with its ranked plans, every leaf's count and the assumptions it made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan.cost_models.estimate import Estimate
from meshplan.cost_models.layout import Layout, even_split
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import Plan


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
        par.ep = lay.ep
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
    n_resimulated: int = 0  # leaves near the cut simulated again on their own durations (not in n_simulated)

    @property
    def best(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None

    def best_plan(self) -> Plan | None:
        return self.ranked[0].to_plan(self.base_plan) if self.ranked else None

    def counts(self) -> dict[str, Any]:
        rejected = sum(self.rejections.values())
        return {"space": self.space_size, "scored_exactly": self.n_exact, "simulated": self.n_simulated,
                "simulations_stopped": self.n_stopped, "resimulated_exactly": self.n_resimulated,
                "dominated": self.n_dominated, "pruned_by_bound": self.n_bounded, "rejected": rejected,
                "rejected_by_reason": {k: v for k, v in self.rejections.items() if v},
                "accounted": self.n_exact + self.n_dominated + self.n_bounded + rejected}

