"""ModelSpec: the shape of a decoder-only transformer, and its exact parameter count."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from meshplan.errors import InputError
from meshplan.fields import as_bool, as_choice, as_float, as_int, as_str, reject_unknown, require_mapping

ARCHS = ("llama", "gpt")


@dataclass(frozen=True)
class ModelSpec:
    """`llama`: RMSNorm, RoPE, GQA, SwiGLU (3 FFN matrices); `gpt`: LayerNorm, GELU MLP, learned positions."""

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

    def __hash__(self) -> int:
        # Specs key the cost model's caches; hashing twelve fields on every lookup showed in profiles.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f) for f in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def ffn_matrices(self) -> int:
        return 3 if self.arch == "llama" else 2

    def layer_params(self) -> int:
        """Parameters of one transformer block (attention, MLP, two norms; GPT adds biases)."""
        d, kv, f = self.dim, self.kv_dim, self.ffn_dim
        attn = d * d + 2 * d * kv + d * d
        mlp = self.ffn_matrices * d * f
        if self.arch == "llama":
            return attn + mlp + 2 * d
        biases = (d + 2 * kv + d) + (f + d)
        return attn + mlp + biases + 2 * 2 * d

    def embedding_params(self) -> int:
        """Token embedding (plus learned positions for GPT)."""
        pos = self.max_seq_len * self.dim if self.arch == "gpt" else 0
        return self.vocab_size * self.dim + pos

    def head_params(self) -> int:
        """Final norm and the output projection (zero extra when tied)."""
        norm = self.dim if self.arch == "llama" else 2 * self.dim
        return norm + (0 if self.tied_embeddings else self.vocab_size * self.dim)

    def num_params(self) -> int:
        return self.embedding_params() + self.n_layers * self.layer_params() + self.head_params()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, field: str = "model") -> "ModelSpec":
        data = require_mapping(data, field)
        reject_unknown(data, cls.__dataclass_fields__, field)
        for key in ("name", "dim", "n_layers", "n_heads", "ffn_dim", "vocab_size"):
            if key not in data:
                raise InputError(f"{field}.{key}", "is required")
        arch = as_choice(data.get("arch", "llama"), f"{field}.arch", ARCHS)
        n_heads = as_int(data["n_heads"], f"{field}.n_heads", 1)
        dim = as_int(data["dim"], f"{field}.dim", 1)
        n_kv = as_int(data.get("n_kv_heads", n_heads), f"{field}.n_kv_heads", 1)
        if dim % n_heads:
            raise InputError(f"{field}.dim", f"must be divisible by n_heads ({n_heads}), got {dim}")
        if n_heads % n_kv:
            raise InputError(f"{field}.n_kv_heads", f"must divide n_heads ({n_heads}), got {n_kv}")
        defaults = cls.__dataclass_fields__
        return cls(
            name=as_str(data["name"], f"{field}.name"),
            arch=arch,
            dim=dim,
            n_layers=as_int(data["n_layers"], f"{field}.n_layers", 1),
            n_heads=n_heads,
            n_kv_heads=n_kv,
            ffn_dim=as_int(data["ffn_dim"], f"{field}.ffn_dim", 1),
            vocab_size=as_int(data["vocab_size"], f"{field}.vocab_size", 2),
            tied_embeddings=as_bool(data.get("tied_embeddings", False), f"{field}.tied_embeddings"),
            max_seq_len=as_int(data.get("max_seq_len", defaults["max_seq_len"].default), f"{field}.max_seq_len", 1),
            norm_eps=as_float(data.get("norm_eps", defaults["norm_eps"].default), f"{field}.norm_eps", 0.0, True),
            rope_theta=as_float(data.get("rope_theta", defaults["rope_theta"].default), f"{field}.rope_theta", 0.0, True),
        )
