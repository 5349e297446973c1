"""Model files: meshplan's own model YAML, or a Hugging Face `config.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from meshplan.errors import InputError
from meshplan.fields import as_bool, as_float, as_int, require_mapping
from meshplan.specs.model import MAX_LAYERS, ModelSpec
from meshplan.specs.moe import MLASpec
from meshplan.yamlio import load_yaml_file

# HF `model_type` -> meshplan arch. GPT-2 style configs use other key names (n_embd, n_layer...).
HF_LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "gpt_oss")
HF_GPT_TYPES = ("gpt2", "gpt_bigcode", "gpt_neox")


def load_model_file(path: Path, field: str = "model") -> ModelSpec:
    data = load_yaml_file(path, field)
    data = require_mapping(data, field)
    if "model_type" in data or "hidden_size" in data or "n_embd" in data:
        return from_hf_config(data, name=path.parent.name or path.stem, field=field)
    if "model" in data and isinstance(data["model"], Mapping):
        data = data["model"]
    return ModelSpec.from_dict(dict(data), field)


def _get(cfg: Mapping[str, Any], keys: tuple[str, ...], field: str, default: Any = None) -> Any:
    for key in keys:
        if key in cfg and cfg[key] is not None:
            return cfg[key]
    if default is not None:
        return default
    raise InputError(f"{field}.{keys[0]}", "is required in config.json")


def from_hf_config(cfg: Mapping[str, Any], name: str, field: str = "model") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json mapping."""
    cfg = require_mapping(cfg, field)
    model_type = str(cfg.get("model_type", "llama")).lower()
    if model_type in HF_GPT_TYPES:
        arch = "gpt"
    elif model_type in HF_LLAMA_TYPES or "num_key_value_heads" in cfg or "intermediate_size" in cfg:
        arch = "llama"
    else:
        raise InputError(f"{field}.model_type", f"unsupported {model_type!r}; valid: {', '.join(HF_LLAMA_TYPES + HF_GPT_TYPES)}")
    dim = as_int(_get(cfg, ("hidden_size", "n_embd"), field), f"{field}.hidden_size", 1)
    heads = as_int(_get(cfg, ("num_attention_heads", "n_head"), field), f"{field}.num_attention_heads", 1)
    kv = as_int(_get(cfg, ("num_key_value_heads",), field, heads), f"{field}.num_key_value_heads", 1)
    ffn_default = 4 * dim
    ffn = as_int(_get(cfg, ("intermediate_size", "n_inner"), field, ffn_default), f"{field}.intermediate_size", 1)
    spec = {
        "name": str(cfg.get("_name_or_path") or name or "hf-model"),
        "arch": arch,
        "dim": dim,
        "n_layers": as_int(_get(cfg, ("num_hidden_layers", "n_layer"), field), f"{field}.num_hidden_layers", 1,
                           maximum=MAX_LAYERS),
        "n_heads": heads,
        "n_kv_heads": kv,
        "ffn_dim": ffn,
        "vocab_size": as_int(_get(cfg, ("vocab_size",), field), f"{field}.vocab_size", 2),
        "tied_embeddings": as_bool(cfg.get("tie_word_embeddings", arch == "gpt"), f"{field}.tie_word_embeddings"),
        "max_seq_len": as_int(_get(cfg, ("max_position_embeddings", "n_positions"), field, 131072),
                              f"{field}.max_position_embeddings", 1),
        "norm_eps": as_float(_get(cfg, ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"), field, 1e-5),
                             f"{field}.rms_norm_eps", 0.0, exclusive_min=True),
    }
    if arch == "llama":
        spec["rope_theta"] = as_float(cfg.get("rope_theta", 10000.0), f"{field}.rope_theta", 0.0, exclusive_min=True)
        spec.update(_hf_attention(cfg, model_type, dim, heads, field))
        spec.update(_hf_moe(cfg, model_type, field))
    return ModelSpec.from_dict(spec, field)


def _hf_attention(cfg: Mapping[str, Any], model_type: str, dim: int, heads: int, field: str) -> dict[str, Any]:
    """Head width, q/k norms, biases, sinks and MLA, under the names Qwen3, GPT-OSS and DeepSeek use."""
    out: dict[str, Any] = {}
    if cfg.get("kv_lora_rank"):  # DeepSeek-V2/V3 multi-head latent attention (head widths its own)
        fields = {k: cfg.get(k) for k in MLASpec.__dataclass_fields__}
        fields["q_lora_rank"] = fields["q_lora_rank"] or 0  # null: queries without a bottleneck (V2-Lite)
        out["mla"] = MLASpec.from_dict(fields, f"{field}.mla")
    elif cfg.get("head_dim") is not None:
        head_dim = as_int(cfg["head_dim"], f"{field}.head_dim", 1)
        if head_dim * heads != dim:
            out["attention_head_dim"] = head_dim
    if model_type.startswith("qwen3"):
        out["qk_norm"] = True  # Qwen3's q_norm / k_norm (modeling_qwen3), not flagged in its config
    if model_type == "gpt_oss":
        out["attention_sinks"] = True  # GPT-OSS's per-head sinks (modeling_gpt_oss), likewise implicit
    if cfg.get("attention_bias"):
        out["attention_bias"] = as_bool(cfg["attention_bias"], f"{field}.attention_bias")
    out.update(_hf_sliding_window(cfg, field))
    if "mla" not in out:
        out.update(_hf_rope_scaling(cfg, field))
    return out


def _hf_rope_scaling(cfg: Mapping[str, Any], field: str) -> dict[str, Any]:
    """YaRN's factor where the config scales RoPE so (rope_scaling {rope_type or type: yarn, factor}: GPT-OSS).
    Other scalings (Llama 3's, linear, dynamic) change no kernel a stack runs and are not kept, nor is YaRN
    under MLA (DeepSeek-V2/V3: _hf_attention skips it), which puts its temperature into the softmax scale
    and changes no kernel either: the import then reads as the registry's DeepSeek-V3, which the runtime
    builds with plain RoPE."""
    scaling = cfg.get("rope_scaling")
    if not isinstance(scaling, Mapping) or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return {}
    return {"rope_yarn_factor": as_float(scaling.get("factor", 1.0), f"{field}.rope_scaling.factor", 1.0, True)}


def _hf_sliding_window(cfg: Mapping[str, Any], field: str) -> dict[str, Any]:
    """A sliding window in a periodic share of the layers (`layer_types`: GPT-OSS alternates sliding and
    full); a window in every layer where the config gives one without `layer_types`."""
    window, types = cfg.get("sliding_window"), cfg.get("layer_types")
    if not window or cfg.get("use_sliding_window") is False:
        return {}
    window = as_int(window, f"{field}.sliding_window", 1)
    if types is not None and not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
        raise InputError(f"{field}.layer_types", "must be a list of attention kinds (e.g. sliding_attention)")
    full = [i for i, t in enumerate(types or []) if t == "full_attention"]
    if not full:
        return {"sliding_window": window, "full_attention_every": 0}
    every = full[0] + 1
    if full != list(range(every - 1, len(types), every)):
        raise InputError(f"{field}.layer_types", "only a periodic pattern (full attention every k-th layer) is supported")
    return {"sliding_window": window, "full_attention_every": every}


def _hf_moe(cfg: Mapping[str, Any], model_type: str, field: str) -> dict[str, Any]:
    """The MoE fields of Mixtral, Qwen3-MoE, DeepSeek-V2/V3 and GPT-OSS configs, or nothing for a dense one."""
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if not experts:
        return {}
    # Mixtral and GPT-OSS give the expert width as intermediate_size; the others as moe_intermediate_size.
    expert_ffn = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    if cfg.get("mlp_only_layers") or (cfg.get("decoder_sparse_step") or 1) != 1:
        raise InputError(f"{field}.decoder_sparse_step", "MoE layers other than every layer after the first dense "
                                                         "ones are not supported")
    moe = {"experts": experts, "top_k": _get(cfg, ("num_experts_per_tok", "experts_per_token"), field),
           "expert_ffn_dim": expert_ffn, "shared_experts": cfg.get("n_shared_experts") or 0,
           "dense_layers_first": cfg.get("first_k_dense_replace") or 0,
           "router": "sigmoid" if cfg.get("scoring_func") == "sigmoid" else "softmax",
           "load_balance": "bias" if cfg.get("topk_method") == "noaux_tc" else "aux_loss",
           "bias": model_type == "gpt_oss"}
    if (cfg.get("n_group") or 1) > 1:
        # DeepSeek's group-limited routing. DeepSeek-V2's greedy rule ranks groups by their best score where
        # V3's ranks them by the sum of their best two (MoESpec.expert_groups): as many groups a token either way.
        moe["expert_groups"], moe["groups_per_token"] = cfg["n_group"], cfg.get("topk_group") or 1
    if cfg.get("swiglu_limit") is not None:  # GPT-OSS's clamped SwiGLU
        moe["activation_clamp"] = cfg["swiglu_limit"]
    return {"moe": moe}
