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

    kind: str  # qkv | attn_out | ffn_in | ffn_out | logits
    k: int
    n: int

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.k * self.n


def layer_matmuls(spec: ModelSpec, tp: int = 1) -> list[Matmul]:
    """The forward matmuls of one block, as one TP rank sees them."""
    d, kv, f = spec.dim, spec.kv_dim, spec.ffn_dim
    mms = [Matmul("qkv", d, d // tp), Matmul("qkv", d, kv // tp), Matmul("qkv", d, kv // tp),
           Matmul("attn_out", d // tp, d)]
    ffn_in = [Matmul("ffn_in", d, f // tp)] * (2 if spec.arch == "llama" else 1)
    return mms + ffn_in + [Matmul("ffn_out", f // tp, d)]


def logits_matmul(spec: ModelSpec, tp: int = 1) -> Matmul:
    return Matmul("logits", spec.dim, spec.vocab_size // tp)


def attention_flops_per_token(spec: ModelSpec, seq_len: int, causal: bool) -> float:
    """Forward score + value matmuls per token, over all heads (q·k and p·v: 2 * 2 * s * d)."""
    full = 4.0 * seq_len * spec.n_heads * spec.head_dim
    return full / 2 if causal else full


def model_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Training model FLOPs per token (the MFU convention above)."""
    matmul = sum(m.flops_per_token for m in layer_matmuls(spec)) * spec.n_layers
    matmul += logits_matmul(spec).flops_per_token
    attention = attention_flops_per_token(spec, seq_len, causal=False) * spec.n_layers
    return 3.0 * (matmul + attention)


def model_flops_per_step(spec: ModelSpec, seq_len: int, global_batch: int) -> float:
    return model_flops_per_token(spec, seq_len) * seq_len * global_batch


def megatron_flops_per_iteration(spec: ModelSpec, seq_len: int, batch: int) -> float:
    """Narayanan et al. (SC'21) Eq. 3: counts the recompute forward of full activation checkpointing."""
    h, l, s, v = spec.dim, spec.n_layers, seq_len, spec.vocab_size
    return 96.0 * batch * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
