"""One self-contained HTML file: inline CSS, figures as base64 PNG data URIs, no external resources."""

from __future__ import annotations

import base64
from html import escape

from meshplan.reports.document import Image, Report, Section, Table
from meshplan.reports.tables import format_cell

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
table { border-collapse: collapse; margin: 0.6em 0 1.4em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f0f0f0; }
tr.diff td, tr.diff th { background: #fff3c4; font-weight: 600; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption, .note { color: #555; font-size: 0.9em; }
"""


def render_html(report: Report) -> str:
    body = "\n".join(render_section(s) for s in report.sections)
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{escape(report.title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{escape(report.title)}</h1>\n{body}\n</body>\n</html>\n")


def render_section(section: Section) -> str:
    parts = [f"<h2>{escape(section.title)}</h2>"]
    for item in section.items:
        if isinstance(item, Table):
            parts.append(render_table(item))
        elif isinstance(item, Image):
            parts.append(render_image(item))
        else:
            parts.append(f"<p>{escape(item)}</p>")
    return "<section>\n" + "\n".join(parts) + "\n</section>"


def render_table(table: Table) -> str:
    frame = table.frame
    head = "".join(f"<th>{escape(str(c))}</th>" for c in ["", *frame.columns])
    rows = []
    for label, row in frame.iterrows():
        cls = ' class="diff"' if label in table.highlight else ""
        cells = "".join(f"<td>{escape(format_cell(v, label, col, table.title))}</td>"
                        for col, v in zip(frame.columns, row.values))
        rows.append(f"<tr{cls}><th>{escape(str(label))}</th>{cells}</tr>")
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    return (f"<h3>{escape(table.title)}</h3>\n<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n"
            + "\n".join(rows) + f"\n</tbody>\n</table>{note}")


def render_image(image: Image) -> str:
    data = base64.b64encode(image.png).decode("ascii")
    return (f"<figure>\n<img alt=\"{escape(image.title)}\" src=\"data:image/png;base64,{data}\">\n"
            f"<figcaption>{escape(image.title)}. {escape(image.caption)}</figcaption>\n</figure>")
