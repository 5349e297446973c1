"""docs/cli.md is what the parsers say today: a flag added or changed without regenerating it fails here."""

from pathlib import Path

from meshplan.cli import COMMANDS
from meshplan.cli_doc import cli_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    committed = (ROOT / "docs" / "cli.md").read_text()
    assert committed == cli_markdown(), "regenerate: python -m meshplan.cli_doc > docs/cli.md"
    assert all(f"## meshplan {name}" in committed for name in COMMANDS)
    assert "--wide" in committed and "--fix KEY=VALUE" in committed
