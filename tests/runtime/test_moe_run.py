"""`meshplan run` of mixture-of-experts plans end to end (issue 29): the plan the planner writes for tiny-moe
with EP 2 trains and reports tokens per expert beside the estimate; a DCP checkpoint written at EP 4
resumes at EP 2 and at FSDP 4 (no EP) with the losses of the uninterrupted run; bad input is one line."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import yaml

from cases import moe
from meshplan.specs.registry import BUILTIN_MODELS
from test_command import _error, meshplan_cli, meshplan_run, rows

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_the_planners_ep2_plan_runs_and_reports_its_routing(tmp_path):
    best = tmp_path / "best.yaml"
    meshplan_cli("plan", "--model", "tiny-moe", "--gpus", "2", "--cluster", "cpu-gloo", "--fix", "parallel.ep=2",
                 "--seq-len", "64", "--global-batch", "8", "--out", str(best))
    assert yaml.safe_load(best.read_text())["parallel"]["ep"] == 2
    out = tmp_path / "run"
    res = meshplan_run("--plan", str(best), "--steps", "3", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "measured" in res.stdout and "predicted" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    tokens = summary["measured"]["tokens_per_expert"]
    # 8 sequences of 64 tokens, top-2 of 8 experts: 128 pairs per expert on average, in every layer.
    assert tokens["mean"] == pytest.approx(8 * 64 * 2 / 8) and tokens["min"] <= tokens["mean"] <= tokens["max"]
    assert summary["measured"]["moe_imbalance"] >= 1.0 and math.isfinite(summary["measured"]["aux_loss"])
    # The imbalance the estimate assumed sits beside the measured one.
    assert summary["predicted"]["moe"]["ep"] == 2 and summary["predicted"]["moe"]["imbalance"] >= 1.0
    for row in rows(out / "metrics.jsonl"):
        assert len(row["tokens_per_expert"]) == 3 and row["aux_loss"] > 0


def _plan_file(tmp_path, name: str, **parallel) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(moe(**parallel)))
    return str(path)


def test_a_checkpoint_written_at_ep4_resumes_at_ep2_and_without_ep(tmp_path):
    """Balanced routing, fp32: layouts agree to ~1e-7 (test_moe_layouts.py), so 1e-5 separates a correct
    reshard from a wrong one (a lost expert, moments of the wrong expert: > 1e-3)."""
    ep4 = _plan_file(tmp_path, "ep4", dp_shard=4, ep=4)
    full = tmp_path / "full"
    res = meshplan_run("--plan", ep4, "--steps", "5", "--out", str(full), "--checkpoint-every", "3",
                       "--balanced-routing", "--track-memory", "off")
    assert res.returncode == 0, res.stderr[-3000:]
    uninterrupted = rows(full / "metrics.jsonl")
    for name, parallel in {"ep2": {"dp_shard": 4, "ep": 2}, "fsdp4": {"dp_shard": 4}}.items():
        resumed = tmp_path / name
        shutil.copytree(full / "checkpoints" / "step-00000003", resumed / "checkpoints" / "step-00000003")
        res = meshplan_run("--plan", _plan_file(tmp_path, name, **parallel), "--steps", "5", "--out", str(resumed),
                           "--resume", "--balanced-routing", "--track-memory", "off")
        assert res.returncode == 0, res.stderr[-3000:]
        again = rows(resumed / "metrics.jsonl")
        assert [r["step"] for r in again] == [4, 5]
        for a, b in zip(again, uninterrupted[3:]):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (name, a, b)


def test_moe_bad_input_is_one_line_exit_2(tmp_path):
    # EP that does not divide the experts (8).
    bad_ep = tmp_path / "ep3.yaml"
    plan = moe(dp_shard=3)
    plan["parallel"]["ep"] = 3
    bad_ep.write_text(yaml.safe_dump(plan))
    assert "parallel.ep" in _error(meshplan_run("--plan", str(bad_ep)))
    # A fold the runtime refuses: TP without EP.
    assert "parallel.ep" in _error(meshplan_run("--plan", _plan_file(tmp_path, "tp", tp=2, sequence_parallel=True)))
    # top_k above the expert count.
    plan = moe(dp_shard=2, ep=2)
    plan["model"] = {**BUILTIN_MODELS["tiny-moe"].to_dict(), "name": "k9"}
    plan["model"]["moe"]["top_k"] = 9
    topk = tmp_path / "topk.yaml"
    topk.write_text(yaml.safe_dump(plan))
    assert "top_k" in _error(meshplan_run("--plan", str(topk)))
    # A checkpoint of another expert count.
    out = tmp_path / "ckpt"
    res = meshplan_run("--plan", _plan_file(tmp_path, "ep2", dp_shard=2, ep=2), "--steps", "1", "--out", str(out),
                       "--track-memory", "off")
    assert res.returncode == 0, res.stderr[-3000:]
    plan["model"]["moe"]["top_k"] = 2
    plan["model"]["moe"]["experts"] = 4
    other = tmp_path / "four.yaml"
    other.write_text(yaml.safe_dump(plan))
    line = _error(meshplan_run("--plan", str(other), "--steps", "2", "--out", str(out), "--resume"))
    assert line.startswith("meshplan run: error: model") and "experts" in line
    # Balanced routing of a dense model would be silently ignored: refused.
    dense = tmp_path / "dense.yaml"
    dense.write_text(yaml.safe_dump({**moe(dp_shard=2), "model": "tiny"}))
    assert "--balanced-routing" in _error(meshplan_run("--plan", str(dense), "--balanced-routing"))
