"""Write a report of plans, searches and runs as HTML, Markdown or CSV, by the output's extension."""

from __future__ import annotations

from pathlib import Path

from meshplan.errors import InputError
from meshplan.reports.csv_export import render_csv
from meshplan.reports.document import build_report, images
from meshplan.reports.files import atomic_write_dir
from meshplan.reports.html import render_html
from meshplan.reports.inputs import Config, load_search
from meshplan.reports.markdown import images_dir, render_markdown
from meshplan.yamlio import atomic_write_text

FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".csv": "csv"}
def output_format(path: Path) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InputError("output", f"unknown report type {path.suffix or path.name!r}; valid: {', '.join(FORMATS)}")
    return fmt


def write_report(configs: list[Config], path: str | Path, title: str = "meshplan report") -> Path:
    """Write the report in the format the extension names; returns the path written."""
    path = Path(path)
    fmt = output_format(path)
    if fmt == "csv":
        atomic_write_text(path, render_csv(configs))
        return path
    report = build_report(configs, title)
    if fmt == "html":
        atomic_write_text(path, render_html(report))
        return path
    folder = images_dir(path)
    atomic_write_dir(folder, {img.filename: img.png for img in images(report)})
    atomic_write_text(path, render_markdown(report, folder.name))
    return path


def write_report_for_search(plan_path: str | Path, candidates_csv: str | Path, report_path: str | Path) -> Path:
    """What `meshplan plan --report R` calls: the chosen plan, its schedule and the whole search."""
    config = load_search(Path(plan_path), Path(candidates_csv))
    return write_report([config], report_path, title=f"meshplan search: {config.plan.model.name} on {config.plan.gpus} GPUs")
