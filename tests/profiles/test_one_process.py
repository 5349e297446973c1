"""`meshplan profile-cluster --nproc 1`: a one-GPU (here one-CPU-process) machine gets a profile."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshplan.profiles.registry import load_profile, nearest_builtin


def test_nearest_builtin_by_part():
    assert nearest_builtin("NVIDIA H100 80GB HBM3") == "h100-80g-dgx"
    assert nearest_builtin("NVIDIA H200") == "h200-141g-dgx"
    assert nearest_builtin("NVIDIA A100-SXM4-80GB") == "a100-80g-dgx"
    assert nearest_builtin("Intel(R) Xeon(R) Processor (CPU process)") == "cpu-gloo"


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_one_process_measures_the_device_and_borrows_collectives(tmp_path):
    out = tmp_path / "one.yaml"
    res = subprocess.run([sys.executable, "-m", "meshplan", "profile-cluster", "--nproc", "1", "--quick",
                          "--out", str(out)], capture_output=True, text=True, timeout=220)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "not measured (1 process)" in res.stdout
    got, donor = load_profile(str(out)), load_profile("cpu-gloo")
    assert got.collectives == donor.collectives and got.links == donor.links
    assert got.provenance["world"] == {"world_size": 1, "nnodes": 1, "local_world_size": 1, "backend": "gloo",
                                       "device_type": "cpu"}
    assert "taken from the built-in cpu-gloo" in got.provenance["collectives"]
    # The device itself was measured here: matmul points and a host cost per op.
    assert got.device.matmul.points and got.overheads.op_dispatch_s > 0
    # The routed experts' grouped GEMMs, with the kernel the runtime takes on a CPU.
    assert got.device.matmul.grouped_points
    assert all(p["kernel"] == "grouped_mm" and p["tflops"] > 0 for p in got.device.matmul.grouped_points)
    assert got.overheads.checkpoint_op_s > 0 and got.overheads.sac_op_s > 0
    # Attention in every dtype a CPU run can train in, at a small model's head and a large one's
    series = {(p["dtype"], p["head_dim"]) for p in got.device.attention.points}
    dtypes = {p["dtype"] for p in got.device.matmul.points}
    assert series == {(dt, h) for dt in dtypes for h in (16, 64)}, series
    assert all(p["bwd_tflops"] > 0 for p in got.device.attention.points)
    # A CPU has no fp8 GEMM: the provenance says so, the printed summary too, and no fp8 peak is made up
    assert "fp8 matmul not measured (CPU" in got.provenance["device.matmul"]
    assert "fp8" not in got.device.peak_tflops and "matmul best TFLOP/s: fp32 " in res.stdout
