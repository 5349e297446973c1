"""Device compute benchmarks: matmul throughput over a shape grid, causal attention fwd+bwd, copy bandwidth."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from meshplan.bench.env import BenchEnv
from meshplan.bench.progress import Reporter
from meshplan.bench.timing import Budget, time_local
from meshplan.specs.rules import grouped_mm_kernel

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# fp8 tensor cores: Ada (8.9) and Hopper (9.0) and later; torch._scaled_mm refuses fp8 below 8.9
FP8_MIN_CAPABILITY = (8, 9)
# cuBLASLt fp8 GEMMs need every dimension a multiple of 16 (torch's _scaled_mm checks it on CUDA)
FP8_DIM_MULTIPLE = 16
# bf16 is dropped on a CPU that runs it at under this fraction of its fp32 rate (no native bf16 GEMM)
CPU_BF16_MIN_RATIO = 0.25


@dataclass
class ComputeSettings:
    target_s: float  # timing per point
    min_reps: int


@dataclass
class ComputeResults:
    dtypes: list[str]
    matmul_points: list[dict] = field(default_factory=list)
    attention_points: list[dict] = field(default_factory=list)
    attention_dtype: str = "fp32"
    memory_bandwidth_gbs: float = 0.0
    notes: list[str] = field(default_factory=list)


def _matmul_once(m: int, n: int, k: int, dtype: torch.dtype, device: torch.device, settings: ComputeSettings,
                 sync) -> tuple[float, float]:
    """(median TFLOP/s, spread) of an (m, k) @ (k, n) product."""
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    meas = time_local(lambda: torch.mm(a, b), sync, settings.target_s, settings.min_reps)
    return 2.0 * m * n * k / meas.median_s / 1e12, meas.spread


def fp8_supported(device: torch.device, capability: tuple[int, int] | None) -> bool:
    """fp8 matmul is measured on CUDA devices of compute capability >= 8.9 (H100/H200/B200, L40S)."""
    return device.type == "cuda" and capability is not None and tuple(capability) >= FP8_MIN_CAPABILITY


def _fp8_note(env: BenchEnv, capability: tuple[int, int] | None) -> str | None:
    """Why fp8 is not measured here, or None when it is."""
    if fp8_supported(env.device, capability):
        return None
    if not env.is_cuda:
        return "fp8 matmul not measured (CPU: no fp8 GEMM units; float8 plans are priced only where a profile has fp8)"
    return (f"fp8 matmul not measured (compute capability {capability[0]}.{capability[1]} < "
            f"{FP8_MIN_CAPABILITY[0]}.{FP8_MIN_CAPABILITY[1]})")


def choose_dtypes(env: BenchEnv, settings: ComputeSettings) -> tuple[list[str], list[str]]:
    """Dtypes to measure and notes on those left out."""
    if env.is_cuda:
        # TF32 off so fp32 means fp32
        torch.backends.cuda.matmul.allow_tf32 = False
        capability = torch.cuda.get_device_capability(env.device)
        fp8 = _fp8_note(env, capability)
        # fp8 before fp32: float8 plans need it, and a tight budget cuts the last dtype first
        dtypes = ["bf16", "fp32"] if fp8 else ["bf16", "fp8", "fp32"]
        return dtypes, ["tf32 / fp16 matmul not measured"] + ([fp8] if fp8 else [])
    notes = [_fp8_note(env, None)]
    probe = ComputeSettings(target_s=0.02, min_reps=2)
    fp32, _ = _matmul_once(256, 256, 256, torch.float32, env.device, probe, env.sync)
    bf16, _ = _matmul_once(256, 256, 256, torch.bfloat16, env.device, probe, env.sync)
    if env.agree(bf16 >= CPU_BF16_MIN_RATIO * fp32):
        return ["fp32", "bf16"], notes
    return ["fp32"], [f"bf16 left out: {bf16 * 1e3:.1f} GFLOP/s vs fp32 {fp32 * 1e3:.1f} GFLOP/s at 256^3 (no native bf16 GEMM)"] + notes


def fp8_operand(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn data, float32 per-tensor scale) with x ~= data * scale: the tensor's largest
    magnitude maps to e4m3's largest finite value (448), as torchao's tensorwise recipe does."""
    fp8_max = torch.finfo(torch.float8_e4m3fn).max
    amax = x.abs().amax().float().clamp(min=1e-12)  # an all-zero tensor keeps a finite scale
    scale = amax / fp8_max
    return (x.float() / scale).clamp(-fp8_max, fp8_max).to(torch.float8_e4m3fn), scale


def scaled_matmul(a8: torch.Tensor, a_scale: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """(a8 * a_scale) @ (w8 * w_scale).T in bf16, one fp8 GEMM. `w8` is row-major (n, k), like a Linear
    weight; its .t() is the column-major (k, n) operand cuBLASLt needs for `b`. The scales are the
    dequantizing multipliers (torch._scaled_mm's scale_a / scale_b, same in torch 2.11 and 2.13)."""
    return torch._scaled_mm(a8, w8.t(), scale_a=a_scale, scale_b=w_scale, out_dtype=torch.bfloat16)


def _fp8_matmul_once(m: int, n: int, k: int, device: torch.device, settings: ComputeSettings,
                     sync) -> tuple[float, float]:
    """(median TFLOP/s, spread) of an fp8 (m, k) @ (k, n) product with per-tensor scales; casts not timed
    (the cost model prices float8 casts apart from the GEMM)."""
    a8, sa = fp8_operand(torch.randn(m, k, device=device))
    w8, sw = fp8_operand(torch.randn(n, k, device=device))
    meas = time_local(lambda: scaled_matmul(a8, sa, w8, sw), sync, settings.target_s, settings.min_reps)
    return 2.0 * m * n * k / meas.median_s / 1e12, meas.spread


def bench_matmul(env: BenchEnv, shapes: list[tuple[int, int, int]], dtypes: list[str], settings: ComputeSettings,
                 budget: Budget, rep: Reporter, est_tflops: dict[str, float]) -> list[dict]:
    """TFLOP/s per shape and dtype; each rank measures its own device at the same time as the others."""
    points = []
    for dt in dtypes:
        for m, n, k in _shapes_for(dt, shapes):
            cost = matmul_cost(m, n, k, est_tflops[dt], settings)
            if not env.agree(budget.allows(cost)):
                rep.skip(f"matmul {dt} {m}x{n}x{k} and later shapes (time budget)")
                break
            if dt == "fp8":
                tflops, spread = _fp8_matmul_once(m, n, k, env.device, settings, env.sync)
            else:
                tflops, spread = _matmul_once(m, n, k, TORCH_DTYPES[dt], env.device, settings, env.sync)
            est_tflops[dt] = max(est_tflops[dt] * 0.5, tflops)  # keep the cost estimate near reality
            points.append({"m": m, "n": n, "k": k, "dtype": dt, "tflops": tflops, "spread": spread})
            rep.advance(cost)
    return points


def _grouped_matmul_once(groups: int, m: int, n: int, k: int, dtype: torch.dtype, env: BenchEnv,
                         settings: ComputeSettings, kernel: bool) -> tuple[float, float]:
    """(median TFLOP/s, spread) of `groups` (m, k) @ (k, n) products as the runtime's GroupedExperts runs
    them: its (groups, out, in) weights transposed, one torch._grouped_mm where `kernel`, else a loop."""
    x = torch.randn(groups * m, k, dtype=dtype, device=env.device)
    w = torch.randn(groups, n, k, dtype=dtype, device=env.device).transpose(-2, -1)
    offsets = torch.arange(1, groups + 1, dtype=torch.int32, device=env.device) * m
    parts = x.split(m)

    def run() -> None:
        if kernel:
            torch._grouped_mm(x, w, offs=offsets)
        else:
            torch.cat([p @ w[e] for e, p in enumerate(parts)])

    meas = time_local(run, env.sync, settings.target_s, settings.min_reps)
    return 2.0 * groups * m * n * k / meas.median_s / 1e12, meas.spread


def bench_grouped_matmul(env: BenchEnv, shapes: list[tuple[int, int, int, int]], dtypes: list[str],
                         settings: ComputeSettings, budget: Budget, rep: Reporter,
                         est_tflops: dict[str, float]) -> list[dict]:
    """TFLOP/s of the routed experts' grouped GEMMs per (groups, tokens per group, n, k) and dtype."""
    capability = torch.cuda.get_device_capability(env.device) if env.is_cuda else None
    points = []
    for dt in dtypes:
        kernel = grouped_mm_kernel(env.device.type, dt, capability)
        for g, m, n, k in shapes:
            cost = matmul_cost(g * m, n, k, est_tflops[dt], settings)
            if not env.agree(budget.allows(cost)):
                rep.skip(f"grouped matmul {dt} {g}x{m}x{n}x{k} and later shapes (time budget)")
                break
            tflops, spread = _grouped_matmul_once(g, m, n, k, TORCH_DTYPES[dt], env, settings, kernel)
            points.append({"groups": g, "m": m, "n": n, "k": k, "dtype": dt, "tflops": tflops, "spread": spread,
                           "kernel": "grouped_mm" if kernel else "loop"})
            rep.advance(cost)
    return points


def _shapes_for(dtype: str, shapes: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """fp8 GEMMs only at shapes cuBLASLt takes (the GPU grid's Llama widths all are)."""
    if dtype != "fp8":
        return shapes
    return [s for s in shapes if all(d % FP8_DIM_MULTIPLE == 0 for d in s)]


def matmul_cost(m: int, n: int, k: int, tflops: float, settings: ComputeSettings) -> float:
    one = 2.0 * m * n * k / (tflops * 1e12)
    return max(settings.target_s, settings.min_reps * one) + 2 * one  # + warm-up and allocation


# Attention backward does 2.5x the forward's FLOPs (five s^2 GEMMs against two): FlashAttention's
# convention, and the cost model's (cost_models/constants.py attention_backward_factor).
ATTENTION_BWD_FLOPS = 2.5


def attention_forward_flops(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """Causal forward FLOPs: QK^T and PV are 2 * 2*b*h*s^2*d = 4*b*h*s^2*d, halved for the causal mask."""
    return 2.0 * batch * heads * seq * seq * head_dim


def bench_attention(env: BenchEnv, seq_lens: list[int], head_dims: list[int], dtype: str, settings: ComputeSettings,
                    budget: Budget, rep: Reporter, est_tflops: float) -> list[dict]:
    """F.scaled_dot_product_attention(is_causal=True): forward, and forward + backward, per head size
    and sequence length.

    `tflops` is the forward rate (what AttentionModel.max_fraction describes); `bwd_tflops` is the backward
    rate, from (fwd+bwd time - fwd time) and 2.5x the forward FLOPs.
    """
    batch, heads = (1, 32) if env.is_cuda else (1, 4)
    points = []
    for head_dim in head_dims:
        for s in seq_lens:
            point = _attention_point(env, batch, heads, s, head_dim, dtype, settings, budget, est_tflops)
            if point is None:
                rep.skip(f"attention head_dim {head_dim} seq {s} and longer (time budget)")
                break
            points.append(point)
            est_tflops = max(est_tflops * 0.5, point["tflops"])
            rep.advance(point.pop("cost"))
    return points


def _attention_point(env: BenchEnv, batch: int, heads: int, s: int, head_dim: int, dtype: str,
                     settings: ComputeSettings, budget: Budget, est_tflops: float) -> dict | None:
    """One timed (head_dim, seq_len) point, or None where the budget does not allow it."""
    fwd_flops = attention_forward_flops(batch, heads, s, head_dim)
    one = (1 + ATTENTION_BWD_FLOPS) * fwd_flops / (est_tflops * 1e12)
    cost = 2 * (max(settings.target_s, settings.min_reps * one) + 2 * one)
    if not env.agree(budget.allows(cost)):
        return None
    q, k, v = (torch.randn(batch, heads, s, head_dim, dtype=TORCH_DTYPES[dtype], device=env.device,
                           requires_grad=True) for _ in range(3))
    grad = torch.randn(batch, heads, s, head_dim, dtype=TORCH_DTYPES[dtype], device=env.device)

    def forward() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)  # inputs need grad: the training kernel

    def step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    fwd = time_local(forward, env.sync, settings.target_s, settings.min_reps)
    both = time_local(step, env.sync, settings.target_s, settings.min_reps)
    bwd_s = max(both.median_s - fwd.median_s, 1e-9)
    return {"seq_len": s, "batch": batch, "heads": heads, "head_dim": head_dim, "dtype": dtype,
            "tflops": fwd_flops / fwd.median_s / 1e12, "bwd_tflops": ATTENTION_BWD_FLOPS * fwd_flops / bwd_s / 1e12,
            "spread": max(fwd.spread, both.spread), "cost": cost}


def bench_copy_bandwidth(env: BenchEnv, settings: ComputeSettings) -> tuple[float, float]:
    """(GB/s, spread) of a device-to-device copy: read + write bytes per second, buffer >> last-level cache."""
    nbytes = (1 << 30) if env.is_cuda else (256 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=env.device).fill_(1.0)
    dst = torch.empty_like(src)
    meas = time_local(lambda: dst.copy_(src), env.sync, settings.target_s, settings.min_reps)
    return 2.0 * nbytes / meas.median_s / 1e9, meas.spread


HOST_LINK_BYTES = 256 << 20  # far past the copy engines' setup, a tenth of a second at most


def bench_host_link(env: BenchEnv, settings: ComputeSettings) -> dict[str, float] | None:
    """GB/s one way between the device and pinned host memory, each direction timed alone: device to host (what
    activation offloading writes after a module's forward) and host to device (its reload before the backward).
    Every rank copies at once, as every rank of a run offloads at once, so a host link shared by two GPUs shows.
    None on a CPU process, whose host memory is its device memory."""
    if not env.is_cuda:
        return None
    host = torch.empty(HOST_LINK_BYTES, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(HOST_LINK_BYTES, dtype=torch.uint8, device=env.device)
    d2h = time_local(lambda: host.copy_(device, non_blocking=True), env.sync, settings.target_s, settings.min_reps)
    h2d = time_local(lambda: device.copy_(host, non_blocking=True), env.sync, settings.target_s, settings.min_reps)
    return {"d2h_gbs": HOST_LINK_BYTES / d2h.median_s / 1e9, "h2d_gbs": HOST_LINK_BYTES / h2d.median_s / 1e9}


def warm_up(env: BenchEnv) -> None:
    """First kernels pay for library loading and clock ramp-up; keep that out of the numbers."""
    a = torch.randn(512, 512, device=env.device)
    t = time.perf_counter()
    while time.perf_counter() - t < 0.2:
        a @ a
    env.sync()


def bench_elementwise_efficiency(env: BenchEnv, settings: ComputeSettings, copy_gbs: float) -> float:
    """Bandwidth of an eager elementwise op (c = a * b: two reads, one write) as a fraction of copy bandwidth."""
    nbytes = (1 << 30) if env.is_cuda else (256 << 20)
    a = torch.ones(nbytes // 4, dtype=torch.float32, device=env.device)
    b, c = torch.ones_like(a), torch.empty_like(a)
    meas = time_local(lambda: torch.mul(a, b, out=c), env.sync, settings.target_s, settings.min_reps)
    return min(1.0, 3.0 * nbytes / meas.median_s / 1e9 / copy_gbs)
