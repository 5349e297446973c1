"""Llama and GPT decoder-only transformers in plain torch, shaped exactly by a ModelSpec.

torchtitan style: `layers` is an nn.ModuleDict keyed by the global layer index, and
`tok_embeddings` / `norm` / `output` may be None, so a pipeline stage is the same class with
parts removed and every parameter keeps the fully-qualified name (FQN) it has in the whole model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.errors import InputError
from meshplan.runtime.mla import LatentAttention
from meshplan.runtime.moe import MoE
from meshplan.runtime.positions import SeqLayout, rope
from meshplan.specs.model import ModelSpec
from meshplan.specs.rules import model_runs_reason

class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        bias = spec.arch == "gpt"
        self.head_dim = spec.head_dim
        self.use_rope = spec.arch == "llama"
        self.rope_theta = spec.rope_theta
        self.wq = nn.Linear(spec.dim, spec.n_heads * spec.head_dim, bias=bias)
        self.wk = nn.Linear(spec.dim, spec.kv_dim, bias=bias)
        self.wv = nn.Linear(spec.dim, spec.kv_dim, bias=bias)
        self.wo = nn.Linear(spec.n_heads * spec.head_dim, spec.dim, bias=bias)
        # Qwen3's per-head RMSNorms of queries and keys, before RoPE (one weight of head_dim, shared by the heads).
        self.q_norm = nn.RMSNorm(spec.head_dim, eps=spec.norm_eps) if spec.qk_norm else None
        self.k_norm = nn.RMSNorm(spec.head_dim, eps=spec.norm_eps) if spec.qk_norm else None
        self.seq_layout = SeqLayout()
        # Set by context parallelism: fn(q, k, v) -> out over the CP group (None = local causal SDPA).
        self.cp_attention = None

    def matmul_kinds(self) -> tuple[str, ...]:
        """The op kind (specs.plan.SAC_OPS) of each linear's matmul, in the order forward runs them;
        the attention kernel itself is the "attention" kind (activation_checkpoint.py)."""
        return ("qkv", "qkv", "qkv", "attn_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        # -1 heads: under tensor parallelism this rank holds n_heads/tp (and n_kv_heads/tp) heads.
        q = q.view(bs, seqlen, -1, self.head_dim)
        k = k.view(bs, seqlen, -1, self.head_dim)
        v = v.view(bs, seqlen, -1, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            positions = self.seq_layout.positions(seqlen, x.device)
            q, k = rope(q, positions, self.rope_theta), rope(k, positions, self.rope_theta)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.cp_attention is not None:
            out = self.cp_attention(q, k, v)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).reshape(bs, seqlen, -1)
        return self.wo(out)


class FeedForward(nn.Module):
    """Llama: SwiGLU w2(silu(w1 x) * w3 x); GPT: w2(gelu(w1 x)) with biases."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gated = spec.arch == "llama"
        bias = not self.gated
        self.w1 = nn.Linear(spec.dim, spec.ffn_dim, bias=bias)
        self.w3 = nn.Linear(spec.dim, spec.ffn_dim, bias=False) if self.gated else None
        self.w2 = nn.Linear(spec.ffn_dim, spec.dim, bias=bias)

    def matmul_kinds(self) -> tuple[str, ...]:
        """The op kind of each linear's matmul, in the order forward runs them."""
        return ("ffn_in", "ffn_in", "ffn_out") if self.gated else ("ffn_in", "ffn_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            a, b = self.w1(x), self.w3(x)
        else:
            a = self.w1(x)
        h = F.silu(a) * b if self.gated else F.gelu(a)
        return self.w2(h)


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.arch == "llama":
        return nn.RMSNorm(spec.dim, eps=spec.norm_eps)
    return nn.LayerNorm(spec.dim, eps=spec.norm_eps)


class TransformerBlock(nn.Module):
    """Attention (GQA, or DeepSeek's latent attention where the model has MLA), then the dense MLP
    (`feed_forward`) or, in a mixture-of-experts layer, the MoE MLP (`moe`)."""

    def __init__(self, spec: ModelSpec, layer: int = 0):
        super().__init__()
        self.attention_norm = make_norm(spec)
        self.attention = LatentAttention(spec) if spec.mla is not None else Attention(spec)
        self.ffn_norm = make_norm(spec)
        moe = spec.is_moe_layer(layer)
        self.feed_forward = None if moe else FeedForward(spec)
        self.moe = MoE(spec) if moe else None

    @property
    def mlp(self) -> nn.Module:
        return self.moe if self.moe is not None else self.feed_forward

    def matmul_kinds(self) -> tuple[str, ...]:
        """The op kind of every linear's matmul of one forward, in order: what selective AC reads to
        tell which matmul it is looking at (activation_checkpoint.py)."""
        return self.attention.matmul_kinds() + self.mlp.matmul_kinds()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.mlp(self.ffn_norm(h))


class Transformer(nn.Module):
    """tokens (batch, seq) -> logits (batch, seq, vocab); a pipeline stage maps hidden -> hidden."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.dim)
        self.pos_embeddings = nn.Embedding(spec.max_seq_len, spec.dim) if spec.arch == "gpt" else None
        self.layers = nn.ModuleDict({str(i): TransformerBlock(spec, i) for i in range(spec.n_layers)})
        self.norm = make_norm(spec)
        # Tied: the output projection reuses tok_embeddings.weight (no second parameter).
        self.output = None if spec.tied_embeddings else nn.Linear(spec.dim, spec.vocab_size, bias=False)
        self.seq_layout = SeqLayout()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        if self.pos_embeddings is not None:
            positions = self.seq_layout.positions(x.shape[1], x.device)[None, :]
            h = h + self.pos_embeddings(positions)
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is None:
            return h
        h = self.norm(h)
        if self.output is not None:
            return self.output(h)
        return F.linear(h, self.tok_embeddings.weight)


def build_model(spec: ModelSpec, device: str | torch.device = "meta") -> Transformer:
    """Build the whole model (on meta by default: no memory until materialised after sharding). Only
    the blocks this file and moe.py define: anything else is refused rather than built as something else."""
    why = model_runs_reason(spec)
    if why:
        raise InputError("model", why)
    with torch.device(device):
        return Transformer(spec)


def keep_stage(model: Transformer, layer_ids: list[int], first: bool, last: bool) -> Transformer:
    """Cut a whole model down to one pipeline stage; FQNs of what is kept do not change."""
    for key in list(model.layers.keys()):
        if int(key) not in layer_ids:
            del model.layers[key]
    if not first:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model
