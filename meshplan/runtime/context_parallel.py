"""Context parallelism: each CP rank holds 2 of the 2*cp sequence chunks (r and 2cp-1-r), which
balances causal-attention work across ranks (PyTorch's head-tail load balancer orders them the same).

Two attention paths, chosen by the backend (specs/rules.py, the same rule the estimate prices):
- ring (NCCL/CUDA): PyTorch's context-parallel SDPA (ring attention, load-balanced), reached by
  giving SDPA sequence-sharded DTensors with the CP dispatcher on, as its `_ContextParallel` style
  does. Inputs are already this rank's chunks (shard_sequence), so no buffers are re-sharded.
- gather (gloo/CPU, where PyTorch's ring has no kernels): all-gather K/V, then block-causal tiled
  attention with an online log-sum-exp merge in fp32; a custom backward re-gathers K/V and
  reduce-scatters their gradients. Nothing of size S x S exists: memory is linear in S.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from meshplan.runtime.model import SeqLayout, Transformer
from meshplan.specs.rules import CP_GATHER_TILE, RING, backend_for_device, cp_attention_kind, cp_kv_repeated


# --- gather path (gloo) --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Span:
    """A contiguous run of global token positions held at [local, local + length) of a tensor."""

    start: int
    local: int
    length: int


def chunk_spans(layout: SeqLayout, local_len: int, tile: int | None = None) -> list[_Span]:
    """This rank's sequence as tiles of global positions (each of its two chunks cut into tiles)."""
    tile = tile or CP_GATHER_TILE
    chunk = local_len // 2
    firsts = (layout.cp_rank, 2 * layout.cp_size - 1 - layout.cp_rank)
    spans = []
    for k, c in enumerate(firsts):
        for off in range(0, chunk, tile):
            spans.append(_Span(c * chunk + off, k * chunk + off, min(tile, chunk - off)))
    return spans


def _visibility(q: _Span, k: _Span) -> str:
    """full (every key before every query), causal (the same tile), or skip (all keys later)."""
    if k.start + k.length <= q.start:
        return "full"
    if k.start >= q.start + q.length:
        return "skip"
    assert (k.start, k.length) == (q.start, q.length), "query and key tiles are aligned"
    return "causal"


def _visible_tiles(layout: SeqLayout, n: int):
    """(key rank, local query slice, key slice, causal) for every query tile x key tile that is not
    fully masked: the diagonal tiles causal, the fully visible ones without a mask."""
    for qs in chunk_spans(layout, n):
        for r, ksp in _all_spans(layout, n):
            kind = _visibility(qs, ksp)
            if kind != "skip":
                yield (r, slice(qs.local, qs.local + qs.length), slice(ksp.local, ksp.local + ksp.length),
                       kind == "causal")


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    """Scores, softmax statistics and accumulators: fp32 (fp64 for fp64 inputs)."""
    return torch.promote_types(x.dtype, torch.float32)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """fp32 scores (b, hk, g, tq, tk) of grouped queries (b, hk, g, tq, d) against (b, hk, tk, d)."""
    s = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def _gather(x: torch.Tensor, group: dist.ProcessGroup) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return parts


def _all_spans(layout: SeqLayout, local_len: int) -> list[tuple[int, _Span]]:
    """(source rank, span) of every key tile in the gathered sequence."""
    return [(r, s) for r in range(layout.cp_size) for s in chunk_spans(SeqLayout(r, layout.cp_size), local_len)]


class _GatherAttention(torch.autograd.Function):
    """Causal attention of this rank's queries against every rank's keys (see module doc)."""

    @staticmethod
    def forward(ctx, q, k, v, group, layout):
        b, h, n, d = q.shape
        hk = k.shape[1]
        scale = d ** -0.5
        acc = _acc_dtype(q)
        qg = q.to(acc).unflatten(1, (hk, h // hk))  # (b, hk, g, n, d): groups share a K/V head
        ks, vs = _gather(k, group), _gather(v, group)
        out = torch.zeros_like(qg)
        m = torch.full(qg.shape[:-1], float("-inf"), dtype=acc, device=q.device)
        l = torch.zeros(qg.shape[:-1], dtype=acc, device=q.device)
        for r, qi, ki, causal in _visible_tiles(layout, n):
            s = _scores(qg[..., qi, :], ks[r][:, :, ki].to(acc), scale, causal)
            m_new = torch.maximum(m[..., qi], s.amax(-1))
            p = torch.exp(s - m_new.unsqueeze(-1))
            alpha = torch.exp(m[..., qi] - m_new)
            l[..., qi] = l[..., qi] * alpha + p.sum(-1)
            pv = torch.matmul(p, vs[r][:, :, ki].to(acc).unsqueeze(2))
            out[..., qi, :] = out[..., qi, :] * alpha.unsqueeze(-1) + pv
            m[..., qi] = m_new
        del ks, vs
        out = out / l.unsqueeze(-1)
        lse = m + torch.log(l)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.layout = group, layout
        return out.flatten(1, 2).to(q.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group, layout = ctx.group, ctx.layout
        b, h, n, d = q.shape
        hk = k.shape[1]
        scale = d ** -0.5
        acc = _acc_dtype(q)
        qg = q.to(acc).unflatten(1, (hk, h // hk))
        do = grad_out.to(acc).unflatten(1, (hk, h // hk))
        delta = (do * out).sum(-1)  # rowsum(dO * O), FlashAttention's D
        ks, vs = _gather(k, group), _gather(v, group)  # saved local only: re-gathered here
        dq = torch.zeros_like(qg)
        dk = [torch.zeros(kk.shape, dtype=acc, device=kk.device) for kk in ks]
        dv = [torch.zeros(vv.shape, dtype=acc, device=vv.device) for vv in vs]
        for r, qi, ki, causal in _visible_tiles(layout, n):
            kt, vt = ks[r][:, :, ki].to(acc), vs[r][:, :, ki].to(acc)
            p = torch.exp(_scores(qg[..., qi, :], kt, scale, causal) - lse[..., qi].unsqueeze(-1))
            dot = do[..., qi, :]
            dv[r][:, :, ki] += torch.matmul(p.transpose(-1, -2), dot).sum(2)
            dp = torch.matmul(dot, vt.unsqueeze(2).transpose(-1, -2))
            ds = p * (dp - delta[..., qi].unsqueeze(-1)) * scale
            dq[..., qi, :] += torch.matmul(ds, kt.unsqueeze(2))
            dk[r][:, :, ki] += torch.matmul(ds.transpose(-1, -2), qg[..., qi, :]).sum(2)
        del ks, vs
        # Every rank's queries used every rank's K/V: sum the K/V gradients onto their owners.
        dk_own, dv_own = _reduce_to_owner(dk, group), _reduce_to_owner(dv, group)
        return dq.flatten(1, 2).to(q.dtype), dk_own.to(k.dtype), dv_own.to(v.dtype), None, None


def _reduce_to_owner(parts: list[torch.Tensor], group: dist.ProcessGroup) -> torch.Tensor:
    """Sum over ranks of parts[r], kept on rank r (a reduce-scatter)."""
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, [p.contiguous() for p in parts], group=group)
    return out


def gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group: dist.ProcessGroup,
                     layout: SeqLayout) -> torch.Tensor:
    """Causal attention of local queries (b, h, n, d) against the whole sequence's K/V (b, hk, n, d)."""
    return _GatherAttention.apply(q, k, v, group, layout)


# --- ring path (NCCL/CUDA) -----------------------------------------------------------------------

def enable_ring_dispatch() -> None:
    """Route SDPA on sequence-sharded DTensors to PyTorch's ring attention (load-balanced, K/V
    exchanged by all-gather, TorchTitan's default), for the rest of the process."""
    from torch.distributed.tensor.experimental._attention import (_cp_options,
                                                                  _enable_context_parallel_dispatcher,
                                                                  set_rotate_method)

    _cp_options.enable_load_balance = True  # our chunks are head-tail ordered (shard_sequence)
    set_rotate_method("allgather")
    _enable_context_parallel_dispatcher()


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mesh: DeviceMesh) -> torch.Tensor:
    """PyTorch's ring attention over `mesh` for this rank's (b, h, n, d) chunks."""
    from torch.distributed.tensor import DTensor, Shard

    if k.shape[1] != q.shape[1]:  # K/V at the query width (rules.cp_kv_repeated: priced so)
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    q, k, v = (DTensor.from_local(t.contiguous(), mesh, [Shard(2)], run_check=False) for t in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).to_local()


# --- applying CP to a model ------------------------------------------------------------------------

def shard_sequence(x: torch.Tensor, layout: SeqLayout, dim: int = 1) -> torch.Tensor:
    """This CP rank's part of a full-sequence tensor: chunks r and 2cp-1-r, concatenated."""
    if layout.cp_size == 1:
        return x
    chunks = x.chunk(2 * layout.cp_size, dim=dim)
    return torch.cat([chunks[layout.cp_rank], chunks[2 * layout.cp_size - 1 - layout.cp_rank]], dim=dim)


def apply_cp(model: Transformer, cp_mesh: DeviceMesh) -> SeqLayout:
    """Make positions (RoPE, learned) follow this rank's chunks and attention span the CP group,
    by the path the backend takes (ring on NCCL, gather on gloo)."""
    layout = SeqLayout(cp_rank=cp_mesh.get_local_rank(), cp_size=cp_mesh.size())
    kind = cp_attention_kind(backend_for_device(cp_mesh.device_type))
    if kind == RING:
        assert cp_kv_repeated(kind)
        enable_ring_dispatch()
        attend = partial(ring_attention, mesh=cp_mesh)
    else:
        attend = partial(gather_attention, group=cp_mesh.get_group(), layout=layout)
    model.seq_layout = layout
    for block in model.layers.values():
        block.attention.seq_layout = layout
        if block.moe is not None:  # balanced routing keys on global positions
            block.moe.seq_layout = layout
        block.attention.cp_attention = attend
        block.attention.cp_kind = kind
    return layout
