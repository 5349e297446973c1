"""Built-in models, their aliases, and resolution of a `model:` value (name, file path or mapping)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec


def _llama(name: str, dim: int, layers: int, heads: int, kv: int, ffn: int, vocab: int, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, arch="llama", dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=kv,
                     ffn_dim=ffn, vocab_size=vocab, **kw)


def _gpt(name: str, dim: int, layers: int, heads: int, vocab: int = 51200, seq: int = 2048, **kw: Any) -> ModelSpec:
    return ModelSpec(name=name, arch="gpt", dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=heads,
                     ffn_dim=4 * dim, vocab_size=vocab, max_seq_len=seq, **kw)


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
