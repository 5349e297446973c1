"""The fits recover known parameters from synthetic measurements."""

import math
import random

import numpy as np
import pytest

from meshplan.profiles import fit

MIB = 1 << 20


def _sizes() -> list[int]:
    return [4096 * 4 ** i for i in range(4)] + [MIB << i for i in range(9)]


@pytest.mark.parametrize("latency_us,busbw_gbs,factor", [(25.0, 400.0, 2 * 7 / 8), (800.0, 0.6, 1.0), (0.0, 50.0, 0.5)])
def test_latency_bandwidth_recovered_exactly(latency_us, busbw_gbs, factor):
    sizes = _sizes()
    x = [s * factor for s in sizes]
    t = [latency_us * 1e-6 + xi / (busbw_gbs * 1e9) for xi in x]
    f = fit.fit_latency_bandwidth(sizes, x, t)
    assert f.busbw_gbs == pytest.approx(busbw_gbs, rel=1e-6)
    assert f.latency_s * 1e6 == pytest.approx(latency_us, rel=1e-6, abs=1e-6)
    assert fit.fit_error(f, sizes, x, t).max_rel < 1e-6


def test_latency_bandwidth_with_noise_stays_close_and_large_sizes_fit():
    rng = random.Random(1)
    sizes = _sizes()
    t = [50e-6 + s / 20e9 for s in sizes]
    noisy = [ti * (1 + rng.uniform(-0.04, 0.04)) for ti in t]
    f = fit.fit_latency_bandwidth(sizes, sizes, noisy)
    assert f.busbw_gbs == pytest.approx(20.0, rel=0.05)
    assert f.latency_s == pytest.approx(50e-6, rel=0.3)
    assert fit.fit_error(f, sizes, sizes, noisy).max_rel <= 0.10


def test_large_sizes_win_over_small_outliers():
    """A slow small-message regime must not drag the >= 1 MiB fit beyond 10 %."""
    sizes = _sizes()
    t = [(3e-3 if s < MIB else 1e-4) + s / 1e9 for s in sizes]  # small messages 30x more latency
    f = fit.fit_latency_bandwidth(sizes, sizes, t)
    err = fit.fit_error(f, sizes, sizes, t)
    assert err.n_points == 9
    assert err.max_rel <= 0.10


def test_minimax_is_the_best_worst_case():
    x = np.array([1.0, 2.0, 4.0, 8.0]) * MIB
    t = np.array([1.0, 2.6, 3.9, 8.5]) * 1e-3
    best = fit._minimax_relative(x, t)
    worst = fit._max_rel(best, x, t)
    for a in (0.0, 1e-4, 3e-4):
        for b in np.linspace(0.8e-9, 1.3e-9, 11):
            assert fit._max_rel(fit.LinearFit(a, b), x, t) >= worst - 1e-9


def test_fit_needs_two_sizes():
    with pytest.raises(ValueError):
        fit.fit_latency_bandwidth([MIB], [MIB], [1e-3])


def test_matmul_fit_recovers_fraction_and_half_dim():
    peak = {"bf16": 989.0, "fp32": 67.0}
    truth = {"bf16": 0.8, "fp32": 0.9}
    half = 128.0
    points = []
    for dt in peak:
        for m in (256, 1024, 4096):
            for n in (128, 1024, 8192):
                for k in (64, 512, 4096):
                    frac = truth[dt] * math.prod(d / (d + half) for d in (m, n, k))
                    points.append({"m": m, "n": n, "k": k, "dtype": dt, "tflops": frac * peak[dt]})
    f = fit.fit_matmul(points, peak)
    assert f.half_dim == pytest.approx(half, rel=1e-3)
    for dt in peak:
        assert f.max_fraction[dt] == pytest.approx(truth[dt], rel=1e-3)
    assert fit.predict_matmul_tflops(f, peak["bf16"], "bf16", 4096, 4096, 4096) == pytest.approx(
        0.8 * 989 * (4096 / 4224) ** 3, rel=1e-3)


def test_matmul_fraction_never_exceeds_one():
    points = [{"m": d, "n": d, "k": d, "dtype": "fp32", "tflops": 1.2} for d in (512, 1024, 2048)]
    f = fit.fit_matmul(points, {"fp32": 1.0})
    assert 0 < f.max_fraction["fp32"] <= 1.0


def test_attention_fit_recovers_curve():
    seqs = [512, 1024, 2048, 4096, 8192]
    fr = [0.55 * s / (s + 700.0) for s in seqs]
    f = fit.fit_attention(seqs, fr)
    assert f.max_fraction == pytest.approx(0.55, rel=1e-6)
    assert f.half_seq == pytest.approx(700.0, rel=1e-6)


def test_two_pieces_recover_two_regimes():
    """Cache-resident sizes at 0.4 GB/s, DRAM-bound ones at 0.2 GB/s: one line misses, two pieces fit."""
    sizes = [MIB << i for i in range(9)]
    t = [1e-3 + s / (0.4e9 if s <= 16 * MIB else 0.2e9) for s in sizes]
    one = fit.fit_latency_bandwidth(sizes, sizes, t)
    assert fit.fit_error(one, sizes, sizes, t).max_rel > 0.10
    low, high = fit.fit_two_pieces(sizes, sizes, t)
    assert (low.min_bytes, low.max_bytes, high.min_bytes, high.max_bytes) == (MIB, 16 * MIB, 32 * MIB, 256 * MIB)
    assert low.fit.busbw_gbs == pytest.approx(0.4, rel=1e-3) and high.fit.busbw_gbs == pytest.approx(0.2, rel=1e-3)
    assert max(low.max_rel, high.max_rel) < 1e-3
