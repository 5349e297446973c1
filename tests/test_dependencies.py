"""Everything meshplan imports is installed by `pip install -e ".[runtime]"`: the core dependencies
plus the runtime extra (a command must not fail on a fresh install for a package only the test
extra brings, as `calibrate` did for scipy). Checked by reading every import in meshplan/."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Import name -> distribution name, where they differ.
DISTRIBUTION = {"yaml": "pyyaml"}


def imported_modules() -> set[str]:
    out = set()
    for path in (ROOT / "meshplan").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
    return out


def requirement_names(specs: list[str]) -> set[str]:
    return {re.split(r"[<>=!\[; ]", s, maxsplit=1)[0].lower() for s in specs}


def test_every_third_party_import_is_a_core_or_runtime_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = requirement_names(project["dependencies"]) | requirement_names(project["optional-dependencies"]["runtime"])
    third_party = {m for m in imported_modules() if m not in sys.stdlib_module_names and m != "meshplan"}
    missing = {m for m in third_party if DISTRIBUTION.get(m, m).lower() not in installed}
    assert not missing, f"imported but not installed by .[runtime]: {sorted(missing)}"
    assert "scipy" in third_party  # the check sees the imports it is about
