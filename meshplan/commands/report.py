"""`meshplan report INPUT... -o report.html|report.md|report.csv`: compare plans, searches and runs."""

from __future__ import annotations

from pathlib import Path

from meshplan.commands.argparsing import ArgumentParser
from meshplan.reports.inputs import load_inputs
from meshplan.reports.writer import output_format, write_report

DESCRIPTION = """Compare plans, planner searches and runs side by side.
Each INPUT is a plan file (estimated with the cost model), a planner output (a plan file with a
sibling <stem>.candidates.csv), or a run directory (metrics.jsonl + summary.json)."""


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="meshplan report", description=DESCRIPTION)
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="plan file, planner output or run directory")
    ap.add_argument("-o", "--output", required=True, help="report path: .html (self-contained), .md (+ <stem>_files/) or .csv")
    ap.add_argument("--title", default="meshplan report", help="report title")
    return ap


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    out = Path(args.output)
    output_format(out)
    configs = load_inputs(args.inputs)
    write_report(configs, out, args.title)
    print(f"wrote {out} ({len(configs)} configuration{'s' if len(configs) != 1 else ''})")
    return 0
