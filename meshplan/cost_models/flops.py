"""FLOP counts: the one place the model-FLOPs convention and the executed FLOPs per op are written.

Model FLOPs (for MFU) follow the PaLM / NVIDIA convention: forward+backward = 3x forward,
every matmul counted (including the output head, not the input embedding lookup), attention
counted without causal halving and no recompute. This reproduces NVIDIA's published
model-FLOPs-per-sample figures. Executed FLOPs (for time and HFU) halve causal attention,
because fused kernels skip masked blocks, and add recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.specs.model import ModelSpec


@dataclass(frozen=True)
class Matmul:
    """One forward matmul per token: out = in[.., k] @ w[k, n]; `kind` names it for SAC and float8."""

    kind: str  # qkv | attn_out | ffn_in | ffn_out | logits | router | expert_in | expert_out
    k: int
    n: int

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.k * self.n


# The selective-AC kind (specs.plan.SAC_OPS) an MoE layer's matmuls fall under: its router and experts'
# gate/up projections feed the MLP's nonlinearity like ffn_in; the experts' down projection is ffn_out.
_SAC_KIND = {"router": "ffn_in", "expert_in": "ffn_in", "expert_out": "ffn_out"}


def sac_kind(kind: str) -> str:
    return _SAC_KIND.get(kind, kind)


def layer_matmuls(spec: ModelSpec, tp: int = 1) -> list[Matmul]:
    """The forward matmuls of one block of a dense model, as one TP rank sees them."""
    return block_matmuls(spec, spec.n_layers - 1, tp)


def block_matmuls(spec: ModelSpec, layer: int, tp: int = 1, routed: bool = True) -> list[Matmul]:
    """The forward matmuls of block `layer` that one token runs: its attention's, then its MLP's (without
    an MoE layer's routed experts when not `routed`: the cost model times those as grouped GEMMs)."""
    return attention_matmuls(spec, tp) + mlp_matmuls(spec, layer, tp, routed)


def attention_matmuls(spec: ModelSpec, tp: int = 1) -> list[Matmul]:
    """Query, key, value and output projections (GQA), or MLA's down- and up-projections."""
    d, h = spec.dim, spec.n_heads
    if spec.mla is not None:
        a = spec.mla
        q_down = [Matmul("qkv", d, a.q_lora_rank)] if a.q_lora_rank else []
        kv_down = [Matmul("qkv", d, a.kv_lora_rank + a.qk_rope_head_dim)]
        return q_down + kv_down + mla_up_matmuls(spec, tp) + [Matmul("attn_out", h * a.v_head_dim // tp, d)]
    q, kv = h * spec.head_dim, spec.kv_dim
    return [Matmul("qkv", d, q // tp), Matmul("qkv", d, kv // tp), Matmul("qkv", d, kv // tp),
            Matmul("attn_out", q // tp, d)]


def mla_up_matmuls(spec: ModelSpec, tp: int = 1) -> list[Matmul]:
    """MLA's up-projections, from the query and key/value latents to the heads (the query projected from
    the model width where it has no latent)."""
    a, h = spec.mla, spec.n_heads
    q_in = a.q_lora_rank or spec.dim
    return [Matmul("qkv", q_in, h * a.qk_head_dim // tp),
            Matmul("qkv", a.kv_lora_rank, h * (a.qk_nope_head_dim + a.v_head_dim) // tp)]


def expert_matmuls(spec: ModelSpec, tp: int = 1, experts: int = 1) -> list[Matmul]:
    """`experts` SwiGLU experts of the expert width: their gate and up projections, then their down ones."""
    d, f = spec.dim, spec.moe.expert_ffn_dim
    return [Matmul("expert_in", d, f // tp)] * (2 * experts) + [Matmul("expert_out", f // tp, d)] * experts


def shared_expert_matmuls(spec: ModelSpec, tp: int = 1) -> list[Matmul]:
    """An MoE layer's shared experts, each a SwiGLU of the expert width."""
    return expert_matmuls(spec, tp, spec.moe.shared_experts)


def mlp_matmuls(spec: ModelSpec, layer: int, tp: int = 1, routed: bool = True) -> list[Matmul]:
    """The dense MLP, or what one token runs of an MoE layer: the router, then its top-k routed (unless
    not `routed`) and the shared experts (each a SwiGLU of the expert width)."""
    d = spec.dim
    if not spec.is_moe_layer(layer):
        f = spec.ffn_dim
        ffn_in = [Matmul("ffn_in", d, f // tp)] * (2 if spec.arch == "llama" else 1)
        return ffn_in + [Matmul("ffn_out", f // tp, d)]
    moe = spec.moe
    return ([Matmul("router", d, moe.experts)] + expert_matmuls(spec, tp, moe.top_k if routed else 0)
            + shared_expert_matmuls(spec, tp))


def logits_matmul(spec: ModelSpec, tp: int = 1) -> Matmul:
    return Matmul("logits", spec.dim, spec.vocab_size // tp)


def causal_window_keys(window: float, seq_len: float) -> float:
    """Keys a query of a causal sliding window sees on average over a sequence: query i sees min(i + 1,
    window), so the first window's queries see fewer (cuDNN's SDPA benchmark counts its FLOPs so too)."""
    w = min(window, seq_len)
    return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len


def attention_flops_per_token(spec: ModelSpec, seq_len: int, causal: bool, layer: int | None = None) -> float:
    """Forward score and value matmuls per token, over all heads: q.k over the query/key head width,
    p.v over the value head width (MLA's differ), against every key of the sequence, or half of them
    on average under a causal mask (executed FLOPs: fused kernels skip masked blocks). Block `layer`'s
    sliding window, where it has one, caps the keys a query sees."""
    width = (spec.mla.qk_head_dim + spec.mla.v_head_dim) if spec.mla is not None else 2 * spec.head_dim
    window = spec.attention_window(layer) if layer is not None else None
    if window is not None and window < seq_len:
        # Without the causal mask a query sees a window each side.
        keys = causal_window_keys(window, seq_len) if causal else 2.0 * window
        return 2.0 * spec.n_heads * width * keys
    full = 2.0 * seq_len * spec.n_heads * width
    return full / 2 if causal else full


def model_flops_per_token(spec: ModelSpec, seq_len: int, causal: bool = False) -> float:
    """Training model FLOPs per token (the MFU convention above): the matmuls one token runs (the
    active experts only) and attention, forward and backward. `causal` halves attention, as
    Megatron-Core's num_floating_point_operations does (Megatron-Bridge's performance summaries)."""
    kinds = spec.block_kinds()  # the blocks alike in what a token runs (one kind for a dense model)
    matmul = sum(sum(m.flops_per_token for m in block_matmuls(spec, ls[0])) * len(ls) for ls in kinds.values())
    matmul += logits_matmul(spec).flops_per_token
    attention = sum(attention_flops_per_token(spec, seq_len, causal, ls[0]) * len(ls) for ls in kinds.values())
    return 3.0 * (matmul + attention)


def model_flops_per_step(spec: ModelSpec, seq_len: int, global_batch: int) -> float:
    return model_flops_per_token(spec, seq_len) * seq_len * global_batch


def megatron_flops_per_iteration(spec: ModelSpec, seq_len: int, batch: int) -> float:
    """Narayanan et al. (SC'21) Eq. 3: counts the recompute forward of full activation checkpointing."""
    h, l, s, v = spec.dim, spec.n_layers, seq_len, spec.vocab_size
    return 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
