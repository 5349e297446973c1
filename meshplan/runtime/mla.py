"""DeepSeek-V2/V3's multi-head latent attention, shaped by specs/moe.py's MLASpec (the parameters it counts).

Queries come from the hidden state directly (q_lora_rank 0) or through an RMS-normed low-rank bottleneck;
keys and values from one RMS-normed latent of kv_lora_rank, expanded per head into a no-RoPE key part and a
value, plus one RoPE key part shared by every head, taken straight from the hidden state. Each head's query
and key are (nope, rope) concatenated; the value has its own width. RoPE rotates the rope parts only.
Training runs the expanded form (no weight absorption: that is an inference trick).

The runtime builds it without TP or CP (specs/rules.mla_reason): its latent projections are replicated
under TP, and CP's attention paths assume one head width for keys and values.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from meshplan.runtime.positions import SeqLayout, rope
from meshplan.specs.model import ModelSpec


class LatentAttention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        a, h, d = spec.mla, spec.n_heads, spec.dim
        self.mla, self.n_heads, self.rope_theta = a, h, spec.rope_theta
        if a.q_lora_rank:
            self.wq_a = nn.Linear(d, a.q_lora_rank, bias=False)
            self.q_norm = nn.RMSNorm(a.q_lora_rank, eps=spec.norm_eps)
            self.wq_b = nn.Linear(a.q_lora_rank, h * a.qk_head_dim, bias=False)
        else:
            self.wq = nn.Linear(d, h * a.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(d, a.kv_lora_rank + a.qk_rope_head_dim, bias=False)
        self.kv_norm = nn.RMSNorm(a.kv_lora_rank, eps=spec.norm_eps)
        self.wkv_b = nn.Linear(a.kv_lora_rank, h * (a.qk_nope_head_dim + a.v_head_dim), bias=False)
        self.wo = nn.Linear(h * a.v_head_dim, d, bias=False)
        self.seq_layout = SeqLayout()
        self.cp_attention = None  # context parallelism is refused for MLA (rules.mla_reason)

    def matmul_kinds(self) -> tuple[str, ...]:
        """Op kinds of the linears' matmuls in forward order, as cost_models/flops.attention_matmuls lists them."""
        q = ("qkv", "qkv") if self.mla.q_lora_rank else ("qkv",)
        return q + ("qkv", "qkv", "attn_out")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, h = self.mla, self.n_heads
        bs, seqlen, _ = x.shape
        positions = self.seq_layout.positions(seqlen, x.device)
        q = self.wq_b(self.q_norm(self.wq_a(x))) if a.q_lora_rank else self.wq(x)
        q = q.view(bs, seqlen, h, a.qk_head_dim)
        q_nope, q_pe = q.split([a.qk_nope_head_dim, a.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.wkv_a(x).split([a.kv_lora_rank, a.qk_rope_head_dim], dim=-1)
        kv = self.wkv_b(self.kv_norm(latent)).view(bs, seqlen, h, a.qk_nope_head_dim + a.v_head_dim)
        k_nope, v = kv.split([a.qk_nope_head_dim, a.v_head_dim], dim=-1)
        q_pe = rope(q_pe, positions, self.rope_theta)
        k_pe = rope(k_pe.unsqueeze(2), positions, self.rope_theta).expand(bs, seqlen, h, a.qk_rope_head_dim)
        q = torch.cat([q_nope, q_pe], dim=-1).transpose(1, 2)
        k = torch.cat([k_nope, k_pe], dim=-1).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), is_causal=True,
                                             scale=1.0 / math.sqrt(a.qk_head_dim))
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, h * a.v_head_dim))
