"""The layering holds: `lint-imports` (import-linter) checks the contracts in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    return subprocess.run([exe, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(cwd)})


def test_layers_and_no_torch_in_the_cost_model():
    got = _lint(ROOT)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "2 kept, 0 broken" in got.stdout


@pytest.mark.parametrize("module, planted", [
    ("cost_models/flops.py", "import meshplan.planner.search  # planted: upward\n"),
    ("planner/space.py", "import torch  # planted: torch in the planner\n"),
])
def test_a_planted_backward_import_breaks_a_contract(tmp_path, module, planted):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "meshplan", copy / "meshplan", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    target = copy / "meshplan" / module
    target.write_text(planted + target.read_text())
    got = _lint(copy)
    assert got.returncode != 0 and "BROKEN" in got.stdout, got.stdout + got.stderr
