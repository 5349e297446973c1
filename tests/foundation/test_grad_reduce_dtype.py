"""memory.grad_reduce_dtype: the dtype data-parallel gradients are reduced and accumulated in, on every stack.
bf16 halves the bytes each reduction sends and the buffer gradients accumulate in (FSDP2's accumulators under
pipelining; Megatron-Core's whole-model gradient buffer); checked by hand from the model's parameter count.
That the runtime sends bf16 and half the bytes is measured in tests/runtime/test_layouts.py."""

from __future__ import annotations

import pytest

from meshplan.cost_models.estimate import ComputeWindows, data_parallel_comm, estimate_plan, group_spans
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.cost_models.memory import optimizer_step_memory
from meshplan.cost_models.published import moe_blackwell_rows
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import plan_from_dict
from plan_base import base_plan

GIB = 2**30
PROFILE = load_profile("h100-80g-dgx")
# Llama 3 8B over 32 H100s, FSDP: base_plan's mapping at a real size
RAW = base_plan("llama3-8b", "h100-80g-dgx")
RAW.update(gpus=32, compile=True)
RAW["training"].update(seq_len=8192, global_batch=256, micro_batch=1)
RAW["parallel"]["dp_shard"] = 32
RAW["memory"]["activation_checkpointing"] = "full"


def plan(stack: str = "meshplan", dtype: str = "bf16", parallel: dict | None = None, **memory):
    return plan_from_dict({**RAW, "stack": stack, "training": {**RAW["training"], "dtype": dtype},
                           "parallel": {**RAW["parallel"], **(parallel or {})}, "memory": {**RAW["memory"], **memory}})


def refused(**kw) -> str:
    with pytest.raises(InputError) as err:
        plan(**kw)
    assert err.value.field == "memory.grad_reduce_dtype" and "\n" not in str(err.value)
    return str(err.value)


def test_the_field_reads_writes_only_when_set_and_refuses_in_one_line():
    assert "grad_reduce_dtype" not in plan().to_dict()["memory"]
    assert plan_from_dict(plan(grad_reduce_dtype="bf16").to_dict()).memory.grad_reduce_dtype == "bf16"
    assert "training.dtype bf16" in refused(dtype="fp32", grad_reduce_dtype="bf16")
    assert "training.dtype is auto" in refused(dtype="auto", grad_reduce_dtype="bf16")  # the search may pick fp32
    # TorchTitan's mixed_precision_reduce acts through fully_shard alone
    assert "fully_shard" in refused(stack="torchtitan", grad_reduce_dtype="bf16",
                                    parallel={"dp_shard": 1, "dp_replicate": 32})
    plan(stack="torchtitan", grad_reduce_dtype="bf16")  # dp_shard 32: accepted
    # Megatron-LM accumulates in fp32 only beside fp32 main gradients
    assert "main_grads_dtype" in refused(stack="megatron-core", grad_reduce_dtype="fp32", main_grads_dtype="bf16")
    with pytest.raises(InputError) as err:
        plan(grad_reduce_dtype="fp16")
    assert err.value.field == "memory.grad_reduce_dtype"


def test_fsdp2_stacks_reduce_in_fp32_and_megatron_core_in_the_parameters_dtype_unless_told():
    for stack in ("meshplan", "torchtitan"):
        assert layout_of(plan(stack)).grad_reduce_bytes == 4
        assert layout_of(plan(stack, grad_reduce_dtype="bf16")).grad_reduce_bytes == 2
    assert layout_of(plan("megatron-core")).grad_reduce_bytes == 2  # grad_reduce_in_fp32 False by default
    assert layout_of(plan("megatron-core", dtype="fp32")).grad_reduce_bytes == 4
    assert layout_of(plan("megatron-core", grad_reduce_dtype="fp32")).grad_reduce_bytes == 4  # Megatron-LM's script


def test_a_bf16_reduce_scatter_sends_half_and_takes_about_half_the_time():
    """Llama 3 8B's 8.0e9 parameters reduce-scattered over 32 ranks: 32 GB in fp32, 16 GB in bf16. The time
    halves, less what the profile's bus bandwidth loses on each block's message at half the size (a few %)."""
    comm = {}
    for d in ("fp32", "bf16"):
        lay = runtime_paths(layout_of(plan(grad_reduce_dtype=d)), PROFILE)
        comm[d] = data_parallel_comm(lay, PROFILE, group_spans(lay, PROFILE), 0, ComputeWindows(1.0))
    assert 0.5 <= comm["bf16"].reduce_scatter / comm["fp32"].reduce_scatter < 0.55
    assert comm["bf16"].all_gather == comm["fp32"].all_gather
    fp32, bf16 = (estimate_plan(plan(grad_reduce_dtype=d), PROFILE) for d in ("fp32", "bf16"))
    assert bf16.step_time_s <= fp32.step_time_s


def test_fsdp2_accumulates_a_pipelined_stage_in_the_reduce_dtype():
    """PP 2 over FSDP 16: each stage's unsharded gradients accumulate across micro-batches in the reduce dtype
    (FSDPParam.to_accumulated_grad_if_needed), 4 or 2 bytes a parameter of the stage, whole at the peak."""
    par = {"dp_shard": 16, "pp": 2}
    fp32, bf16 = (estimate_plan(plan(parallel=par, grad_reduce_dtype=d), PROFILE) for d in ("fp32", "bf16"))
    assert bf16.memory_gib["grad_accumulators"] == pytest.approx(fp32.memory_gib["grad_accumulators"] / 2, rel=1e-12)
    assert fp32.memory_gib["grads"] == bf16.memory_gib["grads"]  # FSDP2 casts the reduced shard to fp32


def test_megatron_cores_gradient_buffer_holds_every_local_parameter_the_whole_step():
    """The distributed optimizer reduce-scatters into one buffer of every local parameter's gradient, unsharded,
    in the reduce dtype (ParamAndGradBuffer): 8.03e9 parameters x 4 bytes, beside the activations and through the
    optimizer step alike. Its fp32 shard is a view into an fp32 buffer (no grads beside it); a bf16 buffer's
    shard is cast to fp32 main gradients, 4 bytes a parameter over 32 ranks."""
    n = plan().model.num_params()
    for d, width in (("fp32", 4), ("bf16", 2)):
        p = plan("megatron-core", grad_reduce_dtype=d)
        est = estimate_plan(p, PROFILE)
        assert est.memory_gib["grad_accumulators"] * GIB == pytest.approx(width * n, rel=1e-9)
        step = optimizer_step_memory(runtime_paths(layout_of(p), PROFILE), 0, PROFILE.overheads)
        assert step.parts["grad_accumulators"] == pytest.approx(width * n, rel=1e-9)
        assert step.parts["grads"] == pytest.approx(0 if d == "fp32" else 4 * n / 32, rel=1e-9)


def test_a_run_megatron_bridge_completed_fits_once_reduced_as_its_scripts_reduce():
    """Qwen3-235B on 64 B200s (25.11) ran; Megatron-Bridge's performance scripts leave grad_reduce_in_fp32 False
    (Megatron-Core's default). Priced with an fp32 gradient buffer it would not fit its 180 GB."""
    row = next(r for r in moe_blackwell_rows() if "mb-25.11-qwen3-235b-b200-64g" in r.label)
    assert row.plan.memory.grad_reduce_dtype is None and layout_of(row.plan).grad_reduce_bytes == 2
    prof = load_profile(row.plan.cluster)
    as_run = estimate_plan(row.plan, prof, **row.layout_overrides)
    fp32 = row.plan.copy()
    fp32.memory.grad_reduce_dtype = "fp32"
    assert as_run.fits and not estimate_plan(fp32, prof, **row.layout_overrides).fits
