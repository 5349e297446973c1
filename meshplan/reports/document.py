"""The report's content, independent of format: sections of text, tables and rendered figures."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from meshplan.reports import gantt, plots, tables
from meshplan.reports.inputs import Config


@dataclass
class Table:
    title: str
    frame: pd.DataFrame
    highlight: list[str] = field(default_factory=list)  # row labels to highlight (differing fields)
    note: str = ""


@dataclass
class Image:
    title: str
    filename: str  # PNG file name when written beside a Markdown report
    png: bytes
    caption: str = ""


@dataclass
class Section:
    title: str
    items: list[Table | Image | str] = field(default_factory=list)


@dataclass
class Report:
    title: str
    sections: list[Section]


def build_report(configs: list[Config], title: str = "meshplan report") -> Report:
    sections = [comparison_section(configs), time_section(configs), memory_section(configs)]
    sections += [s for s in (pipeline_section(configs), search_section(configs), runs_section(configs)) if s.items]
    notes = [f"{c.name}: {n}" for c in configs for n in c.notes]
    if notes:
        sections.append(Section("Notes", notes))
    return Report(title, sections)


def comparison_section(configs: list[Config]) -> Section:
    plan = tables.plan_table(configs)
    diff = tables.differing_rows(plan) if len(configs) > 1 else []
    note = "Highlighted rows differ between configurations." if diff else ""
    sources = ", ".join(f"{c.name} ({c.kind}: {c.source})" for c in configs)
    return Section("Configurations", [
        f"Inputs: {sources}",
        Table("Plan fields", plan, diff, note),
        Table("Predicted (cost model)", tables.metrics_table(configs)),
    ])


def time_section(configs: list[Config]) -> Section:
    estimated = [c for c in configs if c.estimate is not None]
    if not estimated:
        return Section("Step time", ["No configuration has an estimate."])
    png = plots.figure_png(plots.time_breakdown_figure(estimated))
    return Section("Step time", [
        Image("Step-time breakdown", "time_breakdown.png", png,
              "Stacked parts of the estimate's time_s on the critical pipeline rank; each bar sums to the step time."),
        Table("Step-time breakdown (s)", tables.time_table(estimated)),
    ] + ([Table("Mixture-of-experts terms", tables.moe_table(estimated),
                note="ep_comm above is the exposed dispatch + combine; the expert GEMMs are part of compute.")]
         if any(c.estimate.moe for c in estimated) else []))


def memory_section(configs: list[Config]) -> Section:
    estimated = [c for c in configs if c.estimate is not None]
    if not estimated:
        return Section("Memory", ["No configuration has an estimate."])
    png = plots.figure_png(plots.memory_figure(estimated))
    items: list[Table | Image | str] = [
        Image("Memory per pipeline rank", "memory.png", png,
              "Stacked memory parts per pipeline rank; dashed line: the device's usable memory.")]
    items += [Table(f"Memory per rank (GiB): {c.name}", tables.rank_memory_table(c)) for c in estimated]
    return Section("Memory", items)


def pipeline_section(configs: list[Config]) -> Section:
    items: list[Table | Image | str] = []
    for i, c in enumerate(configs):
        if c.schedule is not None:
            png = plots.figure_png(gantt.gantt_figure(c.schedule, c.name))
            items.append(Image(f"Pipeline schedule: {c.name}", f"gantt_{i}.png", png,
                               "F / B / W blocks per pipeline rank from the schedule model the estimate used; numbers are micro-batches."))
    return Section("Pipeline schedules", items)


def search_section(configs: list[Config]) -> Section:
    items: list[Table | Image | str] = []
    for i, c in enumerate(configs):
        if c.candidates is not None:
            png = plots.figure_png(plots.search_figure(c))
            front = plots.pareto_frontier(c.candidates)
            items.append(Image(f"Planner search: {c.name}", f"search_{i}.png", png,
                               f"{len(c.candidates)} candidates, {int(c.candidates['fits'].sum())} fit; "
                               f"{len(front)} on the feasible Pareto frontier; star: the chosen plan."))
    return Section("Planner search", items)


def runs_section(configs: list[Config]) -> Section:
    items: list[Table | Image | str] = []
    for i, c in enumerate(configs):
        if c.run is not None:
            items.append(Table(f"Measured vs predicted: {c.name}", tables.run_table(c)))
            items.append(Image(f"Run: {c.name}", f"run_{i}.png", plots.figure_png(plots.run_figure(c)),
                               "Loss and tokens/s per GPU over steps; dashed: predicted throughput."))
    return Section("Runs", items)


def images(report: Report) -> list[Image]:
    return [item for s in report.sections for item in s.items if isinstance(item, Image)]
