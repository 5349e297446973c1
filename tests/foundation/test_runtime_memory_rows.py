"""The runtime's own runs on a lent H200 as memory validation rows (published.runtime_memory_rows): what
they hold is what gpu_truth measured, they are judged on memory alone, and they give the allocator's
slack a second source beside TorchTitan."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from meshplan.cost_models import constants
from meshplan.cost_models.crossval import _sources_text, row_errors, source_of, step_errors, step_time_rows, training_rows
from meshplan.cost_models.published import MEMORY_ONLY, runtime_memory_rows
from meshplan.cost_models.validate import validation_results

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
SESSION = RESULTS / "gpu_session-NVIDIA_H200-19a97d1"
# gpu_truth's own tables of the same runs, written on the GPU machine (not by the code under test)
TRUTH_CSVS = ("gpu_truth-NVIDIA_H200-2026-11-28-3b-19a97d1.csv", "gpu_truth-NVIDIA_H200-2026-11-28-moe1b-19a97d1.csv")


def _truth() -> dict[str, dict[str, str]]:
    out = {}
    for name in TRUTH_CSVS:
        with (RESULTS / name).open() as f:
            for r in csv.DictReader(f):
                if r["reserved_gib"]:
                    out[r["name"].replace("/", "-")] = r
    return out


def test_every_row_holds_the_memory_gpu_truth_measured():
    rows = runtime_memory_rows()
    truth = _truth()
    assert len(rows) == len(truth) == 8
    for row in rows:
        run = row.label.split(" ")[0]
        assert row.metric == MEMORY_ONLY and row.table == constants.RUNTIME_RUNS
        assert row.published == row.published_memory_gib == pytest.approx(float(truth[run]["reserved_gib"]), abs=1e-4)
        assert row.plan.cluster == "h200-141g-dgx" and row.plan.gpus == 1


def test_the_data_file_is_the_scripts_output(tmp_path):
    """data/measured/runtime_runs.json is what benchmarks/runtime_memory_rows.py writes from the committed
    run summaries: rerun, it comes out byte for byte."""
    spec = importlib.util.spec_from_file_location("runtime_memory_rows", ROOT / "benchmarks" / "runtime_memory_rows.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "runs.json"
    import sys
    argv, sys.argv = sys.argv, ["runtime_memory_rows.py", str(SESSION), "--out", str(out)]
    try:
        script.main()
    finally:
        sys.argv = argv
    assert out.read_text() == (ROOT / "meshplan" / "data" / "measured" / "runtime_runs.json").read_text()
    runs = json.loads(out.read_text())["runs"]
    assert {r["allocator_conf"] for r in runs} == {"expandable_segments:True"}


def test_memory_rows_have_no_step_time_and_a_memory_error():
    rows = runtime_memory_rows()
    errs = row_errors(rows)
    assert all(e.step is None for e in errs) and step_errors(errs) == []
    for row, e in zip(rows, errs):
        # within 5 % of what the GPU reserved, as shipped (-2.6 % to +2.5 % before the slack was refitted on them)
        assert abs(e.memory) < 0.05, row.label
    # step time is judged on the published rows alone
    assert not [r for r in step_time_rows() if r.metric == MEMORY_ONLY]
    # the memory-only rows: these 8 and torchao's 2 power-limited B200 runs (published, no step time scored)
    assert len(training_rows()) - len(step_time_rows()) == 10
    assert {r.table for r in training_rows() if r.metric == MEMORY_ONLY} == {constants.RUNTIME_RUNS,
                                                                          constants.TORCHAO_B200}


def test_validate_lists_them_as_a_table_of_their_own():
    rows = [r for r in validation_results() if r["table"] == constants.RUNTIME_RUNS]
    assert len(rows) == 8
    assert all(r["metric"] == MEMORY_ONLY and r["error"] == pytest.approx(r["memory_error"]) for r in rows)


def test_the_allocator_slack_rests_on_three_sources():
    frag = constants.profile_constant("overheads.memory_fragmentation").fitted_on
    assert list(frag) == [constants.EVERY_GPU]
    assert _sources_text(frag[constants.EVERY_GPU]) == "3 sources"
    assert {source_of(t) for t in frag[constants.EVERY_GPU]} == {"TorchTitan H100", constants.TORCHAO_FLOAT8,
                                                                 constants.RUNTIME_RUNS}
