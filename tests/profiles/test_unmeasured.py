"""A measured GPU profile takes what profile-cluster cannot measure from the built-in of the same part
(bench/unmeasured.py): the overheads fitted on published runs or sourced, not the schema's defaults; its measured
rates stay as measured. A CPU profile takes nothing."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path

import pytest
import torch

from meshplan.bench.builder import build_profile
from meshplan.bench.collectives import bus_factor
from meshplan.bench.contention import ContentionResult
from meshplan.bench.env import BenchEnv
from meshplan.bench.host import HostCosts
from meshplan.bench.memory import MemoryResult
from meshplan.bench.unmeasured import MEASURED_ON_GPU, UNMEASURED_OVERHEADS, take_unmeasured
from meshplan.bench.worker import RawResults, WorkerOptions
from meshplan.cost_models.estimate import estimate_plan
from meshplan.profiles.registry import load_profile, nearest_builtin
from meshplan.profiles.schema import Overheads, profile_from_dict
from meshplan.specs.plan import plan_from_dict
from meshplan.yamlio import atomic_write_yaml, load_yaml_file

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
HOST = HostCosts(op_dispatch_s=12e-6, python_dispatch_s=30e-6, checkpoint_op_s=31e-6, sac_op_s=33e-6)


def _raw(device_name: str, level: str) -> RawResults:
    """Two ranks' benchmarks: collectives on a straight latency + bytes / bandwidth line, a few matmul and
    attention points, and host costs no built-in carries."""
    points = []
    for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
        for s in (4096, 65536, MIB, 4 * MIB, 16 * MIB):
            t = 20e-6 + s * bus_factor(c, 2) / 300e9
            points.append({"collective": c, "level": level, "group_size": 2, "bytes": s, "time_s": t,
                           "busbw_gbs": s / t * bus_factor(c, 2) / 1e9, "p10_s": t, "p90_s": t, "samples": 10,
                           "median_se": 0.01})
    mm = [{"m": d, "n": d, "k": d, "dtype": "bf16", "tflops": 700.0 * d / (d + 100), "spread": 0.01}
          for d in (1024, 4096, 8192)]
    att = [{"seq_len": s, "batch": 1, "heads": 32, "head_dim": 128, "dtype": "bf16", "tflops": 300.0 + s / 100,
            "bwd_tflops": 250.0, "spread": 0.01} for s in (1024, 2048, 4096)]
    return RawResults(device_name, ["bf16"], mm, att, "bf16", 2600.0, 0.8, MemoryResult(79.2, 78.0, 0.5, "test"),
                      points, [], [], 1.0, host=HOST)


def _env(world: int, cuda: bool) -> BenchEnv:
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    return BenchEnv(0, world, 0, world, 1, "nccl" if cuda else "gloo", device, ["h"] * world, [0] * world)


def _opts(tmp_path) -> WorkerOptions:
    return WorkerOptions(out=str(tmp_path / "p.yaml"), name="t", quick=True, deadline=None, max_nodes=None,
                         node_link=None, network_link="network", description="", command="test")


@pytest.mark.parametrize("world", [1, 2])
def test_a_gpu_profile_takes_the_same_parts_fitted_overheads(tmp_path, world):
    """An H100 measured by two ranks or one: every overhead it does not measure is the built-in H100's, among
    them the compute slowdown beside a hidden collective that Lee et al. measured (18.9 %, arXiv 2507.03114);
    what it measures (host costs, context) is its own; its rates are taken as measured."""
    prof, _, _ = build_profile(_env(world, True), _opts(tmp_path), _raw("NVIDIA H100 80GB HBM3", "nvlink"))
    built = load_profile("h100-80g-dgx")
    assert prof.overheads.comm_compute_slowdown == pytest.approx(0.189)
    for name in UNMEASURED_OVERHEADS:
        assert getattr(prof.overheads, name) == getattr(built.overheads, name), name
    assert (prof.overheads.op_dispatch_s, prof.overheads.sac_op_s, prof.overheads.context_gib) == (12e-6, 33e-6, 0.5)
    assert prof.device.sustained_fraction == 1.0 and built.device.sustained_fraction < 0.8
    assert "the built-in h100-80g-dgx, the same part" in prof.provenance["overheads.transferred"]
    assert "0.189" in prof.provenance["overheads.transferred"]
    assert "overheads.fitted (from h100-80g-dgx)" in prof.provenance  # the donor's own sources travel with them
    atomic_write_yaml(str(tmp_path / "p.yaml"), prof.to_dict())
    assert load_profile(str(tmp_path / "p.yaml")) == prof


def test_a_measured_slowdown_is_kept_and_not_transferred(tmp_path):
    """Where two GPUs of a node timed matmuls beside their all-reduces (bench/contention.py), the profile
    carries that slowdown, the median round 1.12 less 1, in place of the built-in's sourced 0.189, and says so."""
    raw = replace(_raw("NVIDIA H100 80GB HBM3", "nvlink"),
                  contention=ContentionResult(0.050, 0.0568, 8192, 30, 256 * MIB, 2, [1.10, 1.12, 1.14], 3))
    prof, _, _ = build_profile(_env(2, True), _opts(tmp_path), raw)
    assert prof.overheads.comm_compute_slowdown == pytest.approx(0.12)
    assert "comm_compute_slowdown" not in prof.provenance["overheads.transferred"]
    assert prof.provenance["overheads.comm_compute_slowdown"].startswith("measured (bench/contention.py)")
    assert "3 of 3 rounds" in prof.provenance["overheads.comm_compute_slowdown"]
    assert prof.overheads.tp_async_overlap == load_profile("h100-80g-dgx").overheads.tp_async_overlap


def test_a_gpu_of_no_built_in_part_takes_the_h100s_and_says_so(tmp_path):
    assert nearest_builtin("NVIDIA L40S") == "cpu-gloo" and nearest_builtin("NVIDIA L40S", gpu=True) == "h100-80g-dgx"
    prof, _, _ = build_profile(_env(2, True), _opts(tmp_path), _raw("NVIDIA L40S", "nvlink"))
    assert prof.overheads.pp_memory_fragmentation == load_profile("h100-80g-dgx").overheads.pp_memory_fragmentation
    assert "h100-80g-dgx (no built-in of this part)" in prof.provenance["overheads.transferred"]


def test_a_cpu_profile_takes_nothing(tmp_path):
    """On a CPU, what a step hides is measured (nothing) and the CPU built-in is the test machine's."""
    prof, _, _ = build_profile(_env(2, False), _opts(tmp_path), _raw("Test CPU (CPU process)", "loopback"))
    defaults = Overheads()
    assert prof.overheads.comm_compute_slowdown == defaults.comm_compute_slowdown == 0.0
    assert prof.overheads.pp_memory_fragmentation is None and prof.overheads.moe_expert_host_s == 0.0
    assert "overheads.transferred" not in prof.provenance


def _as_measured(data: dict) -> dict:
    """A profile's dict as profile-cluster writes it on a GPU, before the transfer: only the measured overheads."""
    data["overheads"] = {k: v for k, v in data["overheads"].items() if k in MEASURED_ON_GPU}
    return data


def _llama70b(parallel: dict, float8: bool) -> dict:
    return {"version": 1, "model": "llama70b", "cluster": "h100-80g-dgx", "gpus": 256,
            "training": {"seq_len": 8192, "global_batch": 512, "micro_batch": 1, "dtype": "bf16"},
            "parallel": {"dp_replicate": 1, "tp": 2, "sequence_parallel": True, "async_tp": True, "pp": 1,
                         "pp_schedule": "1F1B", "pp_virtual_stages": 1, "cp": 1, **parallel},
            "memory": {"activation_checkpointing": "none", "float8": float8, "reshard_after_forward": True},
            "compile": True}


@pytest.mark.parametrize("parallel, float8", [({"dp_shard": 128}, True),
                                              ({"dp_shard": 32, "tp": 4, "pp": 2, "pp_schedule": "Interleaved1F1B",
                                                "pp_virtual_stages": 2}, False)])
def test_the_transfer_carries_every_term_an_estimate_reads(parallel, float8):
    """Llama 70B on 256 H100s, FSDP 128 x TP 2 (the plan `meshplan plan` picks) and a pipelined one: on the
    built-in as profile-cluster would write it, the schema's defaults price them apart from the built-in (the
    FSDP plan's hidden collectives free of contention, faster; the pipelined plan without FSDP2's slack under
    pipelining, over 10 GiB smaller); with the transfer both price exactly as on the built-in."""
    plan = plan_from_dict(_llama70b(parallel, float8))
    built = estimate_plan(plan, load_profile("h100-80g-dgx"))
    bare = estimate_plan(plan, profile_from_dict(_as_measured(load_profile("h100-80g-dgx").to_dict()), "bare"))
    if plan.parallel.pp > 1:
        assert built.peak_memory_gib - bare.peak_memory_gib > 10.0
    else:
        assert bare.step_time_s < 0.98 * built.step_time_s
    data = _as_measured(load_profile("h100-80g-dgx").to_dict())
    take_unmeasured(data, "h100-80g-dgx", same_part=True)
    moved = estimate_plan(plan, profile_from_dict(data, "transferred"))
    assert (moved.step_time_s, moved.peak_memory_gib) == (built.step_time_s, built.peak_memory_gib)
    assert {f.name for f in fields(Overheads)} == set(UNMEASURED_OVERHEADS) | MEASURED_ON_GPU


def test_measured_rates_are_not_derated_again():
    """The runtime's own compiled Llama 3.2 3B runs on a lent H200 (data/measured/runtime_runs.json), priced on
    the profile profile-cluster measured on that H200 (benchmarks/results/profile-h200-200s-19a97d1.yaml) with
    its unmeasured overheads transferred: within 8 % at the measured rates; derated again by the built-in's
    sustained fraction, which is relative to MAMF's best shape, over 15 % slow."""
    data = _as_measured(load_yaml_file(str(ROOT / "benchmarks/results/profile-h200-200s-19a97d1.yaml"), "cluster"))
    take_unmeasured(data, "h200-141g-dgx", same_part=True)
    measured = profile_from_dict(data, "measured")
    derated = replace(measured, device=replace(measured.device,
                                               sustained_fraction=load_profile("h200-141g-dgx").device.sustained_fraction))
    runs = json.loads((ROOT / "meshplan/data/measured/runtime_runs.json").read_text())["runs"]
    dense = [r for r in runs if r["plan"]["model"] == "llama3.2-3b" and r.get("step_time_s")]
    assert len(dense) == 4
    for run in dense:
        plan = plan_from_dict(run["plan"])
        assert abs(estimate_plan(plan, measured).step_time_s / run["step_time_s"] - 1) < 0.08, run["id"]
        assert estimate_plan(plan, derated).step_time_s / run["step_time_s"] - 1 > 0.15, run["id"]
