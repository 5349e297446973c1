"""`meshplan plan` in-process: --fix pins, --exclude, bad input (one line, exit 2, nothing written),
and what it says when nothing fits."""

from __future__ import annotations

import csv

import pytest
import yaml

from meshplan import cli

BASE = ["plan", "--model", "tiny-4l", "--gpus", "8", "--seq-len", "256", "--global-batch", "16"]


def plan_cmd(tmp_path, *extra):
    out = tmp_path / "best.yaml"
    return [*BASE, *extra, "--out", str(out)], out


def written(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


def test_fix_pins_are_kept(tmp_path, capsys):
    argv, out = plan_cmd(tmp_path, "--fix", "parallel.tp=2", "--fix", "memory.activation_checkpointing=full",
                         "--fix", "parallel.pp=2", "--fix", "parallel.pp_schedule=1F1B")
    assert cli.main(argv) == 0
    d = yaml.safe_load(out.read_text())
    assert d["parallel"]["tp"] == 2
    assert d["parallel"]["pp"] == 2
    assert d["parallel"]["pp_schedule"] == "1F1B"
    assert d["parallel"]["pp_virtual_stages"] == 1
    assert d["memory"]["activation_checkpointing"] == "full"
    assert d["memory"]["sac_ops"] is None
    p = d["parallel"]
    assert p["dp_replicate"] * p["dp_shard"] * p["cp"] * p["tp"] * p["pp"] == 8
    # every candidate in the CSV beside the plan keeps the pins too
    rows = list(csv.DictReader((tmp_path / "best.candidates.csv").open()))
    assert rows
    for r in rows:
        assert (r["parallel.tp"], r["parallel.pp"], r["parallel.pp_schedule"], r["memory.activation_checkpointing"]) \
            == ("2", "2", "1F1B", "full")


def test_fix_compile_and_micro_batch(tmp_path, capsys):
    argv, out = plan_cmd(tmp_path, "--fix", "compile=false", "--fix", "training.micro_batch=4")
    assert cli.main(argv) == 0
    d = yaml.safe_load(out.read_text())
    # Uncompiled, float8 is never offered on a GPU: slower than bf16 there (specs/rules.float8_compile_reason).
    assert d["compile"] is False and d["training"]["micro_batch"] == 4 and d["memory"]["float8"] is False


def test_fixing_float8_uncompiled_finds_no_plan_and_says_why(tmp_path, capsys):
    argv, out = plan_cmd(tmp_path, "--fix", "compile=false", "--fix", "memory.float8=true")
    assert cli.main(argv) != 0 and not out.exists()
    assert "float8 without compile on a GPU" in capsys.readouterr().err


def test_exclude_schedule_never_returned(tmp_path, capsys):
    argv, out = plan_cmd(tmp_path, "--fix", "parallel.pp=2", "--exclude", "parallel.pp_schedule=GPipe",
                         "--exclude", "parallel.pp_schedule=[ZBVZeroBubble, DualPipeV]", "--top", "50")
    assert cli.main(argv) == 0
    d = yaml.safe_load(out.read_text())
    assert d["parallel"]["pp"] == 2 and d["parallel"]["pp_schedule"] not in ("GPipe", "ZBVZeroBubble", "DualPipeV")
    schedules = {r["parallel.pp_schedule"] for r in csv.DictReader((tmp_path / "best.candidates.csv").open())}
    assert schedules and not schedules & {"GPipe", "ZBVZeroBubble", "DualPipeV"}, schedules


def test_exclude_via_search_api():
    """The library entry takes the same excludes: nothing excluded appears among scored leaves."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from planner_brute import make_plan

    from meshplan.planner.search import search
    from meshplan.profiles.registry import load_profile

    plan = make_plan("tiny-4l", 8, 256, 16, fix=("parallel.pp=2", "compile=true"))
    res = search(plan, load_profile("h100-80g-dgx"), top_k=20,
                 excludes={"parallel.pp_schedule": ["GPipe"], "parallel.tp": [2], "memory.float8": [True]})
    assert res.ranked
    for c in res.ranked + res.scored:
        assert c.layout.schedule != "GPipe" and c.layout.tp != 2 and not c.layout.float8


@pytest.mark.parametrize("fix,needle", [
    ("foo.tp=2", "foo.tp"),  # unknown section
    ("parallel.tpp=2", "parallel.tpp"),  # unknown field
    ("parallel.tp=three", "parallel.tp"),  # not an integer
    ("parallel.tp=8", "parallel.tp"),  # does not divide the 4 heads / 2 kv heads
    ("memory.activation_checkpointing=sometimes", "activation_checkpointing"),
    ("parallel.pp_schedule=Zigzag", "pp_schedule"),
    ("parallel.tp", "--fix"),  # no '='
    ("parallel.cp=3", "parallel"),  # degrees cannot multiply to 8
])
def test_bad_fix_is_one_line_exit_2_nothing_written(tmp_path, capsys, fix, needle):
    argv, out = plan_cmd(tmp_path, "--fix", fix)
    assert cli.main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert err and "\n" not in err, err
    assert "Traceback" not in cap.err + cap.out
    assert needle in err, err
    assert written(tmp_path) == []


def test_bad_exclude_is_one_line(tmp_path, capsys):
    argv, out = plan_cmd(tmp_path, "--exclude", "bogus=1")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "bogus" in err
    assert written(tmp_path) == []


def test_nothing_fits_names_memory_and_suggests(tmp_path, capsys):
    out = tmp_path / "best.yaml"
    assert cli.main(["plan", "--model", "llama3-70b", "--gpus", "2", "--out", str(out)]) == 2
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    err = cap.err
    assert "no plan fits" in err
    assert "GiB" in err  # how much memory is needed
    assert "GPUs" in err  # and how many GPUs it would take at least
    assert written(tmp_path) == []


def test_nothing_fits_json(tmp_path, capsys):
    out = tmp_path / "best.yaml"
    assert cli.main(["plan", "--model", "llama3-70b", "--gpus", "2", "--out", str(out), "--json"]) == 2
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["best"] is None and d["what_would_fit"]
    n = d["search"]["counts"]
    assert n["accounted"] == n["space"] and n["rejected_by_reason"].get("does not fit in memory")
    assert written(tmp_path) == []


def test_nothing_fits_suggests_a_configuration_that_fits(tmp_path, capsys):
    out = tmp_path / "best.yaml"
    assert cli.main(["plan", "--model", "llama3-70b", "--gpus", "2", "--out", str(out)]) == 2
    assert "fits at" in capsys.readouterr().err


def test_impossible_pipeline_is_not_reported_as_memory(tmp_path, capsys):
    argv, out = plan_cmd(tmp_path, "--fix", "parallel.pp=8")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "memory" not in err and ("n_layers" in err or "pp" in err), err
    assert written(tmp_path) == []


def test_a_moe_model_is_planned_with_ep_searched_and_only_what_runs(tmp_path, capsys):
    """tiny-moe (8 experts) on 4 CPU ranks: every scored candidate's EP folds into dp_shard x cp x tp and
    divides the experts, EP is searched (more than one degree scored), and every candidate is one the
    runtime builds (eager; with TP, SP and EP folding TP: specs/rules.moe_tp_reason)."""
    from meshplan.specs.registry import BUILTIN_MODELS
    from meshplan.specs.rules import ep_reason, moe_tp_reason

    out = tmp_path / "best.yaml"
    argv = ["plan", "--model", "tiny-moe", "--gpus", "4", "--cluster", "cpu-gloo", "--seq-len", "128",
            "--global-batch", "8", "--out", str(out), "--top", "40"]  # EP 2 ranks below the top 10 here
    assert cli.main(argv) == 0
    assert "refuses it" not in capsys.readouterr().out
    assert "ep" in yaml.safe_load(out.read_text())["parallel"]
    rows = list(csv.DictReader((tmp_path / "best.candidates.csv").open()))
    spec = BUILTIN_MODELS["tiny-moe"]
    for r in rows:
        ep, dp_shard, cp, tp = (int(r[f"parallel.{k}"]) for k in ("ep", "dp_shard", "cp", "tp"))
        assert ep_reason(spec, ep, dp_shard, cp, tp) is None
        assert moe_tp_reason(True, ep, tp, r["parallel.sequence_parallel"] == "True") is None
        assert r["compile"] == "False"
    assert len({r["parallel.ep"] for r in rows}) > 1


def test_qwen3_235b_on_256_h100s_is_planned_with_expert_parallelism(tmp_path, capsys):
    """Issue 28's target: the plan for Qwen3-235B-A22B on 256 GPUs (the default H100 cluster) folds EP in.
    Without EP each rank runs all 128 experts on 1,024 tokens apiece, which the H100 profile prices at
    the grouped kernel's measured rate for so few tokens (test_grouped_matmul.py), well below a dense
    matmul's; EP 8 gives each of 16 local experts about 5,000."""
    out = tmp_path / "best.yaml"
    assert cli.main(["plan", "--model", "qwen3-235b-a22b", "--gpus", "256", "--out", str(out)]) == 0
    best = yaml.safe_load(out.read_text())
    p = best["parallel"]
    assert best["cluster"] == "h100-80g-dgx" and p["ep"] > 1
    assert (p["dp_shard"] * p["cp"] * p["tp"]) % p["ep"] == 0 and 128 % p["ep"] == 0


@pytest.mark.parametrize("through", [["-m", "meshplan"], ["-c", "from meshplan.cli import entry; entry()"]])
def test_a_process_that_skips_finalisation_leaves_everything_written(tmp_path, through):
    """`meshplan plan` ends its process without the interpreter's finalisation (cli.SKIP_FINALISATION):
    its JSON on stdout is whole, its files are in place, its exit code is main's; bad input still exits 2."""
    import json
    import subprocess
    import sys

    argv, out = plan_cmd(tmp_path, "--json")
    proc = subprocess.run([sys.executable, *through, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["files"]["plan"] == str(out) and out.is_file()
    assert (tmp_path / "best.candidates.csv").is_file()
    assert yaml.safe_load(out.read_text())["parallel"] == data["best"]["plan"]["parallel"]
    bad = subprocess.run([sys.executable, *through, *BASE, "--gpus", "0", "--out", str(tmp_path / "b.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--gpus" in bad.stderr and not (tmp_path / "b.yaml").exists()
