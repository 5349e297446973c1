"""Built-in models, their aliases, and resolution of a `model:` value (name, file path or mapping)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec
from meshplan.specs.moe import MLASpec, MoESpec


def _llama(name: str, dim: int, layers: int, heads: int, kv: int, ffn: int, vocab: int, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, arch="llama", dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv,
                     ffn_dim=ffn, vocab_size=vocab, **kw)


def _gpt(name: str, dim: int, layers: int, heads: int, vocab: int = 51200, seq: int = 2048, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, arch="gpt", dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=heads,
                     ffn_dim=4 * dim, vocab_size=vocab, max_seq_len=seq, **kw)


def _moe(name: str, dim: int, layers: int, heads: int, kv: int, ffn: int, vocab: int, experts: int, top_k: int,
         expert_ffn: int, *, shared: int = 0, dense_first: int = 0, router: str = "softmax",
         load_balance: str = "aux_loss", moe_bias: bool = False, clamp: float | None = None,
         groups: tuple[int, int] = (1, 1), **kw: Any) -> ModelSpec:
    moe = MoESpec(experts=experts, top_k=top_k, expert_ffn_dim=expert_ffn, shared_experts=shared,
                  dense_layers_first=dense_first, router=router, load_balance=load_balance, bias=moe_bias,
                  activation_clamp=clamp, expert_groups=groups[0], groups_per_token=groups[1])
    return _llama(name, dim, layers, heads, kv, ffn, vocab, moe=moe, **kw)


# Mixture-of-experts shapes: ../shared/data/published/moe_model_configs.csv names each source (the
# model's own config or Megatron-Bridge's provider). `ffn` is the dense MLP of DeepSeek's first layers,
# else the config's intermediate_size, which no layer uses when every layer is MoE.
MOE_MODELS = [
    _moe("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, 8, 2, 14336, rope_theta=1e6, max_seq_len=32768),
    _moe("mixtral-8x22b", 6144, 56, 48, 8, 16384, 32000, 8, 2, 16384, rope_theta=1e6, max_seq_len=65536),
    _moe("qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936, 128, 8, 768, attention_head_dim=128, qk_norm=True,
         rope_theta=1e6, max_seq_len=40960, norm_eps=1e-6),
    _moe("qwen3-235b-a22b", 4096, 94, 64, 4, 12288, 151936, 128, 8, 1536, attention_head_dim=128, qk_norm=True,
         rope_theta=1e6, max_seq_len=40960, norm_eps=1e-6),
    # Qwen2-57B-A14B: its one shared expert of width 20480 as eight of the routed width (2560): a SwiGLU is a sum
    # over its hidden units, so the FLOPs, bytes and function are the same. Left out, as too small to price: the
    # shared expert's scalar sigmoid gate (one row of `dim`) and the q, k, v biases (4608 a layer).
    _moe("qwen2-57b-a14b", 3584, 28, 28, 4, 18944, 151936, 64, 8, 2560, shared=8, rope_theta=1e6,
         max_seq_len=131072, norm_eps=1e-6),
    # DeepSeek-V3 671B without its multi-token-prediction module (DeepSeek's 671B excludes it). Its YaRN (factor
    # 40) is left unstated: under MLA it puts no temperature into the rotation (ModelSpec.yarn_mscale), so no
    # stack runs another kernel for it, and the runtime, which builds plain RoPE, runs the registry's model.
    # Its router picks among 4 of 8 expert groups (config.json n_group 8, topk_group 4; Megatron-Bridge's
    # DeepSeekV3ModelProvider moe_router_num_groups 8, moe_router_group_topk 4).
    _moe("deepseek-v3", 7168, 61, 128, 128, 18432, 129280, 256, 8, 2048, shared=1, dense_first=3, router="sigmoid",
         load_balance="bias", groups=(8, 4), rope_theta=10000.0, max_seq_len=163840, norm_eps=1e-6,
         mla=MLASpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)),
    _moe("deepseek-v3-16b", 2048, 27, 16, 16, 10944, 102400, 64, 6, 1408, shared=2, dense_first=1,
         rope_theta=10000.0, max_seq_len=163840, norm_eps=1e-6,
         mla=MLASpec(q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)),
    # GPT-OSS as published: 128-token sliding windows in every other layer, its SwiGLU clamped at 7 (swiglu_limit),
    # its RoPE scaled by YaRN's factor 32 (rope_scaling).
    _moe("gpt-oss-120b", 2880, 36, 64, 8, 2880, 201088, 128, 4, 2880, moe_bias=True, clamp=7.0, attention_head_dim=64,
         attention_bias=True, attention_sinks=True, sliding_window=128, full_attention_every=2, rope_theta=150000.0,
         max_seq_len=131072, rope_yarn_factor=32.0),
    _moe("gpt-oss-20b", 2880, 24, 64, 8, 2880, 201088, 32, 4, 2880, moe_bias=True, clamp=7.0, attention_head_dim=64,
         attention_bias=True, attention_sinks=True, sliding_window=128, full_attention_every=2, rope_theta=150000.0,
         max_seq_len=131072, rope_yarn_factor=32.0),
    # For tests: 8 experts, top-2, one shared expert, one dense first layer.
    _moe("tiny-moe", 64, 4, 4, 2, 128, 256, 8, 2, 32, shared=1, dense_first=1, max_seq_len=256, rope_theta=10000.0),
    # For tests: DeepSeek-V3's block at toy size (MLA with a query bottleneck, sigmoid router with the
    # aux-loss-free bias, a shared expert, one dense first layer).
    _moe("tiny-deepseek", 64, 4, 4, 4, 128, 256, 8, 2, 32, shared=1, dense_first=1, router="sigmoid",
         load_balance="bias", max_seq_len=256, rope_theta=10000.0,
         mla=MLASpec(q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16)),
    # Not a published model: meshplan's own MoE of about 0.92B parameters (0.22B active), Mixtral's block at a
    # quarter of its width with 16 experts, for the MoE runtime's check on one GPU (benchmarks/gpu_session.sh).
    _moe("moe-1b", 1024, 16, 16, 8, 4096, 32000, 16, 2, 1024, rope_theta=1e6, max_seq_len=4096),
]

# Llama 3.1 shapes from Meta's model cards / params.json; Llama 2 from the Llama 2 paper; GPT-3 from Brown et al.
BUILTIN_MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        _llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256),
        _llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256),
        _llama("llama3-405b", 16384, 126, 128, 8, 53248, 128256),
        # Llama 3.2 1B / 3B (Meta's model cards and config.json): tied input and output embeddings.
        _llama("llama3.2-1b", 2048, 16, 32, 8, 8192, 128256, tied_embeddings=True),
        _llama("llama3.2-3b", 3072, 28, 24, 8, 8192, 128256, tied_embeddings=True),
        _llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000, rope_theta=10000.0, max_seq_len=4096),
        _llama("llama2-13b", 5120, 40, 40, 40, 13824, 32000, rope_theta=10000.0, max_seq_len=4096),
        _llama("llama2-70b", 8192, 80, 64, 8, 28672, 32000, rope_theta=10000.0, max_seq_len=4096),
        _gpt("gpt3-175b", 12288, 96, 96),
        # Tiny models for CPU tests and runs on this machine.
        _llama("tiny", 64, 2, 4, 2, 128, 256, max_seq_len=256, rope_theta=10000.0),
        _llama("tiny-4l", 64, 4, 4, 2, 128, 256, max_seq_len=256, rope_theta=10000.0),
        _gpt("tiny-gpt", 64, 2, 4, vocab=256, seq=256),
        _llama("small", 256, 8, 8, 4, 704, 4096, max_seq_len=1024, rope_theta=10000.0),
        *MOE_MODELS,
    ]
}

ALIASES: dict[str, str] = {}
for size in ("8b", "70b", "405b"):
    for prefix in ("llama", "llama3-", "llama3.1-", "llama-3.1-", "llama3_1-", "meta-llama-3.1-"):
        ALIASES[f"{prefix}{size}"] = f"llama3-{size}"
for size in ("7b", "13b", "70b"):
    for prefix in ("llama2-", "llama-2-"):
        ALIASES[f"{prefix}{size}"] = f"llama2-{size}"
ALIASES.update({"gpt3": "gpt3-175b", "gpt-175b": "gpt3-175b", "gpt3-175b": "gpt3-175b", "tiny-llama": "tiny"})


def list_models() -> list[tuple[ModelSpec, list[str]]]:
    """Each built-in model with the aliases that name it."""
    out = []
    for name, spec in BUILTIN_MODELS.items():
        aliases = sorted(a for a, target in ALIASES.items() if target == name and a != name)
        out.append((spec, aliases))
    return out


def resolve_model(value: Any, field: str = "model") -> ModelSpec:
    """A registry name or alias, a path to a model YAML or HF config.json, or an inline mapping."""
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, dict):
        return ModelSpec.from_dict(value, field)
    if not isinstance(value, str) or not value:
        raise InputError(field, f"must be a model name, a file path or a mapping, got {value!r}")
    key = value.strip().lower()
    name = ALIASES.get(key, key)
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name]
    path = Path(value)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        from meshplan.specs.model_file import load_model_file

        return load_model_file(path, field)
    valid = ", ".join(BUILTIN_MODELS)
    raise InputError(field, f"unknown model {value!r}; valid: {valid} (or a path to a model YAML / config.json)")
