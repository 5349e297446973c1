"""Compute time from the profile: achievable matmul throughput by shape, attention by sequence length,
and memory-bound elementwise work by bytes moved."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.optimize import least_squares

from meshplan.cost_models import forms
from meshplan.cost_models.flops import causal_window_keys
from meshplan.cost_models.layout import DTYPE_BYTES
from meshplan.profiles.schema import ClusterProfile, Device


def compute_dtype(dtype: str, device: Device) -> str:
    return dtype if dtype in device.peak_tflops else ("fp32" if "fp32" in device.peak_tflops else "bf16")


def best_case_tflops(device: Device, dtype: str) -> float:
    """The part's best matmul rate in a compute dtype: its max_fraction of peak (MAMF's best shape)."""
    return device.peak_tflops[dtype] * device.matmul.max_fraction.get(dtype, device.matmul.max_fraction.get("bf16", 0.7))


def matmul_tflops(device: Device, m: float, n: float, k: float, dtype: str) -> float:
    """Achievable TFLOP/s of an (m x k) @ (k x n) matmul."""
    dtype = compute_dtype(dtype, device)
    points = [p for p in device.matmul.points if p.get("dtype") == dtype]
    sustained = device.sustained_fraction  # best-case benchmark rate -> what training sustains
    if points:
        return sustained * _interpolate_points(tuple((p["m"], p["n"], p["k"], p["tflops"]) for p in points), m, n, k)
    h = device.matmul.half_dim
    compute_bound = sustained * best_case_tflops(device, dtype) * (m / (m + h)) * (n / (n + h)) * (k / (k + h))
    return min(compute_bound, _memory_bound_tflops(device, m, n, k, dtype))


def grouped_matmul_time(device: Device, groups: int, m: float, n: float, k: float, dtype: str) -> float:
    """Seconds per group of `groups` (m x k) @ (k x n) products run as one grouped GEMM (an MoE layer's
    routed experts, m tokens each): at the profile's measured grouped rate where it has grouped points in
    this dtype, interpolated over (groups, m, n, k); else each product as a matmul of its own shape. Points
    tagged `transferred` (another part's shape curve, forms.py grouped_rate) count only under that form."""
    transferred = forms.FORMS.grouped_rate == "transferred"
    points = [p for p in device.matmul.grouped_points if p.get("dtype") == compute_dtype(dtype, device)
              and (transferred or not p.get("transferred"))]
    if not points or m <= 0:
        return matmul_time(device, m, n, k, dtype)
    shapes = tuple((p["groups"], p["m"], p["n"], p["k"], p["tflops"]) for p in points)
    shape_form = forms.FORMS.grouped_shape
    if shape_form == "weighted":
        rate = _interpolate_points(shapes, groups, m, n, k)
    else:
        best = best_case_tflops(device, compute_dtype(dtype, device))
        fn = _saturating_rate if shape_form == "saturating" else _extrapolated_rate
        rate = fn(shapes, best, groups, m, n, k)
    return 2.0 * m * n * k / (device.sustained_fraction * rate * 1e12)


# A GEMM's rate grows with each of its dimensions until its tiles fill the GPU, then levels off at the part's
# best-case rate (its MAMF: the matmul's max_fraction of peak, the rate MAMF's brute-force search found; no
# grouped GEMM outruns the best dense one): the saturating form rate = best x m/(m+h_m) x n/(n+h_n) x k/(k+h_k),
# with one half-rate dimension per axis (the dense model's half_dim is one for all) fitted to a profile's
# grouped points, least squares in log rate.
_HALF_DIM_START = (2.5, 2.5, 2.5)  # log10 of the three half-rate dimensions


@lru_cache(maxsize=64)
def _saturating_fit(points: tuple, best: float) -> tuple[float, float, float]:
    """(h_m, h_n, h_k) of the saturating form at `best` TFLOP/s fitted to grouped points (groups, m, n, k, rate)."""
    shape = np.array([p[1:4] for p in points], dtype=float)
    log_rate = np.log([p[4] for p in points])

    def residual(x: np.ndarray) -> np.ndarray:
        return math.log(best) + np.log(shape / (shape + 10.0 ** x)).sum(axis=1) - log_rate

    fit = least_squares(residual, _HALF_DIM_START, bounds=([-3.0] * 3, [6.0] * 3))
    return tuple(float(10.0 ** v) for v in fit.x)


def _saturating_trend(best: float, half: tuple[float, float, float], m: float, n: float, k: float) -> float:
    hm, hn, hk = half
    return best * (m / (m + hm)) * (n / (n + hn)) * (k / (k + hk))


def _saturating_rate(points: tuple, best: float, groups: float, m: float, n: float, k: float) -> float:
    """A grouped GEMM's rate under forms.py grouped_shape "saturating": the form fitted to the points, times
    their own departures from it (log ratio) interpolated as _interpolate_points does, so a measured shape
    gets its measured rate and one beyond the measured range the form's level, not the points' average;
    never above `best`."""
    half = _saturating_fit(points, best)
    departures = _saturating_departures(points, best)
    return min(best, _saturating_trend(best, half, m, n, k) * math.exp(_interpolate_points(departures, groups, m, n, k)))


@lru_cache(maxsize=64)
def _saturating_departures(points: tuple, best: float) -> tuple:
    """Each point with its log ratio to the fitted form in place of its rate: once per profile, not per call."""
    half = _saturating_fit(points, best)
    return tuple(p[:4] + (math.log(p[4] / _saturating_trend(best, half, *p[1:4])),) for p in points)


def _extrapolated_rate(points: tuple, best: float, groups: float, m: float, n: float, k: float) -> float:
    """A grouped GEMM's rate under forms.py grouped_shape "extrapolated": inside the measured range of every
    axis the points' inverse-distance blend (_interpolate_points); beyond it, that blend at the range's edge
    times the saturating form's growth from the edge to the shape (_saturating_fit), never above `best`."""
    shape = (m, n, k)
    lo = [min(p[1 + i] for p in points) for i in range(3)]
    hi = [max(p[1 + i] for p in points) for i in range(3)]
    edge = tuple(min(max(x, a), b) for x, a, b in zip(shape, lo, hi))
    rate = _interpolate_points(points, groups, *edge)
    if edge == shape:
        return rate
    half = _saturating_fit(points, best)
    return min(best, rate * _saturating_trend(best, half, *shape) / _saturating_trend(best, half, *edge))


# float8 matmuls (torch._scaled_mm) write their output in bf16; the others in their own dtype.
_OUTPUT_DTYPE = {"fp8": "bf16"}


def _memory_bound_tflops(device: Device, m: float, n: float, k: float, dtype: str) -> float:
    """The roofline's memory side: 2mnk FLOPs over the time to read both operands and write the
    output once at the device's achievable HBM bandwidth (NVIDIA, Matrix Multiplication Background
    User's Guide, 'Math and Memory Bounds'). It binds only for thin matmuls whose arithmetic
    intensity is below the device's FLOP:byte ratio."""
    nbytes = DTYPE_BYTES[dtype] * (m * k + k * n) + DTYPE_BYTES[_OUTPUT_DTYPE.get(dtype, dtype)] * m * n
    return 2.0 * m * n * k / (memory_bound_time(device, nbytes) * 1e12)


@lru_cache(maxsize=256)
def _points_array(points: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The points' log2 shapes along the axes they vary in, their rates, and which axes vary. An axis
    every point shares (profile-cluster's grouped grid runs 8 groups throughout) says nothing about how
    far a query lies from them: its offset would be the same for every point and only flatten the
    weights toward their plain mean, so it is left out."""
    xyz = np.log2(np.array([p[:-1] for p in points], dtype=float))
    varies = xyz.max(axis=0) > xyz.min(axis=0)
    return xyz[:, varies], np.array([p[-1] for p in points], dtype=float), varies


def _interpolate_points(points: tuple, *shape: float) -> float:
    """Inverse-distance weighting in log2 of the shape (m, n, k; grouped: groups, m, n, k) over measured
    points (exact at a measured shape), along the axes the points vary in (_points_array)."""
    xyz, tflops, varies = _points_array(points)
    q = np.log2([max(x, 1.0) for x in shape])[varies]
    dist = np.sqrt(((xyz - q) ** 2).sum(axis=1))
    nearest = int(dist.argmin())
    if dist[nearest] < 1e-9:
        return float(tflops[nearest])
    w = 1.0 / dist ** 2
    return float((w * tflops).sum() / w.sum())


def matmul_time(device: Device, m: float, n: float, k: float, dtype: str) -> float:
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    return 2.0 * m * n * k / (matmul_tflops(device, m, n, k, dtype) * 1e12)


def attention_tflops(device: Device, seq_len: float, dtype: str, head_dim: float = 128.0,
                     backward: bool = False, window: float | None = None, kernel: str | None = None) -> float:
    """Fused causal attention throughput at this sequence length and head size, forward or backward;
    with a sliding `window` shorter than the sequence, at that window's rate.

    Measured points of the dtype win, interpolated in log2(seq_len) and then in log2(head_dim) (their
    `bwd_tflops` for the backward, where measured; else the forward's at `backward_ratio`): attention
    kernels do not follow the matmul peak across dtypes everywhere (CPU flash attention in bf16 runs its
    backward slower than in fp32, while bf16 GEMMs run twice as fast), and a small head does less work per
    byte (head_dim 16 runs at about half the FLOP rate of 64 on a CPU; on a GPU, below the narrowest
    measured head, _ExpBound). Without points, max_fraction of the dtype's peak, and the backward at
    `backward_ratio` of the forward. MXFP8 (ATTENTION_DTYPES) is priced from its own points only, else as
    bf16, the compute dtype of the recipes that run it.

    A windowed layer runs each query tile against the few key tiles of its window, however long the
    sequence: cuDNN's GB200 benchmark ran a 128-key window at 153-167 TFLOP/s forward and 176-188 backward
    in bf16 from 2k to 32k tokens, against 1097-1708 forward for full causal attention. Points carrying a
    `window` price windowed layers alone (_windowed_rate); without them a window runs at the rate of the
    causal attention whose queries see as many keys on average, that of length 2 x window.

    Points without a `kernel` are the kernel PyTorch's SDPA runs on the part; `kernel` picks the points
    tagged with it where the profile has them (cuDNN's, for Transformer Engine on an H100), else those.
    """
    att = device.attention
    dtype = dtype if dtype in ATTENTION_DTYPES else compute_dtype(dtype, device)
    exp = _ExpBound(_flops_per_exp(device, dtype), backward)
    win = window if window is not None and window < seq_len else None
    key = "bwd_tflops" if backward else "tflops"
    pts = _kernel_points(att.points, dtype, key, kernel)
    rate = _measured_rate(pts, key, seq_len, win, head_dim, exp)
    if rate is None and backward:
        # no measured backward: the forward's points at backward_ratio, a narrow head priced as a backward
        pts = _kernel_points(att.points, dtype, "tflops", kernel)
        forward = _measured_rate(pts, "tflops", seq_len, win, head_dim, exp)
        rate = None if forward is None else att.backward_ratio * forward
    if rate is not None:
        # forms.py attention_rate: points a step ran at (tagged in_step) as they are, or every point derated
        in_step = forms.FORMS.attention_rate == "in_step" and all(p.get("in_step") for p in pts)
        return rate if in_step else device.sustained_fraction * rate
    if dtype in ATTENTION_DTYPES:  # nothing measured of it for this query: the recipe's compute dtype
        return attention_tflops(device, seq_len, "bf16", head_dim, backward, window, kernel)
    length = _causal_length(seq_len, win)
    forward = device.sustained_fraction * device.peak_tflops[dtype] * att.max_fraction * length / (length + att.half_seq)
    return att.backward_ratio * forward if backward else forward


def _measured_rate(pts: list[dict], key: str, seq_len: float, window: float | None, head_dim: float,
                   exp: _ExpBound) -> float | None:
    """The rate from one kernel's points of one dtype carrying `key` (_kernel_points), or None."""
    full = [p for p in pts if "window" not in p]
    windowed = [p for p in pts if "window" in p]
    if window is not None and windowed:
        return _windowed_rate(windowed, full, key, seq_len, window, head_dim, exp)
    length = _causal_length(seq_len, window)
    return _by_head(full, "seq_len", key, length, head_dim, exp) if full else None


def _kernel_points(points: list[dict], dtype: str, key: str, kernel: str | None) -> list[dict]:
    """The profile's points of this dtype carrying `key`: those tagged with `kernel` where it has them, else
    the untagged ones (the kernel PyTorch's SDPA runs on the part)."""
    # Points without a dtype are the compute dtype's; an attention-only dtype needs its own.
    untyped = None if dtype in ATTENTION_DTYPES else dtype
    pts = [p for p in points if p.get("dtype", untyped) == dtype and key in p]
    tagged = [p for p in pts if kernel is not None and p.get("kernel") == kernel]
    return tagged or [p for p in pts if "kernel" not in p]


def _causal_length(seq_len: float, window: float | None) -> float:
    """The full causal attention a window is priced as without window points: the length whose queries see
    as many keys on average, 2 x window."""
    return seq_len if window is None else min(seq_len, 2.0 * window)


def _windowed_rate(windowed: list[dict], full: list[dict], key: str, seq_len: float, window: float,
                   head_dim: float, exp: _ExpBound) -> float:
    """A sliding window's rate from window points: interpolated in log2(window) where several windows were
    measured. One window measured at several lengths is read at the length; where its rate falls with the
    length as fast as 1/sqrt(length) or faster, the kernel's time grows with the sequence, not the window:
    cuDNN's MXFP8 backward of GPT-OSS's 128-key window took 0.64 ms at 2k and 27.9 ms at 16k, the square
    of the length, as it runs every causal tile. Such a kernel's rate in a window's FLOPs falls as
    1 / length beyond the measured lengths and grows with the window's keys, up to full attention's rate."""
    measured = {p["window"] for p in windowed}
    lengths = sorted({p["seq_len"] for p in windowed})
    if len(measured) > 1 or len(lengths) == 1:
        return _by_head(windowed, "window", key, window, head_dim, exp)
    rate = _by_head(windowed, "seq_len", key, seq_len, head_dim, exp)
    first, last = (_by_head(windowed, "seq_len", key, s, head_dim, exp) for s in (lengths[0], lengths[-1]))
    if last / first > (lengths[0] / lengths[-1]) ** 0.5:
        return rate  # the window's own tiles: its rate holds whatever the window
    edge = min(max(seq_len, lengths[0]), lengths[-1])
    rate *= edge / seq_len * causal_window_keys(window, seq_len) / causal_window_keys(measured.pop(), seq_len)
    return min(rate, _by_head(full, "seq_len", key, seq_len, head_dim, exp)) if full else rate


# Attention dtypes beyond the compute dtypes: block-scaled fp8 (MXFP8), as Transformer Engine runs attention
# under an MXFP8 recipe with fp8_dot_product_attention (Layout.attention_dtype), on the fp8 tensor cores. A part
# prices one only from its own measured points; without them attention is priced as bf16, the recipe's
# compute dtype.
ATTENTION_DTYPES = {"mxfp8": "fp8"}


def _flops_per_exp(device: Device, dtype: str) -> float | None:
    """The part's tensor FLOPs per exponential at this dtype: flops_per_exp is bf16's; fp8 tensor cores do
    twice the FLOPs a clock beside the same special-function units (their peaks' ratio)."""
    base = device.attention.flops_per_exp
    tensor = ATTENTION_DTYPES.get(dtype, dtype)
    if base is None or tensor not in device.peak_tflops or "bf16" not in device.peak_tflops:
        return base
    return base * device.peak_tflops[tensor] / device.peak_tflops["bf16"]


# Tensor-core FLOPs per score of fused causal attention, per unit of head width: QK^T and PV forward (2 + 2);
# the backward recomputes QK^T and runs dV, dP, dQ and dK (2 + 2 + 2 + 2 + 2), the 2.5x of the FLOP convention.
# Each score takes one exponential either way (the backward recomputes P).
SCORE_FLOPS_PER_HEAD_DIM = {False: 4.0, True: 10.0}


@dataclass(frozen=True)
class _ExpBound:
    """A fused attention kernel's time per score as tensor-core work plus one exponential on the
    special-function units, in tensor-FLOP units: c x head_dim + flops_per_exp (flops_per_exp None: unknown).
    Halving the head halves the FLOPs a score carries but not its exponential, so narrow heads run at a lower
    FLOP rate, the more so where tensor cores outrun the SFUs: FlashAttention-4 names the exponential the
    forward's bottleneck on a B200, whose tensor FLOPs doubled over the H100's at the same 16 exponentials a
    clock per SM (together.ai/blog/flashattention-4, 2026-03-05)."""

    flops_per_exp: float | None
    backward: bool

    def rate_ratio(self, head_dim: float, measured: float) -> float:
        """The FLOP rate at `head_dim` over that at the `measured` width: (h / h0) x t(h0) / t(h)."""
        if self.flops_per_exp is None:
            return 1.0
        c = SCORE_FLOPS_PER_HEAD_DIM[self.backward]
        return head_dim / measured * (c * measured + self.flops_per_exp) / (c * head_dim + self.flops_per_exp)


def _by_head(points: list[dict], along: str, key: str, at: float, head_dim: float,
             exp: _ExpBound = _ExpBound(None, False)) -> float:
    """The measured rate at `at` along `along` (seq_len or window) for each measured head width, then
    linear in log2(head_dim) between them; below the narrowest, its rate scaled by the exponential's share
    of a score's time (_ExpBound; flat where the part's flops_per_exp is unknown); above the widest, flat:
    wide heads meet other limits (cuDNN's GB200 MLA heads, 192 wide, ran at head 128's forward rate and
    below its backward, data/published/attention_cudnn_sdpa.csv, where the exponential alone says faster)."""
    by_head: dict[float, list[dict]] = {}
    for p in points:
        by_head.setdefault(float(p.get("head_dim", head_dim)), []).append(p)
    heads = sorted(by_head)
    rates = [_along(by_head[h], along, key, at) for h in heads]
    scale = exp.rate_ratio(head_dim, heads[0]) if head_dim < heads[0] else 1.0
    return scale * float(np.interp(math.log2(max(head_dim, 1.0)), np.log2(heads), rates))


def _along(points: list[dict], along: str, key: str, at: float) -> float:
    """Linear in log2 of `along` between measured values, held flat beyond them."""
    xs = np.log2([p[along] for p in points])
    ys = np.array([p[key] for p in points])
    order = np.argsort(xs)
    return float(np.interp(math.log2(max(at, 1.0)), xs[order], ys[order]))


def memory_bound_time(device: Device, nbytes: float) -> float:
    return nbytes / (device.memory_bandwidth_gbs * 1e9 * device.memory_bound_efficiency)


def peak_tflops(profile: ClusterProfile, dtype: str) -> float:
    return profile.device.peak_tflops[compute_dtype(dtype, profile.device)]
