"""Fits that turn raw benchmark points into the profile's parametric models (numpy only, no torch).

- collectives: time = latency + bytes_factor * bytes / busbw, fitted in relative error so a 1 ms and a
  1 s point count alike; sizes >= 1 MiB get more weight until they fit within `target` (10 %).
- matmul: tflops = max_fraction[dtype] * peak[dtype] * prod_d d / (d + half_dim) over d in (m, n, k).
- attention: fraction of peak = max_fraction * s / (s + half_seq).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from meshplan.profiles.schema import CollectiveFit, CollectiveSegment

MIB = 1 << 20
LARGE_BYTES = MIB  # the fit must reproduce messages from this size on within `target`
TARGET = 0.10  # profile-cluster's fits must reproduce >= 1 MiB measurements within this relative error


def sig(x: float, digits: int = 4) -> float:
    """Round to significant digits: the profile stays readable and round-trips exactly through YAML."""
    return float(f"{float(x):.{digits}g}")


def latency_us(seconds: float) -> float:
    """Microseconds to 4 digits; fits pinned at zero latency come out as float dust, written as 0."""
    us = seconds * 1e6
    return sig(us) if us >= 0.01 else 0.0


@dataclass
class LinearFit:
    """time = latency_s + effective_bytes * seconds_per_byte (effective = bytes_factor * bytes)."""

    latency_s: float
    seconds_per_byte: float

    @property
    def busbw_gbs(self) -> float:
        return 1e-9 / self.seconds_per_byte

    def predict(self, effective_bytes: np.ndarray | float) -> np.ndarray:
        return self.latency_s + np.asarray(effective_bytes, dtype=float) * self.seconds_per_byte


@dataclass
class FitError:
    """Relative error of a fit over the points with bytes >= LARGE_BYTES."""

    n_points: int
    max_rel: float
    mean_rel: float
    group_size: int = 0
    noise: float | None = None  # mean relative standard error of the measured medians (filled by the caller)
    one_line_max_rel: float | None = None  # worst error of a single line, where the model has size ranges


def _weighted_relative_lsq(x: np.ndarray, t: np.ndarray, w: np.ndarray) -> LinearFit:
    """Minimise sum w * ((a + b x - t) / t)^2 with a >= 0, b > 0 (2x2 normal equations)."""
    A = np.stack([1.0 / t, x / t], axis=1) * np.sqrt(w)[:, None]
    y = np.sqrt(w)  # (a + b x) / t should be 1
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    if a < 0:  # negative latency is unphysical: refit the slope through the origin
        a = 0.0
        col = A[:, 1]
        b = float(col @ y / (col @ col))
    if b <= 0:  # flat or falling data: fall back to the slope of the largest point
        i = int(np.argmax(x))
        b = max((t[i] - a) / x[i], 1e-15)
    return LinearFit(latency_s=float(a), seconds_per_byte=float(b))


def _max_rel(fit: LinearFit, x: np.ndarray, t: np.ndarray) -> float:
    return float(np.max(np.abs(fit.predict(x) / t - 1.0))) if len(t) else 0.0


def _minimax_relative(x: np.ndarray, t: np.ndarray) -> LinearFit:
    """Smallest worst-case relative error: convex in (a, b), so nested ternary search (a >= 0)."""

    def best_b(a: float) -> tuple[float, float]:
        lo, hi = 1e-18, float(np.max(t / x)) * 2
        for _ in range(50):  # (2/3)^50: far below the noise of any measurement
            m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
            if _max_rel(LinearFit(a, m1), x, t) < _max_rel(LinearFit(a, m2), x, t):
                hi = m2
            else:
                lo = m1
        b = (lo + hi) / 2
        return b, _max_rel(LinearFit(a, b), x, t)

    a = _ternary_min(lambda x: best_b(x)[1], 0.0, float(np.min(t)), 40)
    return LinearFit(latency_s=a, seconds_per_byte=best_b(a)[0])


def fit_latency_bandwidth(
    nbytes: Sequence[float], effective_bytes: Sequence[float], times_s: Sequence[float], target: float = 0.10
) -> LinearFit:
    """Fit latency + bandwidth in relative error; raise the weight of >= 1 MiB points until they fit.

    If no weighting gets the large points within `target`, the minimax fit over them is returned:
    the best possible worst case for a latency + bandwidth line.
    """
    size = np.asarray(nbytes, dtype=float)
    x = np.asarray(effective_bytes, dtype=float)
    t = np.asarray(times_s, dtype=float)
    if len(t) < 2 or len(set(x.tolist())) < 2:
        raise ValueError("need at least two message sizes to fit latency and bandwidth")
    large = size >= LARGE_BYTES
    w = np.ones_like(t)
    fit = _weighted_relative_lsq(x, t, w)
    if large.sum() < 2:
        return fit
    for _ in range(8):
        if _max_rel(fit, x[large], t[large]) <= target:
            return fit
        w[large] *= 4.0
        fit = _weighted_relative_lsq(x, t, w)
    minimax = _minimax_relative(x[large], t[large])
    return minimax if _max_rel(minimax, x[large], t[large]) < _max_rel(fit, x[large], t[large]) else fit


def fit_error(fit: LinearFit, nbytes: Sequence[float], effective_bytes: Sequence[float], times_s: Sequence[float]) -> FitError:
    return error_of(nbytes, fit.predict(np.asarray(effective_bytes, dtype=float)), times_s)


def error_of(nbytes: Sequence[float], predicted_s: Sequence[float], times_s: Sequence[float]) -> FitError:
    """Relative error of predicted vs measured times over the messages of LARGE_BYTES and up."""
    large = np.asarray(nbytes, dtype=float) >= LARGE_BYTES
    p = np.asarray(predicted_s, dtype=float)[large]
    t = np.asarray(times_s, dtype=float)[large]
    if not len(t):
        return FitError(0, math.nan, math.nan)
    rel = np.abs(p / t - 1.0)
    return FitError(int(len(t)), float(rel.max()), float(rel.mean()))


@dataclass
class MatmulFit:
    max_fraction: dict[str, float]
    half_dim: float
    rms_log_error: float


def _dim_factor(dims: np.ndarray, half_dim: float) -> np.ndarray:
    return np.prod(dims / (dims + half_dim), axis=1)


def fit_matmul(points: Sequence[dict], peak_tflops: dict[str, float]) -> MatmulFit:
    """Fit one half_dim shared by all dtypes and a max_fraction per dtype, in log space (relative error)."""
    dtypes = sorted({p["dtype"] for p in points})
    if not dtypes:
        raise ValueError("no matmul points to fit")
    by_dtype = {}
    for dt in dtypes:
        ps = [p for p in points if p["dtype"] == dt]
        dims = np.array([[p["m"], p["n"], p["k"]] for p in ps], dtype=float)
        logt = np.log(np.array([p["tflops"] for p in ps], dtype=float) / peak_tflops[dt])
        by_dtype[dt] = (dims, logt)

    def solve(h: float) -> tuple[float, dict[str, float]]:
        sse, fracs = 0.0, {}
        for dt, (dims, logt) in by_dtype.items():
            resid = logt - np.log(_dim_factor(dims, h))
            logf = min(float(resid.mean()), 0.0)  # max_fraction <= 1 by the schema
            fracs[dt] = math.exp(logf)
            sse += float(((resid - logf) ** 2).sum())
        return sse, fracs

    grid = np.concatenate([[0.0], np.geomspace(0.5, 1e5, 400)])
    errs = [solve(h)[0] for h in grid]
    i = int(np.argmin(errs))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    # Refine between the grid neighbours (the error is unimodal there in practice).
    h = _ternary_min(lambda x: solve(x)[0], lo, hi, 60)
    sse, fracs = solve(h)
    n = sum(len(v[1]) for v in by_dtype.values())
    return MatmulFit(max_fraction=fracs, half_dim=float(h), rms_log_error=math.sqrt(sse / n))


def predict_matmul_tflops(fit: MatmulFit, peak: float, dtype: str, m: int, n: int, k: int) -> float:
    dims = np.array([[m, n, k]], dtype=float)
    return float(fit.max_fraction[dtype] * peak * _dim_factor(dims, fit.half_dim)[0])


@dataclass
class AttentionFit:
    max_fraction: float
    half_seq: float


def fit_attention(seq_lens: Sequence[float], fractions: Sequence[float]) -> AttentionFit:
    """fraction = f * s / (s + h)  <=>  1/fraction = 1/f + (h/f) / s: linear, fitted in relative error."""
    s = np.asarray(seq_lens, dtype=float)
    y = 1.0 / np.asarray(fractions, dtype=float)
    if len(s) < 2:
        if len(s) == 1:
            return AttentionFit(max_fraction=min(float(1 / y[0]), 1.0), half_seq=0.0)
        raise ValueError("no attention points to fit")
    A = np.stack([np.ones_like(s), 1.0 / s], axis=1) / y[:, None]
    (a, b), *_ = np.linalg.lstsq(A, np.ones_like(s), rcond=None)
    if b < 0:  # throughput falling with length (cache effects): flat curve at the mean
        a, b = float(np.mean(y)), 0.0
    a = max(a, 1.0)  # max_fraction <= 1
    return AttentionFit(max_fraction=float(1.0 / a), half_seq=float(b / a))


@dataclass
class Segment:
    """One size range of a piecewise latency + bandwidth fit."""

    min_bytes: int
    max_bytes: int
    fit: LinearFit
    max_rel: float


def fit_two_pieces(nbytes: Sequence[float], effective_bytes: Sequence[float], times_s: Sequence[float]) -> list[Segment] | None:
    """Split the >= 1 MiB points in two size ranges (>= 2 points each) where the worse range fits best.

    For data with two regimes (e.g. cache-resident vs DRAM-bound buffers) that no single line fits.
    """
    size = np.asarray(nbytes, dtype=float)
    order = np.argsort(size)
    size, x, t = size[order], np.asarray(effective_bytes, dtype=float)[order], np.asarray(times_s, dtype=float)[order]
    keep = size >= LARGE_BYTES
    size, x, t = size[keep], x[keep], t[keep]
    best: tuple[float, list[Segment]] | None = None
    for i in range(2, len(t) - 1):
        segs = []
        for lo, hi in ((0, i), (i, len(t))):
            f = _minimax_relative(x[lo:hi], t[lo:hi])
            segs.append(Segment(int(size[lo]), int(size[hi - 1]), f, _max_rel(f, x[lo:hi], t[lo:hi])))
        worst = max(s.max_rel for s in segs)
        if best is None or worst < best[0]:
            best = (worst, segs)
    return None if best is None else best[1]


def _ternary_min(f, lo: float, hi: float, iterations: int) -> float:
    """The minimiser of a unimodal f on [lo, hi] by ternary search."""
    for _ in range(iterations):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if f(m1) < f(m2):
            hi = m2
        else:
            lo = m1
    return (lo + hi) / 2


def collective_entry(nbytes: Sequence[float], effective: Sequence[float], times: Sequence[float]) -> tuple[dict, FitError]:
    """A collective's profile entry from its measured times, and the error of its one line.

    One latency + bandwidth line; where it misses TARGET on >= 1 MiB messages (two regimes, e.g.
    buffers in cache vs from DRAM, or NCCL changing protocol), two size ranges of >= 1 MiB get lines of
    their own and the line below them is refitted to the smaller messages alone, its bandwidth no
    higher than the first range's (flat small-message times are latency, not an unbounded bandwidth).
    """
    f = fit_latency_bandwidth(nbytes, effective, times)
    entry = {"bus_bandwidth_gbs": sig(f.busbw_gbs), "latency_us": latency_us(f.latency_s)}
    one_line = written_error(entry, nbytes, effective, times)
    pieces = fit_two_pieces(nbytes, effective, times) if one_line.max_rel > TARGET else None
    if not pieces:
        return entry, one_line
    entry["segments"] = [{"min_bytes": p.min_bytes, "bus_bandwidth_gbs": sig(p.fit.busbw_gbs),
                          "latency_us": latency_us(p.fit.latency_s)} for p in pieces]
    small = [i for i, b in enumerate(nbytes) if b < pieces[0].min_bytes]
    if len({nbytes[i] for i in small}) >= 2:
        x = np.array([effective[i] for i in small], dtype=float)
        t = np.array([times[i] for i in small], dtype=float)
        base = fit_latency_bandwidth([nbytes[i] for i in small], x, t)
        if base.busbw_gbs > pieces[0].fit.busbw_gbs:
            per_byte = pieces[0].fit.seconds_per_byte
            base = LinearFit(max(0.0, float(np.median(t - x * per_byte))), per_byte)
        entry.update(bus_bandwidth_gbs=sig(base.busbw_gbs), latency_us=latency_us(base.latency_s))
    return entry, one_line


def written_error(entry: dict, nbytes: Sequence[float], effective: Sequence[float], times: Sequence[float]) -> FitError:
    """Fit error of a collective's profile entry as written: each message priced by the line covering its size."""
    model = CollectiveFit(entry["bus_bandwidth_gbs"], entry["latency_us"],
                          [CollectiveSegment(**seg) for seg in entry.get("segments", [])])
    predicted = [lat * 1e-6 + xb / (bw * 1e9) for (bw, lat), xb in zip(map(model.line_for, nbytes), effective)]
    return error_of(nbytes, predicted, times)
