"""Data parallelism and mixed precision: FSDP2 (fully_shard per block, then the root), HSDP over
the 2-D (dp_replicate, dp_shard_cp) mesh, or DDP (FSDP2-style `replicate`) when nothing is sharded.

Precision is FSDP2's module-level mixed precision in every layout, as TorchTitan trains: fp32
sharded (master) parameters and optimizer state, parameters cast to bf16 when they are gathered
for compute, so activations are bf16 end to end, and gradients reduced and accumulated in fp32
(in bf16 where the plan's memory.grad_reduce_dtype says so).
A bf16 plan without any data parallelism (TP or PP alone, or one device) still gets fully_shard,
on its one-rank dp_shard_cp mesh: the same casts, the same bf16 activations and fp32 gradients
as every other layout, which is what the cost model prices (activations at 2 bytes, fp32 model
states). torch.autocast, TorchTitan's choice for one device, would keep the residual stream and
norm outputs in fp32 (bigger activations than priced) and round differently from the FSDP
layouts; TorchTitan has no mixed precision at all for TP or PP without FSDP.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from meshplan.runtime.activation_checkpoint import block_module
from meshplan.runtime.mesh import Meshes, ParallelDims
from meshplan.runtime.model import Transformer
from meshplan.specs.rules import uses_fully_shard


def mixed_precision(dtype: str, grad_reduce_dtype: str = "fp32") -> MixedPrecisionPolicy:
    """bf16: bf16 compute, gradients reduced in `grad_reduce_dtype` (the plan's memory.grad_reduce_dtype: fp32 by
    default; bf16 halves the bytes each reduction sends, and FSDP2 then accumulates unsharded gradients in bf16
    too), master weights fp32 either way (FSDP2 casts the reduced shard to the sharded parameter's dtype);
    fp32: no casts (the plan refuses a bf16 reduction of fp32 gradients)."""
    if dtype == "bf16":
        reduce_dtype = torch.bfloat16 if grad_reduce_dtype == "bf16" else torch.float32
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
    return MixedPrecisionPolicy()  # the plan schema allows bf16 and fp32 only


def data_parallel_kind(dims: ParallelDims, dtype: str = "fp32") -> str:
    """'fsdp' (dp_shard*cp > 1), 'hsdp' (also dp_replicate > 1), 'ddp', 'fsdp1' (a bf16 plan
    without data parallelism: fully_shard on one rank, for mixed precision only) or 'none'."""
    if dims.fsdp_size > 1:
        return "hsdp" if dims.dp_replicate > 1 else "fsdp"
    if dims.dp_replicate > 1:
        return "ddp"
    return "fsdp1" if uses_fully_shard(dims.fsdp_size, dims.dp_replicate, dtype) else "none"


def apply_fsdp(model: Transformer, mesh: DeviceMesh, reshard_after_forward: bool,
               mp: MixedPrecisionPolicy) -> None:
    """Shard each block, then the root (embeddings, final norm, output) over `mesh` (1-D FSDP or
    2-D HSDP). The last block is never resharded after forward: backward needs it right away."""
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1,
                    mp_policy=mp)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)


def apply_ddp(model: nn.Module, mesh: DeviceMesh, mp: MixedPrecisionPolicy) -> None:
    """Replicated parameters, all-reduced gradients (composable DDP; works with DTensor/TP/PP)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(model, mesh=mesh, mp_policy=mp)


def apply_expert_fsdp(model: Transformer, mesh: Meshes, dims: ParallelDims, reshard_after_forward: bool,
                      mp: MixedPrecisionPolicy) -> None:
    """Under expert parallelism, shard each MoE layer's routed experts over the data-parallel ranks EP leaves
    (efsdp, with dp_replicate as HSDP) before their block is sharded over all of dp_shard x cp. An expert's
    gradient sums the tokens every EP rank sent it, so it is divided by the whole data-parallel degree, as
    the dense weights' are, not by the efsdp ranks that reduce it (TorchTitan sets the same divide factor)."""
    experts_mesh = mesh.experts["dp_replicate", "efsdp"] if dims.dp_replicate > 1 else mesh.experts["efsdp"]
    for block in model.layers.values():
        moe = block_module(block).moe
        if moe is None:
            continue
        fully_shard(moe.experts, mesh=experts_mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
        # FSDP2's own divide factor would take a pre-multiplied sum, which gloo lacks: scale in autograd.
        moe.experts.grad_scale = experts_mesh.size() / (dims.dp_replicate * dims.fsdp_size)


def apply_data_parallel(model: Transformer, mesh: Meshes, dims: ParallelDims,
                        reshard_after_forward: bool, dtype: str = "fp32", grad_reduce_dtype: str = "fp32") -> str:
    kind = data_parallel_kind(dims, dtype)
    mp = mixed_precision(dtype, grad_reduce_dtype)
    if dims.ep > 1 and kind in ("fsdp", "fsdp1", "hsdp"):
        apply_expert_fsdp(model, mesh, dims, reshard_after_forward, mp)
    if kind in ("fsdp", "fsdp1"):
        apply_fsdp(model, mesh["dp_shard_cp"], reshard_after_forward, mp)
    elif kind == "hsdp":
        apply_fsdp(model, mesh["dp_replicate", "dp_shard_cp"], reshard_after_forward, mp)
    elif kind == "ddp":
        apply_ddp(model, mesh["dp_replicate"], mp)
    return kind
