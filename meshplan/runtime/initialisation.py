"""Initial weights: a function of (seed, parameter name, element index) only, drawn where they live.

Each element of a weight is a counter-based normal draw: splitmix64 of (a key of seed and the
parameter's name, the element's index in the full tensor), turned into N(0, 1) by Box-Muller. So a
rank computes exactly its own shard (FSDP, TP, or both, even or uneven), on its own device, with no
communication and no full tensor: start-up work shrinks with a rank's share of the parameters, and
every layout starts from the same values (losses agree across layouts; tests/runtime/test_layouts.py).
The draw is integer arithmetic (wrapping int64) plus elementwise float32 maths, the same on CPU and
CUDA up to the last bit of log/cos.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn

from meshplan.specs.model import ModelSpec

INIT_STD = 0.02
# The projections that write into the residual stream: their std is scaled by 1/sqrt(2*n_layers).
RESIDUAL_PROJECTIONS = ("attention.wo.weight", "feed_forward.w2.weight", "moe.experts.w2", "moe.shared_experts.w2.weight")
WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.", "module.")
# Elements drawn per chunk: bounds the int64 index and float32 work tensors (~16 bytes an element).
CHUNK = 1 << 24

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(x: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits."""
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def _srl(z: torch.Tensor, k: int, out: torch.Tensor) -> torch.Tensor:
    """Logical right shift of int64 bits into `out` (torch's >> is arithmetic)."""
    torch.bitwise_right_shift(z, k, out=out)
    return out.bitwise_and_((1 << (64 - k)) - 1)


def stream_key(seed: int, fqn: str) -> int:
    """The counter stream of one parameter: a 64-bit key of the seed and the parameter's name."""
    z = (seed * 1_000_003 + zlib.crc32(fqn.encode())) & _MASK64
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
    return _signed(z ^ (z >> 31))


def counter_normal(key: int, index: torch.Tensor) -> torch.Tensor:
    """N(0, 1) float32 draws for the elements at `index` (int64) of stream `key`: splitmix64 of
    key + (index + 1) * golden ratio, two 24-bit uniforms from its bits, Box-Muller. In place on
    one copy of the index (about 4x torch.randn's time per element on a CPU)."""
    z = (index + 1).mul_(_signed(_GOLDEN)).add_(key)
    tmp = torch.empty_like(z)
    z.bitwise_xor_(_srl(z, 30, tmp)).mul_(_signed(_MIX1))
    z.bitwise_xor_(_srl(z, 27, tmp)).mul_(_signed(_MIX2))
    z.bitwise_xor_(_srl(z, 31, tmp))
    u1 = _srl(z, 40, tmp).to(torch.float32).add_(0.5).mul_(1.0 / (1 << 24))
    angle = z.bitwise_right_shift_(16).bitwise_and_(0xFFFFFF).to(torch.float32).add_(0.5).mul_(2 * math.pi / (1 << 24))
    return u1.log_().mul_(-2.0).sqrt_().mul_(angle.cos_())


def canonical_fqn(name: str) -> str:
    """The parameter's name in the plain, unwrapped model (wrappers insert path components)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def init_kind(fqn: str, spec: ModelSpec) -> tuple[str, float]:
    """("zeros" | "ones" | "normal", std) for parameter `fqn`: N(0, 0.02) weights (residual
    projections scaled by 1/sqrt(2*n_layers), as GPT-2), zero biases, unit norm weights."""
    leaf = fqn.rsplit(".", 1)[-1]
    is_norm = "norm" in fqn.rsplit(".", 2)[-2] if "." in fqn else False
    if leaf.endswith("bias"):  # nn.Linear's bias, the routed experts' w1_bias, w2_bias, w3_bias
        return "zeros", 0.0
    if is_norm:
        return "ones", 0.0
    if fqn.endswith(RESIDUAL_PROJECTIONS):
        return "normal", INIT_STD / math.sqrt(2 * spec.n_layers)
    return "normal", INIT_STD


def local_indices(param: torch.Tensor) -> list[torch.Tensor]:
    """For each dim, the global indices this rank holds of `param` (a DTensor's local shard, or all
    of a plain tensor). DTensor slices a per-dim arange as it slices the weight (its own placement
    rules: even, uneven, strided), locally, without communication."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    shape = tuple(param.shape)
    if not isinstance(param, DTensor):
        return [torch.arange(n, device=param.device) for n in shape]
    out = []
    for d, n in enumerate(shape):
        along = [p if getattr(p, "dim", None) == d else Replicate() for p in param.placements]
        ix = torch.arange(n, device=param.to_local().device).view([n if i == d else 1 for i in range(len(shape))])
        local = distribute_tensor(ix, param.device_mesh, along, src_data_rank=None).to_local()
        out.append(local.reshape(-1))
    return out


@torch.no_grad()
def fill_normal(local: torch.Tensor, key: int, indices: list[torch.Tensor], shape: tuple[int, ...], std: float) -> None:
    """Write the draws of `local`'s elements (global indices per dim) into it, dim-0 rows at a time."""
    if local.dim() == 0:
        local.copy_(counter_normal(key, torch.zeros((), dtype=torch.int64, device=local.device)) * std)
        return
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    inner = None
    for d in range(1, len(shape)):
        term = (indices[d] * strides[d]).view([-1 if i == d else 1 for i in range(1, len(shape))])
        inner = term if inner is None else inner + term
    rows_per_chunk = max(1, CHUNK // max(1, local[0].numel()))
    for start in range(0, local.shape[0], rows_per_chunk):
        rows = indices[0][start:start + rows_per_chunk] * strides[0]
        flat = rows.view([-1] + [1] * (len(shape) - 1))
        if inner is not None:
            flat = flat + inner.unsqueeze(0)
        local[start:start + rows_per_chunk].copy_(counter_normal(key, flat) * std)


@torch.no_grad()
def init_weights(model: nn.Module, spec: ModelSpec, seed: int) -> None:
    """Fill every parameter (this rank's shard of it) with its layout-independent initial value; every
    buffer (an MoE layer's expert bias and routing counters) starts at zero."""
    from torch.distributed.tensor import DTensor

    for buf in model.buffers():
        buf.zero_()
    for name, param in model.named_parameters():
        fqn = canonical_fqn(name)
        local = param.to_local() if isinstance(param, DTensor) else param
        kind, std = init_kind(fqn, spec)
        if kind == "zeros":
            local.zero_()
        elif kind == "ones":
            local.fill_(1.0)
        elif local.numel():
            fill_normal(local, stream_key(seed, fqn), local_indices(param), tuple(param.shape), std)


def init_value(fqn: str, shape: torch.Size, spec: ModelSpec, seed: int) -> torch.Tensor:
    """The full initial value of parameter `fqn` (fp32, on the CPU): what every layout's shards tile."""
    out = torch.empty(tuple(shape))
    kind, std = init_kind(fqn, spec)
    if kind == "normal":
        fill_normal(out, stream_key(seed, fqn), local_indices(out), tuple(shape), std)
    else:
        out.fill_(0.0 if kind == "zeros" else 1.0)
    return out
