"""The constants registry, the 1-D fit, the sustained fraction and the error band."""

import csv
from dataclasses import replace
from importlib import resources

import pytest

from meshplan.cost_models import constants
from meshplan.cost_models.band import band_of, device_class
from meshplan.cost_models.compute import matmul_tflops
from meshplan.cost_models.crossval import RowError, _golden, _objective, transform_of
from meshplan.cost_models.estimate import estimate_plan
from meshplan.cost_models.published import torchtitan_rows
from meshplan.profiles.registry import builtin_names, load_profile


def test_golden_section_finds_a_hand_known_minimum():
    assert _golden(lambda x: (x - 0.3) ** 2, 0.0, 1.0) == pytest.approx(0.3, abs=2e-3)


def test_spread_objective_takes_each_sources_level_out():
    """Two sources, log errors (a: 0.1, 0.3; b: -0.2, -0.2): squared about their own means, (0.01 + 0.01 + 0 +
    0) / 4 = 0.005; plain mean squared error 0.18 / 4 = 0.045."""
    import math

    errs = [RowError("a", "1", math.expm1(0.1)), RowError("a", "2", math.expm1(0.3)),
            RowError("b", "1", math.expm1(-0.2)), RowError("b", "2", math.expm1(-0.2))]
    assert _objective(errs, spread=True) == pytest.approx(0.005)
    assert _objective(errs) == pytest.approx(0.045)


def test_sources_count_publications_not_tables():
    """TorchTitan's six tables are one publication; compile_speedup rests on two (TorchTitan and IBM)."""
    from meshplan.cost_models.crossval import source_of

    assert {source_of(t) for t in constants.TORCHTITAN} == {"TorchTitan H100"}
    assert source_of(constants.MEGATRON) == constants.MEGATRON
    compiled = constants.profile_constant("overheads.compile_speedup").fitted_on[constants.EVERY_GPU]
    assert len(compiled) == 3 and len({source_of(t) for t in compiled}) == 2
    # the MoE rows: Megatron-Bridge's four model tables are one publication, the model zoo's and Megatron-LM's
    # DeepSeek-V3 notes one each
    assert [source_of(t) for t in constants.MOE_TABLES] == [constants.MEGATRON_BRIDGE_MOE] * 4 + [
        constants.MOE_MODEL_ZOO, constants.MEGATRON_LM_GB200]
    host = constants.profile_constant("overheads.moe_expert_host_s").fitted_on[constants.EVERY_GPU]
    assert len({source_of(t) for t in host}) == 3


def test_a_constant_fitted_for_every_gpu_reaches_every_gpu_profile_and_no_other():
    t = transform_of({("overheads.fsdp_overlap", constants.EVERY_GPU): 0.5})
    gpus = [n for n in builtin_names() if load_profile(n).device.peak_tflops.get("bf16", 0) > 100]
    for name in builtin_names():
        got = t(name, load_profile(name)).overheads.fsdp_overlap
        assert (got == 0.5) == (name in gpus), name
    assert len(gpus) == 6


def test_sustained_fraction_scales_matmul_rate_linearly():
    prof = load_profile("h100-96g-gt")
    full = replace(prof.device, sustained_fraction=1.0)
    # 0.803 x 989 TFLOP/s by hand (half_dim 0: MAMF's rate at a compute-bound shape), times the profile's 0.702
    assert matmul_tflops(full, 8192, 8192, 8192, "bf16") == pytest.approx(0.803 * 989, rel=1e-6)
    assert matmul_tflops(prof.device, 8192, 8192, 8192, "bf16") == pytest.approx(
        0.702 * matmul_tflops(full, 8192, 8192, 8192, "bf16"), rel=1e-9)


def test_thin_matmul_runs_at_the_rooflines_memory_bound():
    dev = load_profile("h100-80g-dgx").device  # 3350 GB/s datasheet x 0.7 achievable
    # 16 tokens through an 8192 x 8192 bf16 weight: 2*16*8192*8192 FLOPs over (16*8192 + 8192*8192 + 16*8192) x 2
    # bytes = 15.9 FLOP/B at 2345 GB/s = 37.4 TFLOP/s by hand, far below the compute side's 0.702 x 0.803 x 989 = 558
    bytes_moved = 2.0 * (16 * 8192 + 8192 * 8192 + 16 * 8192)
    by_hand = 2.0 * 16 * 8192 * 8192 / (bytes_moved / (3350e9 * 0.7)) / 1e12
    assert by_hand == pytest.approx(37.4, abs=0.05)
    assert matmul_tflops(dev, 16, 8192, 8192, "bf16") == pytest.approx(by_hand, rel=1e-9)
    # float8 reads 1-byte operands and writes bf16: twice the bf16 intensity at this shape, nearly
    fp8_bytes = 1.0 * (16 * 8192 + 8192 * 8192) + 2.0 * 16 * 8192
    assert matmul_tflops(dev, 16, 8192, 8192, "fp8") == pytest.approx(
        2.0 * 16 * 8192 * 8192 / (fp8_bytes / (3350e9 * 0.7)) / 1e12, rel=1e-9)
    # a training-sized matmul is compute bound: the memory side does not bind
    assert matmul_tflops(dev, 8192, 1024, 8192, "bf16") == pytest.approx(0.702 * 0.803 * 989, rel=1e-6)


def test_model_constants_are_read_at_call_time_and_restored():
    row = torchtitan_rows()[0]
    base = estimate_plan(row.plan, replace(load_profile(row.plan.cluster)), **row.layout_overrides).step_time_s
    with constants.model_constants(norm_passes=2.0):
        fused = estimate_plan(row.plan, replace(load_profile(row.plan.cluster)), **row.layout_overrides).step_time_s
    again = estimate_plan(row.plan, replace(load_profile(row.plan.cluster)), **row.layout_overrides).step_time_s
    assert fused < base and again == base


def test_every_registered_constant_names_a_source():
    for f in constants.model_constant_fields():
        assert f.metadata["source"]
    for c in constants.PROFILE_CONSTANTS:
        assert c.source


def test_device_class():
    assert device_class("NVIDIA H100 SXM 96GB HBM2e (500 W)") == "H100"
    assert device_class("NVIDIA H100 SXM 80GB") == "H100"


def test_band_brackets_the_estimate_and_flags_mfu_above_published():
    row = torchtitan_rows()[10]  # 70B FSDP 32 x TP 8: MFU below the best published H100 float8 run
    est = estimate_plan(row.plan, load_profile(row.plan.cluster), **row.layout_overrides)
    band = band_of(row.plan, est)
    assert band.low_s <= est.step_time_s <= band.high_s
    assert not band.extrapolated
    fast = replace(est, mfu=0.9)  # 90 % of the bf16 peak: above every published H100 run
    assert band_of(row.plan, fast).extrapolated


def test_a_megatron_core_plan_is_compared_with_megatrons_published_runs():
    """A published Megatron-Bridge run's own plan (stack megatron-core) sits inside Megatron's published runs
    on its device and precision; the same layout on meshplan's runtime has no PyTorch run on a B200 in
    float8 to compare with, and says so."""
    from meshplan.cost_models.band import features
    from meshplan.cost_models.published import moe_blackwell_rows

    row = next(r for r in moe_blackwell_rows() if "mb-26.04.01-qwen3-30b-b200" in r.label)
    est = estimate_plan(row.plan, load_profile(row.plan.cluster), **row.layout_overrides)
    assert features(row.plan)["stack"] == "megatron"
    assert not band_of(row.plan, est).extrapolated
    ours = replace(row.plan, stack="meshplan")
    assert features(ours)["stack"] == "pytorch"
    flag, why = band_of(ours, est).extrapolated, band_of(ours, est).extrapolation
    assert flag and why.startswith("no published pytorch run on B200 (float8)")


def test_saved_out_of_sample_errors_are_those_of_the_current_model():
    """The bands read data/validation/oos_errors.json; a cost-model change that forgets to rerun
    `meshplan validate --cross --save` fails here instead of shipping stale bands."""
    import json
    from pathlib import Path

    import meshplan
    from meshplan.cost_models.crossval import cross_validate, oos_document

    saved = json.loads((Path(meshplan.__file__).parent / "data" / "validation" / "oos_errors.json").read_text())
    result = cross_validate()
    fresh = oos_document(result)
    assert [r["label"] for r in saved["rows"]] == [r["label"] for r in fresh["rows"]]
    for old, new in zip(saved["rows"], fresh["rows"]):
        assert old["oos_step_error"] == pytest.approx(new["oos_step_error"], abs=1e-4), old["label"]
        assert old["published_mfu"] == pytest.approx(new["published_mfu"], rel=1e-4), old["label"]
    # the fits `validate --constants` prints its leave-one-source-out ranges beside, written by the same run
    fits = {(f["constant"], f["profile"]): f["all"] for f in saved["fits"]}
    assert fits == pytest.approx({k: round(v, 6) for k, v in result.fitted_all.items()}, rel=1e-4)


def test_every_gpu_profile_ships_the_sustained_fraction_its_record_gives():
    """No GPU built-in prices matmuls at the raw best-shape burst (MAMF): each carries the factor that
    data/validation/sustained_fraction.csv records as fitted or transferred."""
    with resources.files("meshplan.data.validation").joinpath("sustained_fraction.csv").open() as f:
        record = {r["profile"]: float(r["sustained_fraction"]) for r in csv.DictReader(f)}
    gpus = [n for n in builtin_names() if load_profile(n).device.peak_tflops.get("bf16", 0) > 100]
    assert len(gpus) == 6
    for name in gpus:
        assert load_profile(name).device.sustained_fraction == pytest.approx(record[name]), name
        assert record[name] < 1.0


def test_the_blackwell_rate_leaves_out_rows_of_unmeasured_kernels_only_under_that_form():
    """forms.py rate_rows: the B200/GB200 sustained fraction is fitted on the MoE tables, less GPT-OSS's (its
    sink attention has no measured rate) under measured_kernels, all four under all; the other parts' fits,
    on tables with no unmeasured kernel, are the same under both."""
    from meshplan.cost_models import forms

    rate = constants.profile_constant("device.sustained_fraction")
    gpt_oss = f"{constants.MEGATRON_BRIDGE_MOE}: GPT-OSS-120B"
    with forms.forms(rate_rows="all"):
        every = rate.fitted_on
    with forms.forms(rate_rows="measured_kernels"):
        measured = rate.fitted_on
    assert every[constants.BLACKWELL_CLASS] == constants.MOE_TABLES
    assert measured[constants.BLACKWELL_CLASS] == tuple(t for t in constants.MOE_TABLES if t != gpt_oss)
    assert len(measured[constants.BLACKWELL_CLASS]) == 5
    for key in every:
        if key != constants.BLACKWELL_CLASS:
            assert every[key] == measured[key]
    # a constant that is not a device rate keeps GPT-OSS's rows under either form
    host = constants.profile_constant("overheads.moe_expert_host_s")
    assert gpt_oss in host.fitted_on[constants.EVERY_GPU]


def test_the_blackwell_memory_rate_is_fitted_only_under_that_form():
    """forms.py memory_rate: sourced (shipped) leaves device.memory_bound_efficiency at the profiles' 0.7;
    fitted fits it on the Blackwell MoE rows with the tensor-core rate, and on no other part."""
    from meshplan.cost_models import forms

    mem = constants.profile_constant("device.memory_bound_efficiency")
    assert forms.FORMS.memory_rate == "sourced" and mem.fitted_on == {}
    with forms.forms(memory_rate="fitted"):
        assert mem.fitted_on == {constants.BLACKWELL_CLASS: constants.MOE_TABLES}
    for name in ("b200-180g-dgx", "gb200-186g-nvl72"):
        assert load_profile(name).device.memory_bound_efficiency == 0.7


def test_leave_one_source_out_line_says_where_a_constant_has_no_row_left():
    """A constant fitted on one source keeps no value without it; the range spans the sources it keeps."""
    from meshplan.cost_models.crossval import leave_one_source_out_text

    single = {"profile": "h100-96g-gt", "all": 0.2674, "without_source": {"TorchTitan H100": None}}
    assert leave_one_source_out_text(single) == "h100-96g-gt: 0.2674 on every source, no row left without TorchTitan H100"
    three = {"profile": "every GPU profile", "all": 1.8, "without_source": {"a": 1.5, "b": 2.1, "c": None}}
    assert leave_one_source_out_text(three) == ("every GPU profile: 1.8 on every source, 1.5 .. 2.1 leaving one of 2 "
                                                "out, no row left without c")


def test_saved_fits_leave_a_single_source_constant_nothing_and_a_shared_one_a_value():
    """The saved leave-one-source-out fits against the tables each constant declares (constants.py): the
    allocator's slack under pipelining rests on TorchTitan's Tables 5 and 6 alone, so leaving TorchTitan out
    leaves it no row; async TP's share rests on two pages' A/B pairs, and leaving either out fits it on the
    other, inside its bounds; the Blackwell rate rests on three MoE publications, and leaving any one out
    still fits it."""
    from meshplan.cost_models.crossval import saved_fits, source_of

    fits = saved_fits()
    pp = fits[("overheads.pp_memory_fragmentation", "h100-96g-gt")]
    assert pp["without_source"] == {"TorchTitan H100": None}
    tp = fits[("overheads.tp_async_overlap", "h100-96g-gt")]
    assert set(tp["without_source"]) == {"TorchTitan H100", constants.TORCHTITAN_DOC_2024}
    assert all(0.0 < v < 1.0 for v in tp["without_source"].values())
    rate = fits[("device.sustained_fraction", constants.BLACKWELL_CLASS)]
    declared = {source_of(t) for t in constants.profile_constant("device.sustained_fraction").fitted_on[
        constants.BLACKWELL_CLASS]}
    assert set(rate["without_source"]) == declared and len(declared) == 3
    lo, hi = constants.profile_constant("device.sustained_fraction").bounds
    # inside the search range, not at its edge: a fold stopped at the bound would say the range, not the rows
    assert all(lo < v < hi for v in rate["without_source"].values())
