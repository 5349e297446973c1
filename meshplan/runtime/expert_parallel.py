"""Expert parallelism as TorchTitan runs it (expert-TP 1): the routed experts of every MoE layer are DTensors
Shard(0) over an `ep` mesh dimension, each rank computing with its experts / ep whole experts; tokens go
to the ranks holding their experts with `all_to_all_single` (variable splits, exchanged first) and come
back the same way. FSDP2 then shards the experts over the data-parallel ranks EP leaves (`efsdp`).

The `ep` dimension folds into dp_shard x cp x tp as specs/rules.ep_reason says: all of cp and tp and the
inner ep / (cp*tp) of dp_shard. DeviceMesh cannot re-factor a dimension of an existing mesh, so the experts
live on a mesh of their own over the same ranks, (pp, dp_replicate, efsdp, ep), whose groups are the
ones that fold.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

from meshplan.runtime.mesh import ParallelDims
from meshplan.runtime.moe import GroupedExperts, MoE
from meshplan.specs.plan import MESH_DIMS
from meshplan.specs.rules import ep_fsdp

EXPERT_MESH_DIMS = ("pp", "dp_replicate", "efsdp", "ep")


def expert_mesh(root: DeviceMesh, dims: ParallelDims, device_type: str) -> DeviceMesh:
    """The (pp, dp_replicate, efsdp, ep) mesh over the root mesh's ranks: the root's rank grid in the
    canonical order (pp, dp_replicate, dp_shard, cp, tp), dp_shard split into (efsdp, ep / (cp*tp)) and the
    latter flattened with cp and tp into ep."""
    grid = root.mesh.permute([dims.order.index(name) for name in MESH_DIMS])
    efsdp = ep_fsdp(dims.ep, dims.dp_shard, dims.cp, dims.tp)
    grid = grid.reshape(dims.pp, dims.dp_replicate, efsdp, dims.ep)
    return DeviceMesh(device_type, grid, mesh_dim_names=EXPERT_MESH_DIMS)


class AllToAll(torch.autograd.Function):
    """all_to_all_single with variable splits; backward sends the gradients back along the same routes."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class AllToAllDispatch:
    """Send each token-expert pair (rows sorted by global expert) to the EP rank holding its expert, run
    the local experts over what arrives, and return the outputs in the order the rows were sent."""

    def __init__(self, group, ep: int):
        self.group, self.ep = group, ep

    def __call__(self, experts: GroupedExperts, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """`counts[e]`: the rows of global expert e (x is sorted by expert)."""
        ep, local = self.ep, counts.numel() // self.ep
        received = torch.empty_like(counts)  # [source rank, my local expert]
        dist.all_to_all_single(received, counts, group=self.group)
        # The host needs the splits: the one read the dispatch cannot do without (TorchTitan's too).
        splits = torch.cat([counts.view(ep, local).sum(1), received.view(ep, local).sum(1)]).tolist()
        sent, got = splits[:ep], splits[ep:]
        rows = AllToAll.apply(x, got, sent, self.group)
        # Arrived grouped by source, then by expert: regroup by expert (then source) for the grouped GEMM.
        by_source = received.view(ep, local)
        segment = torch.repeat_interleave(torch.arange(ep * local, device=x.device), by_source.flatten(),
                                          output_size=rows.shape[0])
        order = torch.argsort((segment % local) * ep + segment // local, stable=True)
        out = experts(rows[order], by_source.sum(0))
        return AllToAll.apply(out[torch.argsort(order)], sent, got, self.group)


def apply_ep(model: torch.nn.Module, mesh: DeviceMesh, ep: int) -> None:
    """Shard every MoE layer's routed experts over `mesh` (the 1-D ep mesh) and dispatch by all-to-all."""
    for module in model.modules():
        if isinstance(module, MoE):
            experts = module.experts
            for name, param in list(experts.named_parameters(recurse=False)):
                sharded = torch.nn.Parameter(distribute_tensor(param, mesh, [Shard(0)], src_data_rank=None))
                setattr(experts, name, sharded)
            module.dispatch = AllToAllDispatch(mesh.get_group(), ep)
