"""Which published rows the tagged profile points price (forms.py attention_rate and grouped_rate choose on
the MoE tables alone because of this): no dense row's attention runs a point tagged in_step, and no dense row
runs on a part carrying transferred grouped points; every MoE row's attention runs in_step points (cuDNN's, which
Transformer Engine runs), and the Blackwell ones run transferred grouped points, the H100 ones the H200's own."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost_models.compute import _kernel_points
from meshplan.cost_models.crossval import is_moe_source, step_time_rows
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.profiles.registry import load_profile


def _attention_points(row):
    plan = row.plan
    if plan.training.micro_batch == "auto":  # the kernel does not depend on it
        plan = replace(plan, training=replace(plan.training, micro_batch=1))
    prof = load_profile(plan.cluster)
    lay = replace(runtime_paths(layout_of(plan), prof), **row.layout_overrides)
    if lay.attention_kernel == "eager":
        return prof, []
    dtype = lay.attention_dtype or lay.dtype
    return prof, _kernel_points(prof.device.attention.points, dtype, "tflops", lay.attention_kernel)


def test_dense_rows_run_no_tagged_point_and_blackwell_moe_rows_run_in_step_ones():
    rows = step_time_rows()  # the rows the forms are chosen on (nested cross-validation)
    dense = [r for r in rows if not is_moe_source(r.table)]
    moe = [r for r in rows if is_moe_source(r.table)]
    assert len(dense) >= 180 and len(moe) >= 50
    for r in dense:
        prof, pts = _attention_points(r)
        assert not any(p.get("in_step") for p in pts), r.label
        assert not any(p.get("transferred") for p in prof.device.matmul.grouped_points), r.label
    parts = {"NVIDIA B200 180GB": True, "NVIDIA GB200": True, "NVIDIA H100 SXM 80GB": False}  # transferred?
    for r in moe:
        prof, pts = _attention_points(r)
        assert prof.device.name in parts, r.label
        assert pts and all(p.get("in_step") for p in pts), r.label
        transferred = [p.get("transferred", False) for p in prof.device.matmul.grouped_points]
        assert transferred and all(t == parts[prof.device.name] for t in transferred), r.label
