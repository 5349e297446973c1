"""Data parallelism: FSDP2 (fully_shard per block, then the root), HSDP over the 2-D
(dp_replicate, dp_shard_cp) mesh, or DDP (FSDP2-style `replicate`) when nothing is sharded."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from meshplan.runtime.mesh import Meshes, ParallelDims
from meshplan.runtime.model import Transformer


def data_parallel_kind(dims: ParallelDims) -> str:
    """'fsdp' (dp_shard*cp > 1, HSDP when also dp_replicate > 1), 'ddp' or 'none'."""
    if dims.fsdp_size > 1:
        return "hsdp" if dims.dp_replicate > 1 else "fsdp"
    return "ddp" if dims.dp_replicate > 1 else "none"


def apply_fsdp(model: Transformer, mesh: DeviceMesh, reshard_after_forward: bool) -> None:
    """Shard each block, then the root (embeddings, final norm, output) over `mesh` (1-D FSDP or
    2-D HSDP). The last block is never resharded after forward: backward needs it right away."""
    blocks = list(model.layers.values())
    for i, block in enumerate(blocks):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward and i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)


def apply_ddp(model: nn.Module, mesh: DeviceMesh) -> None:
    """Replicated parameters, all-reduced gradients (composable DDP; works with DTensor/TP/PP)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(model, mesh=mesh)


def apply_data_parallel(model: Transformer, mesh: Meshes, dims: ParallelDims,
                        reshard_after_forward: bool) -> str:
    kind = data_parallel_kind(dims)
    if kind == "fsdp":
        apply_fsdp(model, mesh["dp_shard_cp"], reshard_after_forward)
    elif kind == "hsdp":
        apply_fsdp(model, mesh["dp_replicate", "dp_shard_cp"], reshard_after_forward)
    elif kind == "ddp":
        apply_ddp(model, mesh["dp_replicate"])
    return kind
