"""ModelSpec: the shape of a decoder-only transformer, dense or mixture-of-experts, and its exact
parameter count (total, and active: what one token runs)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from meshplan.errors import InputError
from meshplan.fields import as_bool, as_choice, as_float, as_int, as_str, reject_unknown, require_mapping
from meshplan.specs.moe import MAX_WIDTH, MLASpec, MoESpec

ARCHS = ("llama", "gpt")
# Fields a dense GQA model leaves at their defaults; to_dict omits them there, so dense specs read as before.
# The cost model and the parameter count walk a model's blocks one by one (block_kinds, param_count), so a
# depth must be one a model can have: the deepest built-in has 126 blocks, published LLMs a few hundred.
MAX_LAYERS = 10_000
OPTIONAL_FIELDS = {"attention_head_dim": None, "qk_norm": False, "attention_bias": False, "attention_sinks": False,
                   "sliding_window": None, "full_attention_every": 0, "rope_yarn_factor": None, "mla": None,
                   "moe": None}


@dataclass(frozen=True)
class ModelSpec:
    """`llama`: RMSNorm, RoPE, GQA, SwiGLU (3 FFN matrices); `gpt`: LayerNorm, GELU MLP, learned positions.
    Optional parts: a head width other than dim / n_heads (Qwen3, GPT-OSS), RMS-normed q and k per head
    (Qwen3), attention biases and per-head sinks (GPT-OSS), MLA in place of GQA (DeepSeek), and a
    mixture-of-experts MLP (specs/moe.py)."""

    name: str
    arch: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    tied_embeddings: bool = False
    max_seq_len: int = 131072
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    attention_head_dim: int | None = None
    qk_norm: bool = False
    attention_bias: bool = False
    attention_sinks: bool = False
    # Sliding-window attention over `sliding_window` keys in every layer but each full_attention_every-th
    # (0: none; GPT-OSS: 128 keys, every other layer full).
    sliding_window: int | None = None
    full_attention_every: int = 0
    # YaRN's context-extension factor where the model scales its RoPE so (a Hugging Face config's
    # rope_scaling {rope_type: yarn, factor}; GPT-OSS: 32). No parameters or FLOPs: its attention
    # temperature (yarn_mscale) decides which RoPE kernel a stack can run (cost_models/timing.py).
    rope_yarn_factor: float | None = None
    mla: MLASpec | None = None
    moe: MoESpec | None = None

    def __hash__(self) -> int:
        # Specs key the cost model's caches; hashing twelve fields on every lookup showed in profiles.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def head_dim(self) -> int:
        """Query/key width of a head: MLA's (nope + rope), the one the model states, or dim / n_heads."""
        if self.mla is not None:
            return self.mla.qk_head_dim
        return self.attention_head_dim or self.dim // self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def gqa_attention(self) -> bool:
        """GQA attention of any head width (Qwen3's per-head q/k norms included), without a sliding window,
        biases or sinks: what the runtime builds besides MLA."""
        return (self.mla is None and self.sliding_window is None
                and not (self.attention_bias or self.attention_sinks))

    @property
    def runtime_attention(self) -> bool:
        """Attention the runtime builds: GQA (gqa_attention) or DeepSeek's MLA, without sliding windows,
        biases, sinks or YaRN's RoPE scaling."""
        return (self.sliding_window is None and not (self.attention_bias or self.attention_sinks)
                and self.rope_yarn_factor is None)

    @property
    def yarn_mscale(self) -> float:
        """YaRN's attention temperature, 0.1 ln(factor) + 1 (Peng et al. 2023, eq. 22; Megatron-Core
        yarn_rotary_pos_embedding._yarn_get_mscale): 1 without YaRN. MLA applies it to the softmax scale
        instead (DeepSeek-V3's mscale over mscale_all_dim, 1), so its rotation carries none."""
        if self.rope_yarn_factor is None or self.rope_yarn_factor <= 1.0 or self.mla is not None:
            return 1.0
        return 0.1 * math.log(self.rope_yarn_factor) + 1.0

    def attention_window(self, layer: int) -> int | None:
        """The keys a query of block `layer` sees at most: a sliding window, or None for full attention."""
        every = self.full_attention_every
        if self.sliding_window is None or (every and layer % every == every - 1):
            return None
        return self.sliding_window

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the queries over all heads (dim for Llama and GPT; wider for Qwen3, GPT-OSS and MLA)."""
        return self.n_heads * self.head_dim

    @property
    def v_dim(self) -> int:
        """Width of the values attention reads: MLA's per-head value width, else the keys'."""
        return self.n_heads * self.mla.v_head_dim if self.mla is not None else self.kv_dim

    @property
    def attn_out_dim(self) -> int:
        """Width of attention's output, the output projection's input (one value per query head)."""
        return self.n_heads * self.mla.v_head_dim if self.mla is not None else self.q_dim

    def block_kind(self, layer: int) -> tuple[bool, int | None]:
        """What makes blocks differ in cost: an MoE or a dense MLP, and the keys its attention sees."""
        return self.is_moe_layer(layer), self.attention_window(layer)

    def representative_layer(self, layer: int) -> int:
        """The first layer of `layer`'s kind: the one the cost model prices for every layer of that kind."""
        return self.representatives()[layer]

    def representatives(self) -> tuple[int, ...]:
        """representative_layer of every layer, in layer order (kept on the frozen spec, as block_kinds)."""
        reps = self.__dict__.get("_representatives")
        if reps is None:
            kinds = self.block_kinds()
            reps = tuple(kinds[self.block_kind(layer)][0] for layer in range(self.n_layers))
            object.__setattr__(self, "_representatives", reps)
        return reps

    def block_kinds(self) -> dict[tuple[bool, int | None], list[int]]:
        """The model's layers grouped by block_kind, in layer order (one group for a uniform model)."""
        kinds = self.__dict__.get("_block_kinds")  # asked ~10^4 times per search: kept on the frozen spec
        if kinds is None:
            kinds = {}
            for layer in range(self.n_layers):
                kinds.setdefault(self.block_kind(layer), []).append(layer)
            object.__setattr__(self, "_block_kinds", kinds)
        return kinds

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.arch == "llama" else 2

    def layer_params(self) -> int:
        """Parameters of one block of a dense model (attention, MLP, two norms; GPT adds biases)."""
        return self.block_params(self.n_layers - 1)

    def attention_params(self) -> int:
        """One block's attention: q, k, v and output projections (GPT: with biases), or MLA's; q/k norms,
        biases and sinks where the model has them."""
        d, h = self.dim, self.n_heads
        if self.mla is not None:
            return self.mla.params(d, h)
        q, kv = h * self.head_dim, self.kv_dim
        params = d * q + 2 * d * kv + q * d
        if self.arch == "gpt" or self.attention_bias:
            params += q + 2 * kv + d
        return params + (2 * self.head_dim if self.qk_norm else 0) + (h if self.attention_sinks else 0)

    def dense_mlp_params(self) -> int:
        d, f = self.dim, self.ffn_dim
        return self.ffn_matrices * d * f + ((f + d) if self.arch == "gpt" else 0)

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.dense_layers_first

    def block_params(self, layer: int, active: bool = False) -> int:
        """Block `layer` (0-based): attention, its MLP (dense, or the MoE layer's router and experts,
        only those a token runs when `active`) and two norms (LayerNorm: with biases)."""
        norms = 2 * self.dim if self.arch == "llama" else 2 * 2 * self.dim
        mlp = self.moe.layer_params(self.dim, active) if self.is_moe_layer(layer) else self.dense_mlp_params()
        return self.attention_params() + mlp + norms

    def embedding_params(self) -> int:
        """Token embedding (plus learned positions for GPT)."""
        pos = self.max_seq_len * self.dim if self.arch == "gpt" else 0
        return self.vocab_size * self.dim + pos

    def head_params(self) -> int:
        """Final norm and the output projection (zero extra when tied)."""
        norm = self.dim if self.arch == "llama" else 2 * self.dim
        return norm + (0 if self.tied_embeddings else self.vocab_size * self.dim)

    def num_params(self) -> int:
        # Kept on the (frozen) spec: the planner's memory bound asks for it once per mesh, and summing
        # 126 blocks each time showed in profiles.
        n = self.__dict__.get("_num_params")
        if n is None:
            n = self.embedding_params() + sum(self.block_params(i) for i in range(self.n_layers)) + self.head_params()
            object.__setattr__(self, "_num_params", n)
        return n

    def active_params(self) -> int:
        """Parameters one token runs through: all but the routed experts the router did not pick
        (Mistral's and DeepSeek's convention; OpenAI's GPT-OSS figure also leaves out the embedding)."""
        blocks = sum(self.block_params(i, active=True) for i in range(self.n_layers))
        return self.embedding_params() + blocks + self.head_params()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key, default in OPTIONAL_FIELDS.items():
            if out[key] == default:
                del out[key]
        if out.get("moe") and out["moe"]["activation_clamp"] is None:
            del out["moe"]["activation_clamp"]  # an unclamped SwiGLU, as every MoE plan written before it
        if out.get("moe") and out["moe"]["expert_groups"] == 1:
            del out["moe"]["expert_groups"], out["moe"]["groups_per_token"]  # ungrouped routing, likewise
        return out

    @classmethod
    def from_dict(cls, data: Any, field: str = "model") -> "ModelSpec":
        data = require_mapping(data, field)
        reject_unknown(data, cls.__dataclass_fields__, field)
        for key in ("name", "dim", "n_layers", "n_heads", "ffn_dim", "vocab_size"):
            if key not in data:
                raise InputError(f"{field}.{key}", "is required")
        arch = as_choice(data.get("arch", "llama"), f"{field}.arch", ARCHS)
        n_heads = as_int(data["n_heads"], f"{field}.n_heads", 1, maximum=MAX_WIDTH)
        dim = as_int(data["dim"], f"{field}.dim", 1, maximum=MAX_WIDTH)
        n_kv = as_int(data.get("n_kv_heads", n_heads), f"{field}.n_kv_heads", 1, maximum=MAX_WIDTH)
        n_layers = as_int(data["n_layers"], f"{field}.n_layers", 1, maximum=MAX_LAYERS)
        if dim % n_heads:
            raise InputError(f"{field}.dim", f"must be divisible by n_heads ({n_heads}), got {dim}")
        if n_heads % n_kv:
            raise InputError(f"{field}.n_kv_heads", f"must divide n_heads ({n_heads}), got {n_kv}")
        defaults = cls.__dataclass_fields__
        return cls(
            name=as_str(data["name"], f"{field}.name"),
            arch=arch,
            dim=dim,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            ffn_dim=as_int(data["ffn_dim"], f"{field}.ffn_dim", 1, maximum=MAX_WIDTH),
            vocab_size=as_int(data["vocab_size"], f"{field}.vocab_size", 2, maximum=MAX_WIDTH),
            tied_embeddings=as_bool(data.get("tied_embeddings", False), f"{field}.tied_embeddings"),
            max_seq_len=as_int(data.get("max_seq_len", defaults["max_seq_len"].default), f"{field}.max_seq_len", 1),
            norm_eps=as_float(data.get("norm_eps", defaults["norm_eps"].default), f"{field}.norm_eps", 0.0, True),
            rope_theta=as_float(data.get("rope_theta", defaults["rope_theta"].default), f"{field}.rope_theta", 0.0, True),
            **_optional_parts(data, field, n_layers),
        )


def _optional_parts(data: dict[str, Any], field: str, n_layers: int) -> dict[str, Any]:
    """The optional fields of a model mapping, validated (OPTIONAL_FIELDS)."""
    out: dict[str, Any] = {}
    if data.get("attention_head_dim") is not None:
        out["attention_head_dim"] = as_int(data["attention_head_dim"], f"{field}.attention_head_dim", 1, maximum=MAX_WIDTH)
    for key in ("qk_norm", "attention_bias", "attention_sinks"):
        if key in data:
            out[key] = as_bool(data[key], f"{field}.{key}")
    if data.get("sliding_window") is not None:
        out["sliding_window"] = as_int(data["sliding_window"], f"{field}.sliding_window", 1)
        out["full_attention_every"] = as_int(data.get("full_attention_every", 0), f"{field}.full_attention_every", 0)
    if data.get("rope_yarn_factor") is not None:
        out["rope_yarn_factor"] = as_float(data["rope_yarn_factor"], f"{field}.rope_yarn_factor", 1.0, True)
    if data.get("mla") is not None:
        out["mla"] = data["mla"] if isinstance(data["mla"], MLASpec) else MLASpec.from_dict(data["mla"], f"{field}.mla")
    if data.get("moe") is not None:
        moe = data["moe"] if isinstance(data["moe"], MoESpec) else MoESpec.from_dict(data["moe"], f"{field}.moe")
        if moe.dense_layers_first >= n_layers:
            raise InputError(f"{field}.moe.dense_layers_first",
                             f"must be below n_layers ({n_layers}) for any layer to be MoE, got {moe.dense_layers_first}")
        out["moe"] = moe
    return out
