"""The newcomer's loop, end to end: `meshplan plan` for cpu-gloo on 2 ranks, then `meshplan run` of
best.yaml and of the next two candidates of best.candidates.csv; each trains 2 steps."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from meshplan.specs.outputs import plan_mapping_of_candidate
from meshplan.specs.plan import plan_from_dict

TIMEOUT_S = 300
PLAN_ARGS = ["--model", "tiny-4l", "--gpus", "2", "--cluster", "cpu-gloo", "--seq-len", "128", "--global-batch", "8"]


def meshplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.distributed
@pytest.mark.slow
def test_plan_then_run_best_and_next_two(tmp_path):
    best = tmp_path / "best.yaml"
    res = meshplan("plan", *PLAN_ARGS, "--out", str(best))
    assert res.returncode == 0, res.stderr[-3000:]
    with open(tmp_path / "best.candidates.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["rank"]) for r in rows[:3]] == [1, 2, 3]
    first = plan_mapping_of_candidate(rows[0])
    written = yaml.safe_load(best.read_text())
    for section in ("training", "parallel", "memory"):  # the CSV's rank 1 is best.yaml
        assert first[section] == written[section], section

    plans = [best]
    for row in rows[1:3]:
        path = tmp_path / f"candidate{row['rank']}.yaml"
        plan_from_dict(plan_mapping_of_candidate(row)).save(path)
        plans.append(path)
    for path in plans:
        out = tmp_path / f"run-{path.stem}"
        res = meshplan("run", "--plan", str(path), "--steps", "2", "--out", str(out), "--quiet")
        assert res.returncode == 0, f"{path.name}:\n{path.read_text()}\n{res.stderr[-3000:]}"
        losses = [json.loads(line)["loss"] for line in open(out / "metrics.jsonl") if line.strip()]
        assert len(losses) == 2 and all(math.isfinite(x) for x in losses), losses
        assert losses[1] < losses[0], (path.name, losses)
