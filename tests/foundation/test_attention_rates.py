"""Attention throughput from a profile's measured points: per dtype, per head size, forward and
backward (cost_models/compute.py attention_tflops), against hand interpolations."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from meshplan.cost_models.compute import attention_tflops
from meshplan.profiles.registry import load_profile


def _point(dtype: str, head_dim: int, seq: int, fwd: float, bwd: float) -> dict:
    return {"seq_len": seq, "batch": 1, "heads": 4, "head_dim": head_dim, "dtype": dtype, "tflops": fwd,
            "bwd_tflops": bwd, "spread": 0.01}


def _device(points: list[dict]):
    dev = load_profile("cpu-gloo").device
    return replace(dev, sustained_fraction=1.0, peak_tflops={"fp32": 0.2, "bf16": 0.4},
                   attention=replace(dev.attention, points=points, max_fraction=0.5, half_seq=0.0,
                                     backward_ratio=0.8))


# Shaped like this VM's measurement: bf16 attention slower than fp32 (its backward much slower),
# head 16 at about half the rate of head 64.
POINTS = [_point("fp32", 16, 128, 0.020, 0.021), _point("fp32", 16, 512, 0.026, 0.023),
          _point("fp32", 64, 128, 0.040, 0.040), _point("fp32", 64, 512, 0.060, 0.050),
          _point("bf16", 16, 128, 0.015, 0.0035), _point("bf16", 16, 512, 0.022, 0.016)]


def test_measured_points_of_the_dtype_win_over_the_peak():
    dev = _device(POINTS)
    # bf16 has twice the fp32 peak, yet its measured attention is slower: the points decide
    assert attention_tflops(dev, 128, "bf16", head_dim=16) == pytest.approx(0.015)
    assert attention_tflops(dev, 128, "bf16", head_dim=16, backward=True) == pytest.approx(0.0035)
    assert attention_tflops(dev, 128, "fp32", head_dim=16, backward=True) == pytest.approx(0.021)


def test_interpolation_in_log_seq_then_log_head_dim():
    dev = _device(POINTS)
    # seq 256 is half-way between 128 and 512 in log2; head 32 half-way between 16 and 64
    at16 = 0.020 + 0.5 * (0.026 - 0.020)
    at64 = 0.040 + 0.5 * (0.060 - 0.040)
    assert attention_tflops(dev, 256, "fp32", head_dim=16) == pytest.approx(at16)
    assert attention_tflops(dev, 256, "fp32", head_dim=32) == pytest.approx((at16 + at64) / 2)
    # held flat beyond the measured heads and lengths
    assert attention_tflops(dev, 256, "fp32", head_dim=128) == pytest.approx(at64)
    assert attention_tflops(dev, 4096, "fp32", head_dim=8) == pytest.approx(0.026)
    # bf16 measured at head 16 only: every head size gets that series
    assert attention_tflops(dev, 512, "bf16", head_dim=128, backward=True) == pytest.approx(0.016)


def test_without_points_the_peak_model_and_backward_ratio():
    dev = _device([])
    fwd = 0.4 * 0.5  # peak x max_fraction, half_seq 0
    assert attention_tflops(dev, 1024, "bf16") == pytest.approx(fwd)
    assert attention_tflops(dev, 1024, "bf16", backward=True) == pytest.approx(0.8 * fwd)


def test_sustained_fraction_scales_measured_points():
    dev = replace(_device(POINTS), sustained_fraction=0.75)
    assert attention_tflops(dev, 512, "fp32", head_dim=64, backward=True) == pytest.approx(0.75 * 0.050)
    assert math.isclose(attention_tflops(dev, 512, "fp32", head_dim=64), 0.75 * 0.060)


def test_beyond_the_measured_heads_the_exponential_decides_on_a_gpu():
    """A GB200 measured at head 128 alone (cuDNN's Llama points): head 64 carries half the FLOPs a score
    does, one exponential all the same. With 8192 tensor FLOPs and 16 exponentials a clock per SM (512 FLOPs
    an exponential), a forward score costs 4 x 128 + 512 = 1024 at head 128 and 4 x 64 + 512 = 768 at head
    64: the rate falls to 0.5 x 1024 / 768 = 2/3. The backward's 10 FLOPs per score and width: 0.5 x 1792 /
    1152 = 7/9. FlashAttention-4's B200 tables ran causal head 64 at 0.61-0.71 of head 128's forward rate
    (flash-attention PR #2605). On an H100 (4096 / 16 = 256) the forward keeps 0.5 x 768 / 512 = 3/4."""
    gb200 = load_profile("gb200-186g-nvl72").device
    assert gb200.attention.flops_per_exp == 512
    for backward, ratio in ((False, 2 / 3), (True, 7 / 9)):
        narrow = attention_tflops(gb200, 4096, "bf16", head_dim=64, backward=backward)
        wide = attention_tflops(gb200, 4096, "bf16", head_dim=128, backward=backward)
        assert narrow / wide == pytest.approx(ratio)
    h100 = load_profile("h100-80g-dgx").device
    assert attention_tflops(h100, 8192, "bf16", head_dim=64) / attention_tflops(h100, 8192, "bf16", head_dim=128) \
        == pytest.approx(0.75)
    # FlashAttention-2's H100 points measure no backward: the forward's at backward_ratio, and head 64 priced as
    # a backward, 0.5 x (10 x 128 + 256) / (10 x 64 + 256) = 6/7, not the forward's 3/4
    assert attention_tflops(h100, 8192, "bf16", head_dim=64, backward=True) / attention_tflops(
        h100, 8192, "bf16", head_dim=128, backward=True) == pytest.approx(6 / 7)
    # Wider than the widest measured head (192, DeepSeek's MLA: q.k 192 wide, p.v 128): held at its rate, since
    # cuDNN ran those heads no faster than head 128, where the exponential alone would have them 11 % faster
    # forward (640 FLOPs a score against 512: 1.25 x 1024 / 1152).
    assert attention_tflops(gb200, 4096, "bf16", head_dim=256) == attention_tflops(gb200, 4096, "bf16", head_dim=192)
    # A part whose exponential rate is unknown holds the nearest measured head's rate, as before.
    cpu = _device(POINTS)
    assert cpu.attention.flops_per_exp is None
    assert attention_tflops(cpu, 512, "fp32", head_dim=128) == pytest.approx(0.060)
