"""profile-cluster's host link (device.host_link_gbs): timed on a GPU each way against pinned host memory, the
slower direction kept; a CPU process has none. A measured profile with one prices activation offloading."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from meshplan.bench import compute
from meshplan.bench.builder import _device_section
from meshplan.bench.env import BenchEnv
from meshplan.bench.memory import MemoryResult
from meshplan.bench.worker import RawResults
from meshplan.cost_models.plan_checks import check_against_profile
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.profiles.schema import _device
from meshplan.specs.plan import plan_from_dict

H100 = "NVIDIA H100 80GB HBM3"
OFFLOADING = {"version": 1, "model": "qwen3-30b-a3b", "cluster": "h100-80g-dgx", "gpus": 8, "stack": "megatron-core",
              "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "dtype": "bf16"},
              "parallel": {"dp_replicate": 1, "dp_shard": 8, "tp": 1, "sequence_parallel": False, "async_tp": False,
                           "pp": 1, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "cp": 1, "ep": 8},
              "memory": {"activation_checkpointing": "none", "float8": False, "reshard_after_forward": False,
                         "offload_modules": ["moe_act"]},
              "compile": False}


def _env(device: torch.device) -> BenchEnv:
    return BenchEnv(rank=0, world=1, local_rank=0, local_world=1, nnodes=1,
                    backend="nccl" if device.type == "cuda" else "gloo", device=device)


def _raw(host_link: dict | None) -> RawResults:
    mm = [{"m": d, "n": d, "k": d, "dtype": "bf16", "tflops": 700.0 * d / (d + 100), "spread": 0.01}
          for d in (1024, 4096, 8192)]
    att = [{"seq_len": s, "batch": 1, "heads": 32, "head_dim": 128, "dtype": "bf16", "tflops": 300.0 + s / 100,
            "bwd_tflops": 250.0, "spread": 0.01} for s in (1024, 2048, 4096)]
    return RawResults(H100, ["bf16"], mm, att, "bf16", 2600.0, 0.8, MemoryResult(79.2, 78.0, 0.5, "test"), [], [], [],
                      1.0, host_link=host_link)


def test_a_cpu_process_has_no_host_link():
    assert compute.bench_host_link(_env(torch.device("cpu")), compute.ComputeSettings(0.01, 1)) is None
    device, prov = _device_section(_raw(None), _env(torch.device("cpu")))
    assert "host_link_gbs" not in device and "device.host_link_gbs" not in prov


def test_the_slower_direction_is_kept_and_both_are_said():
    device, prov = _device_section(_raw({"d2h_gbs": 52.31, "h2d_gbs": 55.04}), _env(torch.device("cuda", 0)))
    assert device["host_link_gbs"] == pytest.approx(52.31, rel=1e-3)
    assert "52.3" in prov["device.host_link_gbs"] and "55.0" in prov["device.host_link_gbs"]
    assert _device(device, "device").host_link_gbs == pytest.approx(52.31, rel=1e-3)


def test_a_measured_host_link_lets_a_plan_offload():
    """Without a host link the offloading plan is refused in one line; with the measured one it is priced."""
    plan = plan_from_dict(OFFLOADING)
    builtin = load_profile("h100-80g-dgx")
    without = replace(builtin, device=replace(builtin.device, host_link_gbs=None))
    with pytest.raises(InputError) as err:
        check_against_profile(plan, without)
    assert err.value.field == "memory.offload_modules"
    device, _ = _device_section(_raw({"d2h_gbs": 52.31, "h2d_gbs": 55.04}), _env(torch.device("cuda", 0)))
    measured = replace(builtin, device=replace(builtin.device, host_link_gbs=device["host_link_gbs"]))
    check_against_profile(plan, measured)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: pinned copies over its host link")
def test_the_link_is_timed_each_way_on_a_gpu():
    link = compute.bench_host_link(_env(torch.device("cuda", 0)), compute.ComputeSettings(0.05, 3))
    # PCIe Gen4 x16 moves 31.5 GB/s one way, NVLink-C2C 450: any real link lies between a few and that
    assert set(link) == {"d2h_gbs", "h2d_gbs"} and all(2.0 < v < 500.0 for v in link.values())
