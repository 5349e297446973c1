"""Reports: compare plans, planner searches and runs as HTML, Markdown or CSV, with figures."""

from meshplan.reports.writer import write_report, write_report_for_search

__all__ = ["write_report", "write_report_for_search"]
