"""The workload `meshplan plan` assumes: checked against published batch sizes and by hand."""

from __future__ import annotations

import pytest

from meshplan.planner.defaults import default_global_batch, default_seq_len, is_host_cpu
from meshplan.planner.summary import differing_fields
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import plan_from_dict
from meshplan.specs.registry import resolve_model


def test_seq_len_is_the_models_context_up_to_the_pretraining_length():
    assert default_seq_len(resolve_model("tiny-4l"))[0] == 256        # its max_seq_len
    assert default_seq_len(resolve_model("llama2-7b"))[0] == 4096     # Llama 2's context
    assert default_seq_len(resolve_model("llama3-70b"))[0] == 8192    # 128k context, pre-trained at 8k


def test_gpu_batches_are_the_published_ones():
    h100 = load_profile("h100-80g-dgx")
    # TorchTitan Table 1: Llama 3.1 8B on 8 H100s, local batch 2 x 8192 -> 16 sequences.
    assert default_global_batch(resolve_model("llama3-8b"), 8192, 8, h100, "bf16")[0] == 16
    # TorchTitan Table 4: 70B on 256 GPUs, global batch 512 at 8192.
    assert default_global_batch(resolve_model("llama3-70b"), 8192, 256, h100, "bf16")[0] == 512
    # Llama 3 paper: 405B at 16M tokens = 2,048 sequences of 8,192 on 16k GPUs; never more.
    assert default_global_batch(resolve_model("llama3-405b"), 8192, 16384, h100, "bf16")[0] == 2048
    assert default_global_batch(resolve_model("llama3-405b"), 8192, 32768, h100, "bf16")[0] == 2048


@pytest.mark.parametrize("model, seq, gpus, dtype", [("tiny-4l", 256, 2, "fp32"), ("tiny-4l", 256, 2, "bf16"),
                                                     ("small", 128, 4, "fp32"), ("small", 512, 4, "fp32")])
def test_cpu_batch_is_the_largest_power_of_two_stepping_within_a_second(model, seq, gpus, dtype):
    """Brute force over powers of two: the default is the largest whose estimated DDP step (the
    whole step, not one matmul's rate) is at most HOST_STEP_S; the next one is over it."""
    from meshplan.planner.defaults import HOST_STEP_S, ddp_step_s

    cpu = load_profile("cpu-gloo")
    assert is_host_cpu(cpu) and not is_host_cpu(load_profile("h100-80g-dgx"))
    spec = resolve_model(model)
    batch, note = default_global_batch(spec, seq, gpus, cpu, dtype)
    fits = [b for b in (gpus * 2**i for i in range(14)) if ddp_step_s(spec, seq, gpus, cpu, dtype, b) <= HOST_STEP_S]
    assert batch == (max(fits) if fits else gpus), (batch, fits)  # at least one sequence a process
    assert batch & (batch - 1) == 0 and "estimated step of about 1 s" in note


def _plan(order):
    return plan_from_dict({"version": 1, "model": "tiny-4l", "cluster": "cpu-gloo", "gpus": 4,
                           "training": {"seq_len": 128, "global_batch": 8, "micro_batch": 1, "dtype": "fp32"},
                           "parallel": {"dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 1, "pp": 1},
                           "memory": {"activation_checkpointing": "none"}, "compile": False, "mesh_order": order})


def test_planner_table_shows_the_field_that_tells_rows_apart():
    a = _plan(["pp", "dp_replicate", "dp_shard", "cp", "tp"])
    b = _plan(["pp", "dp_replicate", "cp", "dp_shard", "tp"])
    same_dims_moved = _plan(["dp_replicate", "pp", "dp_shard", "cp", "tp"])  # only size-1 dims moved
    assert differing_fields([a, b]) == ["mesh_order"]
    assert differing_fields([a, same_dims_moved]) == []


def test_a_measured_cpu_profile_with_a_bf16_peak_is_still_a_cpu():
    """profile-cluster finds a bf16 rate on CPUs with AMX/AVX-512 BF16; the backend it recorded decides."""
    from dataclasses import replace

    cpu = load_profile("cpu-gloo")
    with_bf16 = replace(cpu, device=replace(cpu.device, peak_tflops={**cpu.device.peak_tflops, "bf16": 2.8}),
                        provenance={**(cpu.provenance or {}), "world": {"device_type": "cpu", "backend": "gloo"}})
    assert is_host_cpu(with_bf16)
    gpu = load_profile("h100-80g-dgx")
    assert not is_host_cpu(replace(gpu, provenance={**(gpu.provenance or {}), "world": {"device_type": "cuda"}}))
