"""Time of one micro-batch through one block or the head, and of the per-step collectives."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost_models.activations import recomputed_kinds
from meshplan.cost_models.comm import GroupSpan, collective_time
from meshplan.cost_models.compute import attention_tflops, matmul_time, memory_bound_time
from meshplan.cost_models.flops import attention_flops_per_token, layer_matmuls, logits_matmul
from meshplan.cost_models.host import block_host, embedding_host, head_host
from meshplan.cost_models.layout import Layout
from meshplan.profiles.schema import ClusterProfile

# Attention backward does 2.5x the forward's FLOPs (recomputed scores, dQ, dK, dV).
ATTENTION_BWD_FACTOR = 2.5
# fp8 casts: input, weight and output-gradient passes of each float8 matmul, in elements read+written.
FLOAT8_CAST_PASSES = 3.0


@dataclass
class BlockTime:
    """Seconds for one micro-batch through one block on one rank."""

    forward: float = 0.0  # compute
    backward_input: float = 0.0
    backward_weight: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0  # exposed
    cp_comm: float = 0.0  # exposed

    @property
    def total(self) -> float:
        return self.forward + self.backward_input + self.backward_weight + self.recompute + self.tp_comm + self.cp_comm


def block_time(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan]) -> BlockTime:
    dev = prof.device
    spec = lay.spec
    T = lay.tokens_per_micro
    eff = prof.overheads.kernel_efficiency
    mm_dtype = "fp8" if lay.float8 and "fp8" in dev.peak_tflops else lay.dtype
    fwd_by_kind: dict[str, float] = {}
    for mm in layer_matmuls(spec, lay.tp):
        t = matmul_time(dev, T, mm.n, mm.k, mm_dtype) / eff
        fwd_by_kind[mm.kind] = fwd_by_kind.get(mm.kind, 0.0) + t
    mm_fwd = sum(fwd_by_kind.values())
    if lay.attention_kernel == "eager":
        att_fwd = _eager_attention_forward(lay, prof)
    else:
        att_flops = attention_flops_per_token(spec, lay.seq_len, causal=True) * T / lay.tp
        att_fwd = att_flops / (attention_tflops(dev, lay.seq_len, lay.dtype) * 1e12) / eff
    elem_fwd = memory_bound_time(dev, _elementwise_bytes(lay))
    if lay.compile:
        elem_fwd /= prof.overheads.compile_speedup
    cast = 0.0
    if lay.float8:
        cast_elems = sum(T * (mm.k + mm.n) + mm.k * mm.n for mm in layer_matmuls(spec, lay.tp))
        cast = memory_bound_time(dev, cast_elems * FLOAT8_CAST_PASSES)
        if lay.compile:
            cast /= prof.overheads.compile_speedup
    bt = BlockTime()
    bt.forward = mm_fwd + att_fwd + elem_fwd + cast / 3
    att_bwd = ATTENTION_BWD_FACTOR * att_fwd / dev.attention.backward_ratio
    bt.backward_input = mm_fwd + att_bwd + 2 * elem_fwd + cast / 3
    bt.backward_weight = mm_fwd + cast / 3
    bt.recompute = _recompute_time(lay, fwd_by_kind, att_fwd, elem_fwd)
    tp_fwd = _tp_comm_forward(lay, prof, spans)
    n_fwd_passes = 2 if lay.ac == "full" else 1
    tp_total = tp_fwd * (n_fwd_passes + 1)
    bt.tp_comm = tp_total * (1 - prof.overheads.tp_async_overlap) if lay.async_tp else tp_total
    cp_total = _cp_comm(lay, prof, spans) * (n_fwd_passes + 1)
    bt.cp_comm = cp_total * (1 - prof.overheads.cp_overlap)
    _add_host(bt, lay, prof)
    return bt


def _add_host(bt: BlockTime, lay: Layout, prof: ClusterProfile) -> None:
    """Host dispatch and collective-call time, in line with the passes it belongs to (host.py)."""
    f, b, r = block_host(lay)
    o = prof.overheads
    bt.forward += f.seconds(o)
    bt.backward_input += b.seconds(o)
    bt.recompute += r.seconds(o)


# Eager attention passes over the (heads x s x s) scores, in elements read or written: forward
# scale-mask-softmax (2) and dropout (2 + a 1-byte mask); backward about twice that.
EAGER_SCORE_PASSES_FWD = 4.5


def _eager_attention_forward(lay: Layout, prof: ClusterProfile) -> float:
    """Unfused attention: two batched matmuls over the full (masked) score matrix, then memory-bound
    softmax and dropout over it. Time for the forward; the caller scales it for backward."""
    spec, dev = lay.spec, prof.device
    heads = spec.n_heads // lay.tp
    seqs = lay.micro_batch / lay.cp
    s, hd = lay.seq_len, spec.head_dim
    mm = 2 * heads * seqs * matmul_time(dev, s, s, hd, lay.dtype) / prof.overheads.kernel_efficiency
    scores = heads * seqs * s * s
    return mm + memory_bound_time(dev, scores * lay.act_bytes * EAGER_SCORE_PASSES_FWD)


def _recompute_time(lay: Layout, fwd_by_kind: dict[str, float], att_fwd: float, elem_fwd: float) -> float:
    kinds = recomputed_kinds(lay.ac, lay.sac_ops, lay.spec.arch)
    if not kinds:
        return 0.0
    spec = lay.spec
    t = 0.0
    for kind, secs in fwd_by_kind.items():
        if kind in kinds:
            t += secs
        elif f"{kind}_partial" in kinds:
            # TorchTitan's op policy recomputes k of q/k/v and w3 of w1/w3 (every other matmul).
            if kind == "qkv":
                t += secs * spec.kv_dim / (spec.dim + 2 * spec.kv_dim)
            elif kind == "ffn_in" and spec.arch == "llama":
                t += secs / 2
    if "attention" in kinds:
        t += att_fwd
    return t + elem_fwd


def _elementwise_bytes(lay: Layout) -> float:
    """Bytes one block's forward elementwise kernels move, as eager PyTorch runs them.

    Per element, in units of the activation size: two RMSNorm/LayerNorms computed in fp32 (cast,
    square, mean, scale, cast back: ~20 passes each), two residual adds (3), RoPE on q and k via
    fp32 complex multiply (~15), the SwiGLU/GELU activation (5) and attention layout copies (8).
    Backward moves about twice this. torch.compile fuses most of it (profile compile_speedup).
    """
    spec = lay.spec
    sp_div = lay.tp if lay.sp else 1
    per_token = (2 * 20 + 2 * 3) * spec.dim / sp_div
    rope = 15 * (spec.dim + spec.kv_dim) if spec.arch == "llama" else 0
    per_token += (rope + 8 * (spec.dim + 2 * spec.kv_dim) + 5 * spec.ffn_dim) / lay.tp
    return lay.tokens_per_micro * per_token * lay.act_bytes


def _tp_comm_forward(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan]) -> float:
    """One block's forward TP collectives: SP's 2 all-gathers + 2 reduce-scatters, else 2 all-reduces."""
    if lay.tp == 1:
        return 0.0
    payload = lay.tokens_per_micro * lay.spec.dim * lay.act_bytes
    if lay.sp:
        return 2 * (collective_time(prof, "all_gather", payload, spans["tp"])
                    + collective_time(prof, "reduce_scatter", payload, spans["tp"]))
    return 2 * collective_time(prof, "all_reduce", payload, spans["tp"])


def _cp_comm(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan]) -> float:
    """One block's CP key/value all-gather (forward) for the full sequence."""
    if lay.cp == 1:
        return 0.0
    payload = 2 * lay.micro_batch * lay.seq_len * lay.spec.kv_dim / lay.tp * lay.act_bytes
    return collective_time(prof, "all_gather", payload, spans["cp"])


@dataclass
class HeadTime:
    forward: float
    backward: float


def head_time(lay: Layout, prof: ClusterProfile) -> HeadTime:
    """Output projection plus cross-entropy (memory-bound over the logits) for one micro-batch."""
    dev = prof.device
    T = lay.tokens_per_micro
    mm = logits_matmul(lay.spec, lay.tp)
    fwd_mm = matmul_time(dev, T, mm.n, mm.k, lay.dtype) / prof.overheads.kernel_efficiency
    logits = T * lay.spec.vocab_size / lay.tp
    # Upcast, log-softmax, loss gather: about 4 passes over fp32 logits forward, 4 backward.
    loss = memory_bound_time(dev, logits * 4 * 4)
    host_f, host_b = head_host(lay)
    o = prof.overheads
    return HeadTime(forward=fwd_mm + loss + host_f.seconds(o), backward=2 * fwd_mm + loss + host_b.seconds(o))


def embedding_time(lay: Layout, prof: ClusterProfile) -> float:
    lookup = memory_bound_time(prof.device, 3 * lay.tokens_per_micro * lay.spec.dim * lay.act_bytes)
    return lookup + embedding_host(lay).seconds(prof.overheads)
