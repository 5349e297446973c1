"""The parts of a block beyond dense GQA attention and a dense MLP: a mixture-of-experts layer
(routed and shared experts behind a router) and DeepSeek's multi-head latent attention (MLA).
Each owns its shape, its validation and its parameter count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshplan.errors import InputError
from meshplan.fields import as_bool, as_choice, as_float, as_int, reject_unknown, require_mapping

ROUTERS = ("softmax", "sigmoid")  # Mixtral, Qwen3, GPT-OSS: softmax over experts; DeepSeek-V3: sigmoid
LOAD_BALANCE = ("aux_loss", "bias")  # an auxiliary loss, or DeepSeek-V3's aux-loss-free expert bias
# Bounds a router can have: the widest published MoE routes among 384 experts (Kimi-K2), the most per token 8
# of them; the cost model counts a token's destination nodes with math.comb(experts, top_k) (moe.py), which
# beyond these would run for hours on a malformed file.
MAX_EXPERTS = 65_536
MAX_TOP_K = 1_024
# The widest a model's dimensions can be (hidden size, heads, FFN and expert widths, vocabulary, head and
# low-rank widths): published LLMs stay below a million (Gemma's 262k vocabulary, Llama 3 405B's 53,248 FFN),
# and the cost model multiplies widths by tokens and by each other in floating point, which a malformed file's
# 1e154 overflows.
MAX_WIDTH = 1 << 24


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts MLP: `experts` routed SwiGLU experts of width `expert_ffn_dim`, `top_k` of
    them per token, plus `shared_experts` every token passes through (DeepSeek). The first
    `dense_layers_first` blocks keep the dense MLP of the model's `ffn_dim` (DeepSeek's
    first_k_dense_replace). `bias`: the router and experts carry biases (GPT-OSS). `activation_clamp`: the
    experts' SwiGLU clamps its gate from above and its linear half on both sides at this value (GPT-OSS's
    swiglu_limit, 7.0): no parameters or FLOPs, but kernels (cost_models/moe.py)."""

    experts: int
    top_k: int
    expert_ffn_dim: int
    shared_experts: int = 0
    dense_layers_first: int = 0
    router: str = "softmax"
    load_balance: str = "aux_loss"
    bias: bool = False
    activation_clamp: float | None = None
    # Group-limited routing (DeepSeek's n_group and topk_group; Megatron-Core's moe_router_num_groups and
    # moe_router_group_topk; TorchTitan's n_expert_groups and n_limited_groups): the experts fall into
    # `expert_groups` contiguous groups, each token ranks the groups by the sum of their best
    # top_k // groups_per_token scores (Megatron-Core's group_limited_topk, DeepSeek-V3's top-2) and picks its
    # top_k experts inside the best `groups_per_token`. Laid out over the EP ranks in order, groups map onto
    # nodes, so a token reaches fewer of them (cost_models/moe.py remote_nodes_per_token). 1 and 1: ungrouped.
    expert_groups: int = 1
    groups_per_token: int = 1

    def expert_params(self, dim: int) -> int:
        """One SwiGLU expert: gate and up (dim -> ffn), down (ffn -> dim), with biases where the model has them."""
        f = self.expert_ffn_dim
        return 3 * dim * f + ((2 * f + dim) if self.bias else 0)

    def router_params(self, dim: int) -> int:
        # DeepSeek's aux-loss-free expert bias is a buffer updated outside the optimizer: not a parameter.
        return dim * self.experts + (self.experts if self.bias else 0)

    def layer_params(self, dim: int, active: bool = False) -> int:
        """The router and the experts of one MoE layer: all of them, or the ones a token runs (`active`)."""
        routed = self.top_k if active else self.experts
        return self.router_params(dim) + (routed + self.shared_experts) * self.expert_params(dim)

    @classmethod
    def from_dict(cls, data: Any, field: str) -> MoESpec:
        data = require_mapping(data, field)
        reject_unknown(data, cls.__dataclass_fields__, field)
        for key in ("experts", "top_k", "expert_ffn_dim"):
            if key not in data:
                raise InputError(f"{field}.{key}", "is required")
        experts = as_int(data["experts"], f"{field}.experts", 1, maximum=MAX_EXPERTS)
        top_k = as_int(data["top_k"], f"{field}.top_k", 1, maximum=MAX_TOP_K)
        if top_k > experts:
            raise InputError(f"{field}.top_k", f"must be at most experts ({experts}), got {top_k}")
        groups, per_token = _groups(data, experts, top_k, field)
        return cls(experts=experts, top_k=top_k,
                   expert_ffn_dim=as_int(data["expert_ffn_dim"], f"{field}.expert_ffn_dim", 1, maximum=MAX_WIDTH),
                   shared_experts=as_int(data.get("shared_experts", 0), f"{field}.shared_experts", 0),
                   dense_layers_first=as_int(data.get("dense_layers_first", 0), f"{field}.dense_layers_first", 0),
                   router=as_choice(data.get("router", "softmax"), f"{field}.router", ROUTERS),
                   load_balance=as_choice(data.get("load_balance", "aux_loss"), f"{field}.load_balance", LOAD_BALANCE),
                   bias=as_bool(data.get("bias", False), f"{field}.bias"),
                   activation_clamp=_clamp(data.get("activation_clamp"), f"{field}.activation_clamp"),
                   expert_groups=groups, groups_per_token=per_token)


def _groups(data: dict[str, Any], experts: int, top_k: int, field: str) -> tuple[int, int]:
    """(expert_groups, groups_per_token), checked: whole groups, and enough experts in the groups a token
    may use for its top_k, each group ranked by at least one score."""
    groups = as_int(data.get("expert_groups", 1), f"{field}.expert_groups", 1, maximum=experts)
    if experts % groups:
        raise InputError(f"{field}.expert_groups", f"must divide experts ({experts}), got {groups}")
    per_token = as_int(data.get("groups_per_token", 1), f"{field}.groups_per_token", 1, maximum=groups)
    if groups > 1 and not (per_token <= top_k <= per_token * (experts // groups)):
        raise InputError(f"{field}.groups_per_token", f"must be at most top_k ({top_k}) and hold top_k experts "
                                                      f"({experts // groups} a group), got {per_token}")
    return groups, per_token


def _clamp(value: Any, field: str) -> float | None:
    return None if value is None else as_float(value, field, 0.0, exclusive_min=True)


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through a low-rank `q_lora_rank`
    bottleneck (0: a plain projection), keys and values from one `kv_lora_rank` latent plus a shared
    RoPE key of `qk_rope_head_dim`; per head a `qk_nope_head_dim` + `qk_rope_head_dim` query/key and a
    `v_head_dim` value. Both bottlenecks are RMS-normed."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def params(self, dim: int, heads: int) -> int:
        q_width = heads * self.qk_head_dim
        q = dim * q_width if not self.q_lora_rank else dim * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_width
        kv = (dim * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + heads * self.v_head_dim * dim

    @classmethod
    def from_dict(cls, data: Any, field: str) -> MLASpec:
        data = require_mapping(data, field)
        reject_unknown(data, cls.__dataclass_fields__, field)
        for key in cls.__dataclass_fields__:
            if key not in data:
                raise InputError(f"{field}.{key}", "is required")
        return cls(q_lora_rank=as_int(data["q_lora_rank"], f"{field}.q_lora_rank", 0, maximum=MAX_WIDTH),
                   **{k: as_int(data[k], f"{field}.{k}", 1, maximum=MAX_WIDTH) for k in cls.__dataclass_fields__
                      if k != "q_lora_rank"})
