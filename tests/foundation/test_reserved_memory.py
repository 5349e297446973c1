"""Allocated, reserved and device peaks kept apart: reserved is the allocated peak plus the caching
allocator's slack (the profile's memory_fragmentation, or pp_memory_fragmentation where FSDP2
accumulates gradients under pipelining), the device peak adds the CUDA/NCCL context."""

from __future__ import annotations

import pytest

from meshplan.cost_models.estimate import estimate_plan
from meshplan.profiles.registry import load_profile
from meshplan.reports.run_summary import summary_rows
from meshplan.specs.plan import plan_from_dict

PLAN = {"version": 1, "model": "llama3-8b", "cluster": "h100-80g-dgx", "gpus": 8,
        "training": {"seq_len": 8192, "global_batch": 16, "micro_batch": 1, "dtype": "bf16"},
        "parallel": {"dp_replicate": 1, "dp_shard": 8, "tp": 1, "pp": 1, "cp": 1, "sequence_parallel": False,
                     "async_tp": False, "pp_schedule": "1F1B", "pp_virtual_stages": 1},
        "memory": {"activation_checkpointing": "full", "float8": False, "reshard_after_forward": True},
        "compile": False}


def test_reserved_is_allocated_plus_allocator_slack_and_the_device_peak_adds_context():
    prof = load_profile("h100-80g-dgx")
    frag, context = prof.overheads.memory_fragmentation, prof.overheads.context_gib
    assert (frag, context) == (0.057, 1.0)  # the profile's values (fitted slack, context from practice)
    est = estimate_plan(plan_from_dict(PLAN), prof)
    assert est.reserved_peak_gib == pytest.approx(est.allocated_peak_gib * (1 + frag), rel=1e-12)
    assert est.peak_memory_gib == pytest.approx(est.reserved_peak_gib + context, rel=1e-12)
    out = est.to_json()
    assert out["reserved_peak_memory_gib"] == est.reserved_peak_gib
    assert out["allocated_peak_memory_gib"] == est.allocated_peak_gib


def test_pipelined_fsdp_plans_take_the_pipelined_slack():
    prof = load_profile("h100-80g-dgx")
    assert prof.overheads.pp_memory_fragmentation == 0.264
    pipelined = {**PLAN, "parallel": {**PLAN["parallel"], "dp_shard": 4, "pp": 2}}
    est = estimate_plan(plan_from_dict(pipelined), prof)
    assert est.reserved_peak_gib == pytest.approx(est.allocated_peak_gib * 1.264, rel=1e-12)
    # Without FSDP there are no unsharded accumulators: the plain slack.
    ddp = {**PLAN, "parallel": {**PLAN["parallel"], "dp_shard": 1, "dp_replicate": 4, "pp": 2}}
    est = estimate_plan(plan_from_dict(ddp), prof)
    assert est.reserved_peak_gib == pytest.approx(est.allocated_peak_gib * 1.057, rel=1e-12)


def test_run_summary_shows_reserved_only_where_it_was_measured():
    predicted = {"step_time_s": 1.0, "tokens_per_s_per_gpu": 10.0, "mfu": 0.5, "peak_memory_gib": 3.0,
                 "peak_memory_allocated_gib": 1.8, "peak_memory_reserved_gib": 2.0}
    cpu = {"measured": {"step_time_s": 1.0, "tokens_per_s_per_gpu": 10.0, "peak_memory_gib": 1.7,
                        "peak_memory_reserved_gib": None}, "predicted": predicted}
    cuda = {"measured": {**cpu["measured"], "peak_memory_reserved_gib": 2.1}, "predicted": predicted}
    assert not any("reserved" in r.label for r in summary_rows(cpu))
    row = next(r for r in summary_rows(cuda) if "reserved" in r.label)
    assert (row.measured, row.predicted) == (2.1, 2.0)
