"""Markdown report; its figures are PNG files in a `<stem>_files/` folder beside it."""

from __future__ import annotations

from pathlib import Path

from meshplan.reports.document import Image, Report, Section, Table
from meshplan.reports.tables import format_cell


def images_dir(report_path: Path) -> Path:
    return report_path.with_name(f"{report_path.stem}_files")


def render_markdown(report: Report, folder: str) -> str:
    """Markdown text; images are linked as `folder/<filename>` (relative to the report)."""
    parts = [f"# {report.title}", ""]
    for section in report.sections:
        parts += render_section(section, folder)
    return "\n".join(parts).rstrip() + "\n"


def render_section(section: Section, folder: str) -> list[str]:
    out = [f"## {section.title}", ""]
    for item in section.items:
        if isinstance(item, Table):
            out += render_table(item)
        elif isinstance(item, Image):
            out += [f"![{item.title}]({folder}/{item.filename})", "", f"*{item.title}.* {item.caption}", ""]
        else:
            out += [item, ""]
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(table: Table) -> list[str]:
    frame = table.frame
    out = [f"### {table.title}", ""]
    out.append("| " + " | ".join(_cell(str(c)) for c in ["", *frame.columns]) + " |")
    out.append("|" + "---|" + "---:|" * len(frame.columns))
    for label, row in frame.iterrows():
        cells = [_cell(format_cell(v, label, col, table.title)) for col, v in zip(frame.columns, row.values)]
        name = _cell(str(label))
        if label in table.highlight:
            name, cells = f"**{name}** ≠", [f"**{c}**" for c in cells]
        out.append("| " + " | ".join([name, *cells]) + " |")
    out.append("")
    if table.note:
        out += [f"*{table.note.replace('Highlighted', 'Bold (≠)')}*", ""]
    return out
