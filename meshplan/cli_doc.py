"""docs/cli.md, generated from the commands' own argument parsers (tests/test_cli_doc.py fails when
the committed file is not what this writes):  python -m meshplan.cli_doc > docs/cli.md"""

from __future__ import annotations

import importlib
import os

from meshplan.cli import COMMANDS

WIDTH = "100"  # argparse wraps help to $COLUMNS: fixed, so the text does not depend on the terminal


def cli_markdown() -> str:
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parts = ["# Command-line reference", "",
                 "Generated from the argument parsers by `python -m meshplan.cli_doc > docs/cli.md`; "
                 "`meshplan COMMAND --help` prints the same.", ""]
        parts += [f"- [`meshplan {name}`](#meshplan-{name}): {summary}" for name, (_, summary) in COMMANDS.items()]
        for name, (module, summary) in COMMANDS.items():
            help_text = importlib.import_module(module).parser().format_help().rstrip()
            parts += ["", f"## meshplan {name}", "", summary[0].upper() + summary[1:] + ".", "", "```text", help_text, "```"]
        return "\n".join(parts) + "\n"
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


if __name__ == "__main__":
    print(cli_markdown(), end="")
