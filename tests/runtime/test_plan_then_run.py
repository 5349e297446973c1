"""The newcomer's loop, end to end: `meshplan plan` for cpu-gloo on 2 ranks, then `meshplan run` of
best.yaml and of the next two candidates of best.candidates.csv; each trains 2 steps."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

from typing import Any

import pytest
import yaml

from meshplan.specs.plan import plan_from_dict

TIMEOUT_S = 300
PLAN_ARGS = ["--model", "tiny-4l", "--gpus", "2", "--cluster", "cpu-gloo", "--seq-len", "128", "--global-batch", "8"]


def meshplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _value(text: str) -> Any:
    """A candidates-CSV cell as the plan file has it."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


def plan_of_row(row: dict[str, str]) -> dict[str, Any]:
    """The plan mapping a candidates-CSV row describes (its plan columns; estimates left out)."""
    out: dict[str, Any] = {"model": row["model"], "cluster": row["cluster"], "gpus": int(row["gpus"]),
                           "compile": _value(row["compile"]), "mesh_order": row["mesh_order"].split(","),
                           "training": {}, "parallel": {}, "memory": {}}
    for key, text in row.items():
        section, _, name = key.partition(".")
        if section in ("training", "parallel", "memory"):
            value = _value(text)
            if name in ("sac_ops", "pp_layers") and value is not None:
                value = [_value(v) for v in str(value).split(",")]
            out[section][name] = value
    return out


@pytest.mark.distributed
@pytest.mark.slow
def test_plan_then_run_best_and_next_two(tmp_path):
    best = tmp_path / "best.yaml"
    res = meshplan("plan", *PLAN_ARGS, "--out", str(best))
    assert res.returncode == 0, res.stderr[-3000:]
    with open(tmp_path / "best.candidates.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["rank"]) for r in rows[:3]] == [1, 2, 3]
    first = plan_of_row(rows[0])
    written = yaml.safe_load(best.read_text())
    for section in ("training", "parallel", "memory"):  # the CSV's rank 1 is best.yaml
        assert first[section] == written[section], section

    plans = [best]
    for row in rows[1:3]:
        path = tmp_path / f"candidate{row['rank']}.yaml"
        plan_from_dict(plan_of_row(row)).save(path)
        plans.append(path)
    for path in plans:
        out = tmp_path / f"run-{path.stem}"
        res = meshplan("run", "--plan", str(path), "--steps", "2", "--out", str(out), "--quiet")
        assert res.returncode == 0, f"{path.name}:\n{path.read_text()}\n{res.stderr[-3000:]}"
        losses = [json.loads(line)["loss"] for line in open(out / "metrics.jsonl") if line.strip()]
        assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
        assert losses[1] < losses[0], (path.name, losses)
