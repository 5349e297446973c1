"""meshplan tune on a tiny space with 2 processes: a killed trial is recorded, the study resumes from SQLite."""

from __future__ import annotations

import optuna
import yaml

from meshplan.cli import main as cli_main
from meshplan.tuning.study import factorisations, pipeline_choices


def test_factorisations_cover_every_ordered_split():
    splits = factorisations(4, 5)
    assert len(splits) == 15 and all(a * b * c * d * e == 4 for a, b, c, d, e in splits)
    assert "GPipe:2" not in pipeline_choices() and "ZBVZeroBubble:2" in pipeline_choices()


def _trials(db):
    (name,) = optuna.get_all_study_names(storage=f"sqlite:///{db}")
    return optuna.load_study(study_name=name, storage=f"sqlite:///{db}").get_trials()


def test_killed_trial_then_resume(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "tune.db"
    common = ["tune", "--model", "tiny", "--gpus", "2", "--steps", "2", "--storage", f"sqlite:///{db}",
              "--top", "2", "--out", "best.yaml", "--runs-dir", "runs"]
    # 1. A run cannot even start its workers in 2 s: the trial is killed, recorded, and the study survives.
    assert cli_main([*common, "--trials", "1", "--timeout", "2"]) == 1
    out = capsys.readouterr().out
    assert "timeout" in out and "nothing written" in out
    first = _trials(db)
    assert [t.state.name for t in first] == ["FAIL", "WAITING"]  # the planner's 2nd plan still queued
    assert first[0].user_attrs["status"] == "timeout"
    assert not (tmp_path / "best.yaml").exists()

    # 2. Same command, same storage: continues (runs the queued plan), does not rerun trial 0.
    assert cli_main([*common, "--trials", "2", "--timeout", "300"]) == 0
    out = capsys.readouterr().out
    trials = _trials(db)
    assert len(trials) == 3
    assert trials[0].state.name == "FAIL" and trials[0].datetime_complete == first[0].datetime_complete
    assert trials[1].state.name == "COMPLETE" and trials[1].user_attrs["planner_rank"] == 2
    assert trials[1].user_attrs["measured"]["tokens_per_s_per_gpu"] > 0
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["gpus"] == 2 and best["parallel"]["dp_shard"] * best["parallel"]["dp_replicate"] * \
        best["parallel"]["tp"] * best["parallel"]["pp"] * best["parallel"]["cp"] == 2
    assert "pred tok/s" in out and "best measured" in out


def test_bad_arguments_are_one_line_errors(capsys):
    assert cli_main(["tune", "--model", "tiny", "--gpus", "0"]) == 2
    assert cli_main(["tune", "--model", "tiny", "--gpus", "2", "--out", "x.txt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--gpus" in err[0] and "--out" in err[1]
