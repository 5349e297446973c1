"""Bad input to profile-cluster fails fast: one line on stderr, exit code 2, nothing launched."""

import os

import pytest

from meshplan.cli import main


@pytest.fixture(autouse=True)
def not_under_torchrun(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize("args,field", [
    (["--nproc", "0"], "--nproc"),
    (["--nproc", "two"], "--nproc"),
    (["--nproc", str((os.cpu_count() or 1) + 1)], "--nproc"),
    (["--time-budget", "-5"], "--time-budget"),
    (["--time-budget", "10"], "--time-budget"),
    (["--time-budget", "soon"], "--time-budget"),
    (["--max-nodes", "0"], "--max-nodes"),
    (["--name", "bad name/x"], "--name"),
    (["--node-link", "network"], "--node-link"),
])
def test_bad_options(args, field, capsys, tmp_path):
    assert main(["profile-cluster", "--out", str(tmp_path / "p.yaml"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("make_out", [
    lambda tmp: str(tmp),  # a directory
    lambda tmp: str(tmp / "p.txt"),  # not YAML
    lambda tmp: "/proc/meshplan-cannot-write/p.yaml",  # unwritable
])
def test_bad_out(make_out, capsys, tmp_path):
    assert main(["profile-cluster", "--nproc", "2", "--out", make_out(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--out" in err


def test_nproc_under_torchrun_is_refused(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["profile-cluster", "--nproc", "2", "--out", str(tmp_path / "p.yaml")]) == 2
    assert "--nproc" in capsys.readouterr().err
