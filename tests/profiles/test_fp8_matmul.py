"""profile-cluster's fp8 matmul: where it is measured, that its scaled GEMM computes the product, and
that the measured rate is what the cost model prices float8 plans with."""

from __future__ import annotations

import math
import os

import pytest
import torch

from meshplan.bench import compute
from meshplan.bench.builder import _device_section, matmul_summary
from meshplan.bench.env import BenchEnv
from meshplan.bench.memory import MemoryResult
from meshplan.bench.peaks import cpu_peaks
from meshplan.bench.worker import RawResults
from meshplan.cost_models.compute import matmul_tflops
from meshplan.profiles.schema import _device


def _env(device: torch.device) -> BenchEnv:
    return BenchEnv(rank=0, world=1, local_rank=0, local_world=1, nnodes=1,
                    backend="nccl" if device.type == "cuda" else "gloo", device=device)


def _scaled_mm_runs_on_cpu() -> bool:
    try:
        one = torch.ones((), dtype=torch.float32)
        x = torch.zeros(16, 16).to(torch.float8_e4m3fn)
        torch._scaled_mm(x, x.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        return True
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


needs_cpu_scaled_mm = pytest.mark.skipif(not _scaled_mm_runs_on_cpu(), reason="torch._scaled_mm has no CPU kernel here")


@pytest.mark.parametrize("capability,expected", [((9, 0), True), ((10, 0), True), ((8, 9), True),
                                                 ((8, 6), False), ((8, 0), False), ((7, 0), False)])
def test_fp8_needs_cuda_capability_8_9(capability, expected):
    # Ada (8.9), Hopper (9.0) and Blackwell (10.0) have fp8 tensor cores; Ampere (8.0, 8.6) and Volta do not
    assert compute.fp8_supported(torch.device("cuda", 0), capability) is expected
    assert compute.fp8_supported(torch.device("cpu"), capability) is False


@pytest.mark.parametrize("capability,measured", [((9, 0), True), ((8, 0), False)])
def test_choose_dtypes_on_a_fake_gpu(monkeypatch, capability, measured):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    tf32 = torch.backends.cuda.matmul.allow_tf32  # choose_dtypes turns TF32 off; keep this process as it was
    try:
        dtypes, notes = compute.choose_dtypes(_env(torch.device("cuda", 0)), compute.ComputeSettings(0.01, 1))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert ("fp8" in dtypes) is measured
    assert dtypes[0] == "bf16" and "fp32" in dtypes
    fp8_notes = [n for n in notes if n.startswith("fp8")]
    assert fp8_notes == ([] if measured else ["fp8 matmul not measured (compute capability 8.0 < 8.9)"])


def test_cpu_records_fp8_as_not_measured():
    note = compute._fp8_note(_env(torch.device("cpu")), None)
    assert note is not None and note.startswith("fp8 matmul not measured (CPU")


def test_fp8_grid_keeps_only_multiples_of_16():
    shapes = [(2048, 768, 4096), (256, 700, 256), (8192, 8192, 8192)]
    assert compute._shapes_for("fp8", shapes) == [(2048, 768, 4096), (8192, 8192, 8192)]
    assert compute._shapes_for("bf16", shapes) == shapes


@needs_cpu_scaled_mm
def test_scaled_matmul_matches_bf16_within_fp8_rounding():
    """Bound, element by element, from the formats alone (not from the code under test):
    e4m3 keeps 3 mantissa bits, so rounding x / scale to it errs by at most 2^-4 |x| (normal range) plus
    2^-10 * scale (half its smallest subnormal, 2^-9, for values below 2^-6); bf16 keeps 8 significant
    bits (unit roundoff 2^-8) for the reference's inputs and both outputs. With E_A, E_B those per-element
    operand errors, |fp8 - bf16| <= E_A|B| + |A|E_B + E_A E_B + (2 * 2^-8 + 2^-16)|A||B| + 2^-8 (|C8| + |Cbf|),
    plus fp32 accumulation (K * 2^-23 |A||B|)."""
    g = torch.Generator().manual_seed(0)
    m, n, k = 64, 48, 256
    a, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    a8, sa = compute.fp8_operand(a)
    w8, sw = compute.fp8_operand(w)
    c8 = compute.scaled_matmul(a8, sa, w8, sw).float()
    cbf = torch.mm(a.bfloat16(), w.bfloat16().t()).float()
    e_a = 2.0 ** -4 * a.abs() + 2.0 ** -10 * a.abs().max() / 448
    e_b = 2.0 ** -4 * w.abs() + 2.0 ** -10 * w.abs().max() / 448
    abs_ab = a.abs() @ w.abs().t()
    bound = (e_a @ w.abs().t() + a.abs() @ e_b.t() + e_a @ e_b.t()
             + (2 * 2.0 ** -8 + 2.0 ** -16 + k * 2.0 ** -23) * abs_ab + 2.0 ** -8 * (c8.abs() + cbf.abs()))
    assert bool(((c8 - cbf).abs() <= bound).all())
    # In aggregate: random rounding errors of ~2.6 % RMS per operand give ~4 % of the result's norm; a
    # result as close as bf16 rounding (2^-7) would mean the operands never went through fp8.
    rel = float((c8 - cbf).norm() / cbf.norm())
    assert 2.0 ** -7 < rel < 0.08


def test_fp8_operand_maps_amax_to_448():
    x = torch.tensor([[-3.0, 0.5], [1.5, 0.0]])
    x8, scale = compute.fp8_operand(x)
    assert float(scale) == pytest.approx(3.0 / 448)
    assert float(x8.float().abs().max()) == 448.0
    assert x8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32


@needs_cpu_scaled_mm
def test_fp8_benchmark_rate_is_sane():
    settings = compute.ComputeSettings(target_s=0.02, min_reps=2)
    tflops, spread = compute._fp8_matmul_once(128, 128, 256, torch.device("cpu"), settings, lambda: None)
    assert math.isfinite(tflops) and tflops > 0 and spread >= 0
    # no CPU multiplies faster than its SIMD FMA peak (cores x FLOP/cycle x clock, bf16-doubled where AVX512-BF16)
    peaks = cpu_peaks(os.cpu_count() or 1, ["fp32", "bf16"])
    if peaks is not None:
        assert tflops <= max(peaks.tflops.values())


def _raw_h100(fp8_tflops: float) -> RawResults:
    shapes = [(8192, 8192, 8192), (2048, 768, 4096), (8192, 1792, 4096)]
    mm = [{"m": m, "n": n, "k": k, "dtype": dt, "tflops": rate * (0.8 if (m, n, k) != shapes[0] else 1.0),
           "spread": 0.01} for m, n, k in shapes for dt, rate in (("bf16", 700.0), ("fp8", fp8_tflops))]
    att = [{"seq_len": s, "batch": 1, "heads": 32, "head_dim": 128, "dtype": "bf16", "tflops": 300.0 + s / 100,
            "bwd_tflops": 250.0, "spread": 0.01} for s in (1024, 2048, 4096)]
    return RawResults("NVIDIA H100 80GB HBM3", ["bf16", "fp8", "fp32"], mm, att, "bf16", 2600.0, 0.8,
                      MemoryResult(79.2, 78.0, 0.5, "test"), [], ["tf32 / fp16 matmul not measured"], [], 1.0)


def test_measured_fp8_rate_is_what_a_float8_plan_is_priced_at():
    raw = _raw_h100(fp8_tflops=1250.0)
    device_dict, prov = _device_section(raw, _env(torch.device("cuda", 0)))
    device = _device(device_dict, "device")
    assert device.peak_tflops["fp8"] == 1979.0  # H100 SXM dense fp8, the published datasheet table
    assert 0 < device.matmul.max_fraction["fp8"] <= 1
    # the cost model's fp8 matmul rate (timing.py uses dtype "fp8" for float8 plans) is the measured point
    assert matmul_tflops(device, 8192, 8192, 8192, "fp8") == pytest.approx(1250.0, rel=1e-3)
    assert matmul_tflops(device, 2048, 768, 4096, "fp8") == pytest.approx(1000.0, rel=1e-3)
    assert matmul_tflops(device, 8192, 8192, 8192, "bf16") == pytest.approx(700.0, rel=1e-3)
    assert "torch._scaled_mm" in prov["device.matmul"]
    # the exponential's cost in tensor FLOPs is a hardware ratio, not measured: 4096 FLOPs a clock per SM on an
    # H100's tensor cores over its 16 exponentials a clock per SM
    assert device.attention.flops_per_exp == 4096 / 16
    assert "not measured" in prov["device.attention.flops_per_exp"]


def test_summary_line_names_each_dtype_and_what_was_not_measured():
    points = [{"dtype": "bf16", "tflops": 650.0}, {"dtype": "bf16", "tflops": 700.0}, {"dtype": "fp8", "tflops": 1250.0}]
    line = matmul_summary(points, ["tf32 / fp16 matmul not measured", "bf16 something else"])
    assert line == "matmul best TFLOP/s: bf16 700, fp8 1250; tf32 / fp16 matmul not measured"
