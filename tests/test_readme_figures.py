"""Every figure the README quotes is in the committed output it names: the accuracy and speed table
(figure, command, output file) and the first loop's paragraph. A figure changed in the README
without rerunning the command, or an output regenerated without updating the README, fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def table_rows(heading: str) -> list[list[str]]:
    section = README.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    return rows[1:]  # the header aside


def test_every_quoted_figure_is_in_its_committed_output():
    rows = table_rows("Accuracy and speed")
    assert len(rows) >= 6
    for what, figure, command, output, commit in rows:
        assert re.fullmatch(r"[0-9a-f]{7}", commit), (what, commit)  # the commit the output was made at
        path = ROOT / output.strip("`")
        assert path.is_file(), (what, output)
        number = re.sub(r"\s*s$", "", figure)  # "2.53 s": the output writes the unit its own way
        assert number in path.read_text(), (what, figure, output)


def test_first_loop_figures_are_the_committed_run():
    paragraph = README.split("## A first loop on a CPU", 1)[1].split("\n## ", 1)[0]
    output = (ROOT / "benchmarks" / "results" / "first_loop.txt").read_text()
    figures = re.findall(r"(\d+\.\d+) s", paragraph)
    assert len(figures) >= 3
    assert all(f in output for f in figures), (figures, output)
    assert "the run matched its plan" in output and "matched its plan" in paragraph


def test_first_loop_script_runs_the_readme_commands():
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_loop", ROOT / "benchmarks" / "first_loop.py")
    first_loop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(first_loop)
    block = README.split("## A first loop on a CPU", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    typed = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert typed == [c.format(steps=8) for c in first_loop.COMMANDS]
