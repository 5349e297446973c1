"""The workload `meshplan plan` assumes: checked against published batch sizes and by hand."""

from __future__ import annotations

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


def test_cpu_batch_is_about_a_second_of_matmul_work():
    cpu = load_profile("cpu-gloo")
    assert is_host_cpu(cpu) and not is_host_cpu(load_profile("h100-80g-dgx"))
    spec = resolve_model("tiny-4l")
    batch, note = default_global_batch(spec, 256, 2, cpu, "fp32")
    # By hand: model FLOPs per token of tiny-4l at seq 256 = 6 * (4 layers x (q,k,v,o: 64x64 + 2x 64x32
    # + 64x64) + (3 x 64x128)) + 6 * 64 x 256 (head) + attention 4 layers x 6 x 2 x 256 x 64.
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    flops_per_token = 6 * (4 * per_layer + 64 * 256) + 4 * 6 * 2 * 256 * 64
    seconds = batch * 256 * flops_per_token / (2 * 0.03 * 1e12)   # ~0.03 TFLOP/s per CPU process
    assert 0.25 < seconds < 2.5, seconds      # a power of two below ~1 s of work, measured rate +-2x
    assert batch & (batch - 1) == 0 and "per step on this CPU profile" in note


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
