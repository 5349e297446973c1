"""Fixtures: plan files, a planner output (plan + candidates CSV), a run directory, one full HTML report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshplan.cli import main as cli_main
from report_fixtures import candidates_frame, make_plan, plan_dict


def write_plan_files(folder: Path) -> list[Path]:
    """1F1B vs Interleaved1F1B (PP) and a plan without PP."""
    paths = []
    for name, par in [("one_f_one_b", {}), ("interleaved", {"pp_schedule": "Interleaved1F1B", "pp_virtual_stages": 2}),
                      ("no_pp", {"pp": 1, "dp_shard": 16, "pp_schedule": "1F1B"})]:
        p = folder / f"{name}.yaml"
        make_plan(**par).save(p)
        paths.append(p)
    return paths


def write_search_output(folder: Path) -> tuple[Path, Path]:
    plan = folder / "best.yaml"
    make_plan().save(plan)
    csv = folder / "best.candidates.csv"
    candidates_frame().to_csv(csv, index=False)
    return plan, csv


def write_run_dir(folder: Path) -> Path:
    d = folder / "run1"
    d.mkdir()
    rows = [{"step": s, "loss": 10.0 / (1 + s), "step_time_s": 2.0 + 0.1 * (s == 1), "tokens_per_s_per_gpu": 900.0 + s,
             "mfu": 0.4, "peak_memory_gib": 30.0} for s in range(1, 9)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"measured": {"step_time_s": 2.0, "tokens_per_s_per_gpu": 905.0, "peak_memory_gib": 30.0},
               "predicted": {"step_time_s": 1.6, "tokens_per_s_per_gpu": 1000.0, "peak_memory_gib": 25.0},
               # As the run writes them (runtime/metrics.ratios): measured / predicted.
               "ratio_measured_over_predicted": {"step_time_s": 2.0 / 1.6, "tokens_per_s_per_gpu": 905.0 / 1000.0,
                                                 "peak_memory_gib": 30.0 / 25.0},
               "plan": plan_dict(), "versions": {"torch": "2.13.0"}}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


@pytest.fixture
def plan_files(tmp_path: Path) -> list[Path]:
    return write_plan_files(tmp_path)


@pytest.fixture
def search_output(tmp_path: Path) -> tuple[Path, Path]:
    return write_search_output(tmp_path)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return write_run_dir(tmp_path)


@pytest.fixture(scope="session")
def full_html(tmp_path_factory) -> Path:
    """One HTML report of every input kind: three plans, a run and a planner output (rendered once)."""
    folder = tmp_path_factory.mktemp("full")
    inputs = [*write_plan_files(folder), write_run_dir(folder), write_search_output(folder)[0]]
    out = folder / "r.html"
    assert cli_main(["report", *map(str, inputs), "-o", str(out)]) == 0
    return out
