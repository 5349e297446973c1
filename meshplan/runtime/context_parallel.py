"""Context parallelism: each CP rank holds 2 of the 2*cp sequence chunks (r and 2cp-1-r), which
balances causal-attention work across ranks.

On CUDA PyTorch's `context_parallel` (ring attention) could be used; it has no CPU path, so this
module is the smallest correct equivalent on torch.distributed primitives, used on every device:
all-gather K and V over the CP group (an autograd function whose backward all-reduces the
gradient and keeps this rank's slice), then SDPA with an explicit causal mask built from the
global positions of the local queries and of the gathered keys.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from meshplan.runtime.model import SeqLayout, Transformer


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 2 (sequence of (batch, heads, seq, head_dim)) over `group`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        ctx.local = x.shape[2]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every rank's attention used every rank's K/V: sum the gradients, keep our own slice.
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.narrow(2, ctx.rank * ctx.local, ctx.local), None


def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group: dist.ProcessGroup,
                 layout: SeqLayout) -> torch.Tensor:
    """Causal attention of local queries against the whole (gathered) sequence."""
    local = q.shape[2]
    k_all, v_all = _GatherSeq.apply(k, group), _GatherSeq.apply(v, group)
    q_pos = layout.positions(local, q.device)
    k_pos = torch.cat([SeqLayout(r, layout.cp_size).positions(local, q.device) for r in range(layout.cp_size)])
    mask = k_pos[None, :] <= q_pos[:, None]
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)


def shard_sequence(x: torch.Tensor, layout: SeqLayout, dim: int = 1) -> torch.Tensor:
    """This CP rank's part of a full-sequence tensor: chunks r and 2cp-1-r, concatenated."""
    if layout.cp_size == 1:
        return x
    chunks = x.chunk(2 * layout.cp_size, dim=dim)
    return torch.cat([chunks[layout.cp_rank], chunks[2 * layout.cp_size - 1 - layout.cp_rank]], dim=dim)


def apply_cp(model: Transformer, cp_mesh: DeviceMesh) -> SeqLayout:
    """Make positions (RoPE, learned) follow this rank's chunks and attention span the CP group."""
    layout = SeqLayout(cp_rank=cp_mesh.get_local_rank(), cp_size=cp_mesh.size())
    model.seq_layout = layout
    for block in model.layers.values():
        block.attention.seq_layout = layout
        block.attention.cp_attention = partial(cp_attention, group=cp_mesh.get_group(), layout=layout)
    return layout
