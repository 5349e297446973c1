"""Turn a plan into this rank's model parts: build on meta, cut the pipeline stage, then apply
float8, TP+SP, CP, activation checkpointing, compile and data parallelism with mixed precision
(in that order, each a flat function in its own file), then materialise and initialise the weights."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from meshplan.runtime import tp_census
from meshplan.runtime.activation_checkpoint import apply_ac
from meshplan.runtime.context_parallel import apply_cp
from meshplan.runtime.data_parallel import apply_data_parallel
from meshplan.runtime.expert_parallel import apply_ep
from meshplan.runtime.float8 import apply_float8
from meshplan.runtime.mesh import Meshes, ParallelDims
from meshplan.runtime.initialisation import init_weights
from meshplan.runtime.model import SeqLayout, Transformer, build_model, keep_stage
from meshplan.runtime.moe import MoE
from meshplan.runtime.pipeline import split_layers, stage_ids
from meshplan.runtime.tensor_parallel import apply_tp, enable_async_tp
from meshplan.specs.plan import Plan
from meshplan.specs.rules import grad_reduce_dtype


@dataclass
class ModelParts:
    """The model chunks this rank runs (several with virtual pipeline stages)."""

    parts: list[Transformer]
    stage_ids: list[int]
    n_stages: int
    seq_layout: SeqLayout
    loss_parallel: bool
    data_parallel: str
    notes: list[str] = field(default_factory=list)

    @property
    def has_first(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last(self) -> bool:
        return self.n_stages - 1 in self.stage_ids


def parallelize_model(plan: Plan, mesh: Meshes, dims: ParallelDims, device: torch.device,
                      seed: int, float8_emulate: bool, balanced_routing: bool = False) -> ModelParts:
    p, mem = plan.parallel, plan.memory
    spec = plan.model
    n_stages = dims.pp * p.pp_virtual_stages
    ids = stage_ids(mesh["pp"].get_local_rank(), dims.pp, p.pp_virtual_stages, p.pp_schedule) if dims.pp > 1 else [0]
    layers = split_layers(spec.n_layers, n_stages, p.pp_layers) if dims.pp > 1 else [list(range(spec.n_layers))]
    loss_parallel = dims.tp > 1
    parts, layout, kind = [], SeqLayout(), "none"
    for sid in ids:
        model = build_model(spec, "meta")
        keep_stage(model, layers[sid], first=sid == 0, last=sid == n_stages - 1)
        if mem.float8:
            apply_float8(model, emulate=float8_emulate, fsdp_float8_all_gather=dims.fsdp_size > 1)
        if dims.tp > 1:
            apply_tp(model, mesh["tp"], bool(p.sequence_parallel), bool(mem.float8), loss_parallel)
            if p.async_tp:
                enable_async_tp(mesh["tp"])
        if dims.cp > 1:
            layout = apply_cp(model, mesh["cp"])
        if dims.ep > 1:
            apply_ep(model, mesh.experts["ep"], dims.ep)
        share_tokens(model, mesh, dims, balanced_routing)
        apply_ac(model, mem.activation_checkpointing, mem.sac_ops)
        if plan.compile:
            if dims.tp > 1:  # what inductor does with the TP collectives: async TP's proof
                tp_census.install()
            for block in model.layers.values():
                block.compile()
        kind = apply_data_parallel(model, mesh, dims, bool(mem.reshard_after_forward), str(plan.training.dtype),
                                   grad_reduce_dtype(plan.stack, mem.grad_reduce_dtype, str(plan.training.dtype)))
        model.to_empty(device=device)
        init_weights(model, spec, seed)
        parts.append(model)
    return ModelParts(parts=parts, stage_ids=ids, n_stages=n_stages, seq_layout=layout,
                      loss_parallel=loss_parallel, data_parallel=kind)


def share_tokens(model: Transformer, mesh: Meshes, dims: ParallelDims, balanced_routing: bool) -> None:
    """Tell each MoE layer who shares its micro-batch's tokens: the CP and (sequence-parallel) TP ranks,
    over which its aux loss sums its statistics; data averaging over CP ranks divides its gradient by cp,
    which the layer multiplies back."""
    for module in model.modules():
        if isinstance(module, MoE):
            module.balanced_routing = balanced_routing
            if dims.cp * dims.tp > 1:
                module.share.group = mesh["cp_tp"].get_group()
                module.share.grad_scale = float(dims.cp)


def model_parameters(parts: list[nn.Module]) -> list[nn.Parameter]:
    return [p for m in parts for p in m.parameters()]
