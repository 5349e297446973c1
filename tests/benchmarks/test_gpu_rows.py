"""benchmarks/plans/gpu_rows.csv: each measured step time is the one its committed output recorded."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
ROWS = list(csv.DictReader((ROOT / "benchmarks/plans/gpu_rows.csv").open()))


def recorded(source: str) -> list[float]:
    """Step times the source recorded: a run's summary.json, or every measured (and eager) step of a
    gpu_truth CSV."""
    path = ROOT / "benchmarks/results" / source
    if path.suffix == ".json":
        return [json.loads(path.read_text())["measured"]["step_time_s"]]
    return [float(r[col]) for r in csv.DictReader(path.open()) for col in ("measured_s", "eager_s") if r[col]]


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['plan']}@{r['source']}" for r in ROWS])
def test_each_row_is_what_its_output_recorded(row):
    assert (ROOT / "benchmarks/plans" / row["plan"]).is_file()
    assert any(abs(v - float(row["measured_s"])) < 5e-4 for v in recorded(row["source"])), row
