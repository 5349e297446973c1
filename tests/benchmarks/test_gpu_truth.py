"""benchmarks/gpu_truth.py: its statistics against hand computations, and one short run on CPU."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("gpu_truth", ROOT / "benchmarks" / "gpu_truth.py")
gpu_truth = importlib.util.module_from_spec(SPEC)
sys.modules["gpu_truth"] = gpu_truth
SPEC.loader.exec_module(gpu_truth)


def test_ranks_share_ties():
    assert gpu_truth.ranks([10.0, 30.0, 20.0, 20.0]) == [1.0, 4.0, 2.5, 2.5]


def test_spearman_by_hand():
    # d = rank differences (0, 0, 1, -1): rho = 1 - 6 * 2 / (4 * 15) = 0.8
    assert gpu_truth.spearman([1, 2, 3, 4], [10, 20, 40, 30]) == pytest.approx(0.8)
    assert gpu_truth.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert gpu_truth.spearman([1, 2], [1, 2]) is None
    assert gpu_truth.spearman([1, 2, 3], [5, 5, 5]) is None


def test_top1_regret_is_the_picks_time_over_the_best():
    R = gpu_truth.Result
    results = [R("a", "m", "planner #1", measured_s=1.2), R("b", "m", "planner #2", measured_s=1.0),
               R("c", "m", "variant x", measured_s=None, failed="OOM")]
    assert gpu_truth.top1_regret(results) == pytest.approx(0.2)
    assert gpu_truth.top1_regret(results[1:]) is None


def test_variants_force_one_knob_each():
    best = {"compile": False, "training": {"micro_batch": 2}, "memory": {"activation_checkpointing": "selective",
                                                                        "sac_ops": ["qkv"], "float8": False}}
    out = dict(gpu_truth.variants(best, fp8=True, quick=False))
    assert out["variant compile=True"]["compile"] is True
    assert out["variant activation_checkpointing=full"]["memory"] == {"activation_checkpointing": "full",
                                                                       "sac_ops": None, "float8": False}
    assert out["variant float8=True"]["memory"]["float8"] is True
    assert [k for k in out if "micro_batch" in k] == ["variant micro_batch=1", "variant micro_batch=2",
                                                      "variant micro_batch=4"]
    assert best["compile"] is False  # the best plan itself is left as it was
    assert not any("float8" in k for k in dict(gpu_truth.variants(best, fp8=False, quick=True)))
    assert not any("async_tp" in k for k in out)  # one GPU: no TP to make async


def test_async_tp_variants_take_tp_from_data_parallelism_on_two_gpus():
    best = {"compile": False, "training": {"micro_batch": 1},
            "memory": {"activation_checkpointing": "none", "sac_ops": None, "float8": False},
            "parallel": {"dp_replicate": 1, "dp_shard": 4, "tp": 1, "sequence_parallel": False, "async_tp": False}}
    out = dict(gpu_truth.variants(best, fp8=False, quick=True, gpus=4))
    on, off = out["variant async_tp=True"], out["variant async_tp=False"]
    assert on["parallel"] == {"dp_replicate": 1, "dp_shard": 2, "tp": 2, "sequence_parallel": True, "async_tp": True}
    assert off["parallel"] == {**on["parallel"], "async_tp": False}
    assert on["compile"] is True and off["compile"] is True  # async TP is an inductor pass
    odd = {**best, "parallel": {**best["parallel"], "dp_shard": 3}}
    assert not any("async_tp" in k for k in dict(gpu_truth.variants(odd, fp8=False, quick=True, gpus=3)))


@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_cpu_smoke_run_writes_a_row_per_plan(tmp_path):
    out = tmp_path / "results"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_truth.py"), "--cluster", "cpu-gloo",
                          "--models", "tiny-4l", "--gpus", "2", "--seq-len", "64", "--global-batch", "4", "--quick",
                          "--steps", "3", "--budget-s", "25", "--out", str(out)],
                         capture_output=True, text=True, timeout=380)
    assert res.returncode == 0, res.stdout + res.stderr
    [table] = list(out.glob("gpu_truth-*.csv"))
    rows = list(csv.DictReader(table.open()))
    assert rows and all(r["model"] == "tiny-4l" for r in rows)
    ran = [r for r in rows if r["measured_s"]]
    assert ran, rows
    for r in ran:
        assert float(r["predicted_s"]) > 0 and float(r["measured_s"]) > 0
        assert float(r["error"]) == pytest.approx(float(r["predicted_s"]) / float(r["measured_s"]) - 1)
    assert list(out.glob("gpu_truth-*.md"))
