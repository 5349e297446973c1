"""profile-cluster times the routed experts' grouped GEMMs as the runtime runs them, and the cost model
prices an MoE layer's experts at the measured rate for their tokens per expert."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from meshplan.bench import compute
from meshplan.bench.builder import _device_section
from meshplan.bench.env import BenchEnv
from meshplan.bench.memory import MemoryResult
from meshplan.bench.progress import Reporter
from meshplan.bench.shapes import grouped_grid, grouped_matmul_dtypes
from meshplan.bench.timing import Budget
from meshplan.bench.worker import RawResults
from meshplan.cost_models.compute import grouped_matmul_time, matmul_time
from meshplan.cost_models.moe import routed_expert_times, routing
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.profiles.schema import _device
from meshplan.specs.registry import resolve_model
from meshplan.specs.rules import grouped_mm_kernel

CPU = BenchEnv(rank=0, world=1, local_rank=0, local_world=1, nnodes=1, backend="gloo", device=torch.device("cpu"))


@pytest.mark.parametrize("device,dtype,capability,expected", [
    ("cpu", "fp32", None, True), ("cpu", "bf16", None, True), ("cuda", "bf16", (9, 0), True),
    ("cuda", "bf16", (10, 0), True), ("cuda", "bf16", (8, 0), False), ("cuda", "fp32", (9, 0), False)])
def test_where_the_grouped_kernel_runs(device, dtype, capability, expected):
    assert grouped_mm_kernel(device, dtype, capability) is expected


def test_grid_has_both_projections_at_every_token_count():
    full = grouped_grid(cuda=True, quick=False)
    assert len(full) == 3 * 4 * 2 and all(g == 8 for g, *_ in full)
    assert (8, 1024, 1536, 4096) in full and (8, 1024, 4096, 1536) in full  # Qwen3-235B gate/up and down
    assert len(grouped_grid(cuda=True, quick=True)) == 12
    assert grouped_matmul_dtypes(["bf16", "fp8", "fp32"], cuda=True) == ["bf16"]
    assert grouped_matmul_dtypes(["fp32", "bf16"], cuda=False) == ["fp32", "bf16"]


@pytest.mark.parametrize("kernel", [True, False])
def test_grouped_point_runs_the_kernel_and_the_loop(kernel):
    settings = compute.ComputeSettings(target_s=0.01, min_reps=2)
    tflops, spread = compute._grouped_matmul_once(4, 16, 64, 32, torch.float32, CPU, settings, kernel)
    assert tflops > 0 and spread >= 0


def test_bench_records_each_shape_with_its_kernel():
    settings = compute.ComputeSettings(target_s=0.01, min_reps=2)
    shapes = [(4, 16, 64, 32), (4, 64, 32, 64)]
    rep = Reporter(enabled=False)
    points = compute.bench_grouped_matmul(CPU, shapes, ["fp32"], settings, Budget(None), rep, {"fp32": 0.05})
    assert rep.skipped == []  # no deadline: every shape is timed
    assert [(p["groups"], p["m"], p["n"], p["k"]) for p in points] == shapes
    assert all(p["kernel"] == "grouped_mm" and p["dtype"] == "fp32" and p["tflops"] > 0 for p in points)


def _measured_device(grouped: list[dict]):
    mm = [{"m": m, "n": n, "k": k, "dtype": "bf16", "tflops": 600.0, "spread": 0.01}
          for m, n, k in ((8192, 8192, 8192), (2048, 1536, 4096))]
    att = [{"seq_len": s, "batch": 1, "heads": 32, "head_dim": 128, "dtype": "bf16", "tflops": 300.0,
            "bwd_tflops": 250.0, "spread": 0.01} for s in (1024, 4096)]
    raw = RawResults("NVIDIA H100 80GB HBM3", ["bf16", "fp32"], mm, att, "bf16", 2600.0, 0.8,
                     MemoryResult(79.2, 78.0, 0.5, "test"), [], [], [], 1.0, grouped_points=grouped)
    env = replace(CPU, device=torch.device("cuda", 0), backend="nccl")
    device, prov = _device_section(raw, env)
    return _device(device, "device"), prov


def test_measured_grouped_rate_prices_the_routed_experts():
    """Qwen3-235B-A22B on EP 16: 8 local experts. At a measured (groups, tokens per expert, n, k) the
    experts' time is 2 x groups x m x n x k FLOPs at that rate, by hand."""
    grouped = [{"groups": 8, "m": m, "n": n, "k": k, "dtype": "bf16", "tflops": rate, "spread": 0.01,
                "kernel": "grouped_mm"}
               for m, rate in ((256, 150.0), (1024, 420.0)) for n, k in ((1536, 4096), (4096, 1536))]
    device, prov = _measured_device(grouped)
    assert "torch._grouped_mm" in prov["device.matmul.grouped_points"]
    spec = resolve_model("qwen3-235b-a22b")
    r = routing(spec, tokens=1024, tp=1, ep=16, imbalance=1.0)  # 1024 x top-8 pairs over 8 local experts
    assert (r.local_experts, r.tokens_per_expert, r.width) == (8, 1024.0, 1536)
    prof = replace(load_profile("h100-80g-dgx"), device=device)
    got = routed_expert_times(spec, r, prof, "bf16")
    one = 2.0 * 8 * 1024 * 1536 * 4096 / (420.0e12 * device.sustained_fraction)
    assert got["expert_in"] == pytest.approx(2 * one, rel=1e-9)
    assert got["expert_out"] == pytest.approx(one, rel=1e-9)
    # Thinner groups run slower: between the two measured token counts, the rate lies between theirs.
    t = grouped_matmul_time(device, 8, 512, 1536, 4096, "bf16")
    assert 2 * 512 * 1536 * 4096 / (420.0e12) < t < 2 * 512 * 1536 * 4096 / (150.0e12)


def test_without_grouped_points_each_expert_is_a_matmul():
    prof = load_profile("a100-80g-dgx")
    assert not prof.device.matmul.grouped_points
    assert grouped_matmul_time(prof.device, 8, 300, 1536, 4096, "bf16") == matmul_time(prof.device, 300, 1536,
                                                                                        4096, "bf16")


def test_a_grouped_point_without_its_groups_is_a_one_line_error():
    device, _ = _measured_device([])
    raw = {"name": "x", "memory_gib": 80, "peak_tflops": {"bf16": 989.0}, "memory_bandwidth_gbs": 3000,
           "matmul": {"max_fraction": {"bf16": 0.8}, "grouped_points": [{"m": 64, "n": 8, "k": 8, "tflops": 1.0}]},
           "attention": {"max_fraction": 0.5}}
    with pytest.raises(InputError) as e:
        _device(raw, "device")
    assert "device.matmul.grouped_points[0].groups" in str(e.value)


# The lent H200's grouped_mm rates (benchmarks/results/grouped_gemm-NVIDIA_H200-9816110.md), best case, bf16,
# 8 groups: (tokens per expert, n, k) -> TFLOP/s, read from the committed table, not from a profile.
H200_GROUPED = {(256, 4096, 1536): 365.0, (4096, 4096, 1536): 701.0, (1024, 7168, 2048): 655.0}


@pytest.mark.parametrize("name", ["h100-80g-dgx", "h100-96g-gt", "h200-141g-dgx"])
def test_hopper_profiles_price_experts_at_the_h200s_measured_grouped_rate(name):
    """The H100 profiles carry the H200's grouped points (one GH100 die, one MAMF): at a measured shape
    the experts take 2 x m x n x k FLOPs a group at that rate times the part's sustained fraction, by hand,
    at whatever count of local experts (every point ran 8, so the group count does not move the rate)."""
    prof = load_profile(name)
    for (m, n, k), rate in H200_GROUPED.items():
        for groups in (8, 16, 128):
            by_hand = 2.0 * m * n * k / (rate * 1e12 * prof.device.sustained_fraction)
            assert grouped_matmul_time(prof.device, groups, m, n, k, "bf16") == pytest.approx(by_hand, rel=1e-9)


def test_an_axis_every_point_shares_does_not_move_the_interpolation():
    """Two points measured at 8 groups, 100 and 400 TFLOP/s at 256 and 4096 tokens: halfway in log2 of the
    tokens (1024) the inverse-distance weights are equal, 250, at 8 groups and at 128 alike. Weighing the
    shared axis too would not move this midpoint, but at 2048 tokens it would pull the 3:1 weighting (by
    hand: distances 1 and 3 in log2, weights 1 and 1/9, (400 + 100/9) / (10/9) = 370) toward the mean."""
    from meshplan.cost_models.compute import _interpolate_points

    points = ((8, 256, 1024, 1024, 100.0), (8, 4096, 1024, 1024, 400.0))
    assert _interpolate_points(points, 8, 1024, 1024, 1024) == pytest.approx(250.0)
    assert _interpolate_points(points, 128, 1024, 1024, 1024) == pytest.approx(250.0)
    assert _interpolate_points(points, 128, 2048, 1024, 1024) == pytest.approx(370.0)
    assert _interpolate_points(points, 8, 2048, 1024, 1024) == pytest.approx(370.0)


@pytest.mark.parametrize("name,bf16_mamf,fp8_mamf", [("gb200-186g-nvl72", 0.729 * 2500, 0.723 * 5000),
                                                     ("b200-180g-dgx", 0.776 * 2250, 0.763 * 4500)])
def test_blackwell_grouped_gemms_follow_the_h200s_shape_curve_only_under_their_form(name, bf16_mamf, fp8_mamf):
    """forms.py grouped_rate: "transferred" prices a Blackwell grouped GEMM at the lent H200's measured rate for
    the shape (539 TFLOP/s at 4096 tokens of 2048 x 768, 765 of 2048 x 7168; benchmarks/results/
    grouped_gemm-NVIDIA_H200-9816110.md) over the H200's bf16 MAMF (0.803 x 989), times the part's MAMF
    in the GEMM's dtype; "matmul" ignores those points, and the H200's own points count under both."""
    from meshplan.cost_models import forms
    dev = load_profile(name).device
    h200_mamf = 0.803 * 989
    for (m, n, k), h200_rate in (((4096, 2048, 768), 539.0), ((4096, 2048, 7168), 765.0)):
        for dtype, mamf in (("bf16", bf16_mamf), ("fp8", fp8_mamf)):
            with forms.forms(grouped_rate="transferred"):
                t = grouped_matmul_time(dev, 8, m, n, k, dtype)
            rate = 2 * m * n * k / t / 1e12
            assert rate == pytest.approx(dev.sustained_fraction * h200_rate / h200_mamf * mamf, rel=2e-3)
            with forms.forms(grouped_rate="matmul"):
                assert grouped_matmul_time(dev, 8, m, n, k, dtype) == matmul_time(dev, m, n, k, dtype)
    # A narrow expert runs far below a wide one under the curve, level with it as matmuls.
    with forms.forms(grouped_rate="transferred"):
        narrow, wide = (2 * 4096 * 2048 * k / grouped_matmul_time(dev, 8, 4096, 2048, k, "bf16") for k in (768, 7168))
    assert narrow / wide == pytest.approx(539 / 765, rel=2e-3)
    h200 = load_profile("h200-141g-dgx").device
    with forms.forms(grouped_rate="matmul"):
        assert grouped_matmul_time(h200, 8, 4096, 2048, 768, "bf16") == pytest.approx(
            2 * 4096 * 2048 * 768 / (h200.sustained_fraction * 539e12))


def test_saturating_form_recovers_a_known_curve_and_extrapolates_to_its_level():
    """forms.py grouped_shape "saturating": points drawn from rate = 800 x m/(m+400) x n/(n+800) x k/(k+60) on
    the H200 grid's shapes give back those half-rate dimensions, and a shape four times past the grid in every
    axis gets the curve's own rate, by hand; inverse-distance weighting alone returns a blend of the grid's."""
    from meshplan.cost_models.compute import _interpolate_points, _saturating_fit, _saturating_rate

    def curve(m: float, n: float, k: float) -> float:
        return 800.0 * m / (m + 400) * n / (n + 800) * k / (k + 60)

    grid = [(64, 768, 2048), (256, 1536, 4096), (1024, 2048, 768), (4096, 2048, 7168), (256, 7168, 2048),
            (4096, 4096, 1536), (64, 4096, 1536)]
    points = tuple((8, m, n, k, curve(m, n, k)) for m, n, k in grid)
    assert _saturating_fit(points, 800.0) == pytest.approx((400.0, 800.0, 60.0), rel=1e-4)
    far = (16384, 28672, 28672)
    by_hand = 800.0 * 16384 / 16784 * 28672 / 29472 * 28672 / 28732
    assert _saturating_rate(points, 800.0, 8, *far) == pytest.approx(by_hand, rel=1e-4)
    assert _interpolate_points(points, 8, *far) < 0.95 * by_hand
    for p in points:
        assert _saturating_rate(points, 800.0, *p[:4]) == pytest.approx(p[4], rel=1e-9)


def test_saturating_form_keeps_measured_rates_and_never_passes_the_best_matmul():
    """On the H200's measured points (the H100 profiles carry them): each measured shape keeps its rate under
    either form, and no shape, however large, runs above the part's MAMF rate (0.803 x 989 TFLOP/s bf16)."""
    from meshplan.cost_models import forms
    dev = load_profile("h100-80g-dgx").device
    best = dev.matmul.max_fraction["bf16"] * dev.peak_tflops["bf16"]
    for (m, n, k), rate in H200_GROUPED.items():
        with forms.forms(grouped_shape="saturating"):
            t = grouped_matmul_time(dev, 8, m, n, k, "bf16")
        assert 2 * m * n * k / t / 1e12 / dev.sustained_fraction == pytest.approx(rate, rel=1e-9)
    for m, n, k in ((4096, 16384, 6144), (65536, 65536, 65536), (4096, 2048, 7168)):
        with forms.forms(grouped_shape="saturating"):
            t = grouped_matmul_time(dev, 1, m, n, k, "bf16")
        assert 2 * m * n * k / t / 1e12 / dev.sustained_fraction <= best * (1 + 1e-12)


def test_extrapolated_form_is_the_blend_inside_the_grid_and_the_curves_growth_beyond_it():
    """forms.py grouped_shape "extrapolated": inside the measured range of every axis the points' blend itself;
    twice past the grid's largest token count (8192 against 4096), the blend at 4096 times the fitted curve's
    growth from 4096 to 8192 tokens, m/(m+h_m) at each, by hand; never above the part's best."""
    from meshplan.cost_models.compute import _extrapolated_rate, _interpolate_points, _saturating_fit

    def curve(m: float, n: float, k: float) -> float:
        return 800.0 * m / (m + 400) * n / (n + 800) * k / (k + 60)

    grid = [(64, 768, 2048), (256, 1536, 4096), (1024, 2048, 768), (4096, 2048, 7168), (256, 7168, 2048),
            (4096, 4096, 1536), (64, 4096, 1536)]
    points = tuple((8, m, n, k, 0.9 * curve(m, n, k)) for m, n, k in grid)  # measured at 0.9 of the curve
    inside = (8, 512, 3000, 3000)
    assert _extrapolated_rate(points, 800.0, *inside) == _interpolate_points(points, *inside)
    hm = _saturating_fit(points, 800.0)[0]
    edge = _interpolate_points(points, 8, 4096, 2048, 7168)
    by_hand = edge * (8192 / (8192 + hm)) / (4096 / (4096 + hm))
    assert _extrapolated_rate(points, 800.0, 8, 8192, 2048, 7168) == pytest.approx(by_hand, rel=1e-12)
    # Far past the grid in every axis: the blend at the grid's corner over the curve's level there, times 800.
    h = _saturating_fit(points, 800.0)
    corner = (4096, 7168, 7168)
    level = 800.0 * (corner[0] / (corner[0] + h[0])) * (corner[1] / (corner[1] + h[1])) * (corner[2] / (corner[2] + h[2]))
    far = _interpolate_points(points, 8, *corner) * 800.0 / level
    assert _extrapolated_rate(points, 800.0, 8, 1e12, 1e12, 1e12) == pytest.approx(min(800.0, far), rel=1e-6)
