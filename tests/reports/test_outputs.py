"""HTML, Markdown and CSV outputs, the planner hook and one-line errors for bad inputs."""

import base64
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from meshplan.cli import main as cli_main
from meshplan.errors import InputError
from meshplan.reports import write_report_for_search
from meshplan.reports.inputs import load_inputs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_markdown_report_writes_images_beside_it(plan_files, tmp_path, capsys):
    out = tmp_path / "out" / "r.md"
    assert cli_main(["report", str(plan_files[0]), str(plan_files[1]), "-o", str(out)]) == 0
    text = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert sorted(Path(l).name for l in links) == ["gantt_0.png", "gantt_1.png", "memory.png", "time_breakdown.png"]
    for link in links:
        assert link.startswith("r_files/")
        assert (out.parent / link).read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in (out.parent / "r_files").iterdir()) == sorted(Path(l).name for l in links)
    # the schedules differ: those rows are marked, equal rows are not
    assert "| **parallel.pp_schedule** ≠ | **1F1B** | **Interleaved1F1B** |" in text
    assert "| parallel.tp | 4 | 4 |" in text
    # rewriting with fewer pictures leaves no stale files and no temp folders
    assert cli_main(["report", str(plan_files[2]), "-o", str(out)]) == 0
    assert sorted(p.name for p in (out.parent / "r_files").iterdir()) == ["memory.png", "time_breakdown.png"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.md", "r_files"]


def test_html_is_self_contained(full_html):
    html = full_html.read_text()
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', html)
    # 3 PP plans/run/search with Gantt (2 of the plans, the run, the search) + time + memory + search + run
    assert len(srcs) == 4 + 2 + 1 + 1
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert not re.search(r'(src|href)="(?!data:)', html)
    assert "http://" not in html and "https://" not in html
    assert 'class="diff"' in html and "measured / predicted" in html


def test_csv_round_trips_one_row_per_configuration(plan_files, run_dir, tmp_path):
    out = tmp_path / "r.csv"
    assert cli_main(["report", *map(str, plan_files), str(run_dir), "-o", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame["name"]) == ["one_f_one_b", "interleaved", "no_pp", "run1"]
    assert list(frame["kind"]) == ["plan", "plan", "plan", "run"]
    configs = load_inputs(plan_files)
    for i, config in enumerate(configs):
        est = config.estimate
        row = frame.iloc[i]
        assert row["step_time_s"] == pytest.approx(est.step_time_s, rel=1e-12)
        assert row["parallel.pp_schedule"] == config.plan.parallel.pp_schedule
        parts = {k: row[f"time_s.{k}"] for k in est.time_s}
        assert parts == pytest.approx(est.time_s, rel=1e-12)
        for rank in est.per_rank_memory_gib:
            assert row[f"rank{rank['pp_rank']}.memory_gib.total"] == pytest.approx(rank["total"], rel=1e-12)
        assert json.loads(row["pipeline.stage_layers"]) == list(est.pipeline["stage_layers"])
    run = frame.iloc[3]
    assert run["ratio.step_time_s"] == pytest.approx(2.0 / 1.6)
    assert run["measured.tokens_per_s_per_gpu"] == 905.0
    # same inputs, same CSV: two reports diff cleanly
    again = tmp_path / "again.csv"
    assert cli_main(["report", *map(str, plan_files), str(run_dir), "-o", str(again)]) == 0
    assert again.read_text() == out.read_text()


def test_report_for_search(search_output, tmp_path):
    plan, csv = search_output
    out = write_report_for_search(plan, csv, tmp_path / "search.html")
    html = out.read_text()
    assert "Planner search" in html and "8 candidates" in html
    assert html.count("<img ") == 4  # time, memory, gantt, search


def test_run_with_unknown_cluster_still_reports_measurements(run_dir, tmp_path):
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["plan"]["cluster"] = str(tmp_path / "gone.yaml")
    (run_dir / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "r.md"
    assert cli_main(["report", str(run_dir), "-o", str(out)]) == 0
    text = out.read_text()
    assert "no current estimate" in text and "| step_time_s | 2.000 | 1.600 | 1.25x |" in text


@pytest.mark.parametrize("case", ["missing", "suffix", "empty_dir", "bad_jsonl", "bad_summary", "auto", "out_suffix"])
def test_bad_inputs_are_one_line_errors(case, plan_files, run_dir, tmp_path, capsys):
    out = tmp_path / "r.html"
    if case == "missing":
        args = [str(tmp_path / "nope.yaml")]
    elif case == "suffix":
        p = tmp_path / "plan.txt"
        p.write_text("x")
        args = [str(p)]
    elif case == "empty_dir":
        (tmp_path / "empty").mkdir()
        args = [str(tmp_path / "empty")]
    elif case == "bad_jsonl":
        (run_dir / "metrics.jsonl").write_text("{not json\n")
        args = [str(run_dir)]
    elif case == "bad_summary":
        (run_dir / "summary.json").write_text("[1, 2]")
        args = [str(run_dir)]
    elif case == "auto":
        p = tmp_path / "auto.yaml"
        p.write_text("model: llama3-8b\ncluster: h100-80g-dgx\ngpus: 8\n")
        args = [str(p)]
    else:
        args, out = [str(plan_files[0])], tmp_path / "r.pdf"
    assert cli_main(["report", *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("meshplan report: error: ") and err.count("\n") == 1
    assert not out.exists()


def test_load_inputs_names_are_unique(plan_files, tmp_path):
    other = tmp_path / "sub"
    other.mkdir()
    copy = other / plan_files[0].name
    copy.write_text(plan_files[0].read_text())
    names = [c.name for c in load_inputs([plan_files[0], copy, plan_files[0]])]
    assert len(set(names)) == 3
    with pytest.raises(InputError):
        load_inputs([])


def test_report_cells_are_written_for_people():
    """The HTML and Markdown reports' numbers: no scientific notation (was 1.239e+04, 0.02661, 6.735e-04)."""
    from meshplan.reports.tables import format_cell

    assert format_cell(12390.4, "tokens/s per GPU") == "12,390"
    assert format_cell(0.02661, "MFU") == "2.7%"
    assert format_cell(6.735e-4, "peak memory (GiB)") == "0.000674"
    assert format_cell(73.456, "params", "pp rank 0", "Memory per rank (GiB): a") == "73.5"
    assert format_cell(12.2417, "step_time_s") == "12.24"
    assert format_cell(0.9512, "step_time_s", "measured / predicted") == "0.95x"
    assert format_cell(8192, "training.seq_len") == "8,192"
    assert format_cell(True, "fits") == "yes" and format_cell(None, "x") == "-"


def test_a_moe_plans_report_shows_its_expert_terms(tmp_path, capsys):
    """Expert parallelism's terms reach the report: EP, tokens per local expert and the exposed all-to-all,
    the same numbers as `estimate --json` prints under `moe`."""
    plan = tmp_path / "moe.yaml"
    plan.write_text("model: qwen3-30b-a3b\ncluster: h100-80g-dgx\ngpus: 8\n"
                    "training: {seq_len: 4096, global_batch: 16, micro_batch: 1, dtype: bf16}\n"
                    "parallel: {dp_replicate: 1, dp_shard: 8, tp: 1, sequence_parallel: false, async_tp: false, pp: 1,"
                    " pp_schedule: 1F1B, pp_virtual_stages: 1, cp: 1, ep: 8}\n"
                    "memory: {activation_checkpointing: full, float8: false, reshard_after_forward: true}\n"
                    "compile: false\n")
    assert cli_main(["estimate", "--plan", str(plan), "--json"]) == 0
    moe = json.loads(capsys.readouterr().out)["moe"]
    # 4096 tokens x top-8 x imbalance 1.23 over 128 / 8 = 16 local experts
    assert moe["ep"] == 8 and moe["local_experts"] == 16
    assert moe["tokens_per_local_expert"] == pytest.approx(4096 * 8 * 1.23 / 16)
    assert moe["ep_comm_exposed_s"] > 0
    out = tmp_path / "r.md"
    assert cli_main(["report", str(plan), "-o", str(out)]) == 0
    text = out.read_text()
    assert "Mixture-of-experts terms" in text and "tokens per local expert" in text
    assert f"{moe['tokens_per_local_expert']:,.0f}" in text


def test_plan_fields_show_the_stack_and_leave_out_what_no_plan_sets(tmp_path):
    """The same layout on two stacks prices differently, so the table says which stack each plan is for; a
    stack's own field (memory.recompute_modules) is a row where some plan sets it, and no row of blanks
    where none does (pp_layers on an even split likewise)."""
    base = ("model: llama3-8b\ncluster: h100-80g-dgx\ngpus: 8\n"
            "training: {seq_len: 4096, global_batch: 8, micro_batch: 1, dtype: bf16}\n"
            "parallel: {dp_replicate: 1, dp_shard: 8, tp: 1, sequence_parallel: false, async_tp: false, pp: 1,"
            " pp_schedule: 1F1B, pp_virtual_stages: 1, cp: 1}\n"
            "memory: {activation_checkpointing: selective, float8: false, reshard_after_forward: false%s}\n"
            "compile: false\n")
    plain, mcore = tmp_path / "plain.yaml", tmp_path / "mcore.yaml"
    plain.write_text(base % "")
    mcore.write_text(base % ", recompute_modules: [core_attn, mlp]" + "stack: megatron-core\n")
    out = tmp_path / "r.md"
    assert cli_main(["report", str(plain), str(mcore), "-o", str(out)]) == 0
    text = out.read_text()
    assert "| **stack** ≠ | **meshplan** | **megatron-core** |" in text
    assert '| **memory.recompute_modules** ≠ | **-** | **["core_attn", "mlp"]** |' in text
    assert "pp_layers" not in text
    assert cli_main(["report", str(plain), "-o", str(out)]) == 0
    assert "recompute_modules" not in out.read_text()
    # the CSV keeps every field, set or not
    csv = tmp_path / "r.csv"
    assert cli_main(["report", str(plain), "-o", str(csv)]) == 0
    row = pd.read_csv(csv).iloc[0]
    assert "memory.recompute_modules" in row.index and row["stack"] == "meshplan"
