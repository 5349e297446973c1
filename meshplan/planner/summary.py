"""What `meshplan plan` shows and saves: the top-K table, the search summary, the candidates CSV,
and, when nothing fits, what would."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from meshplan.cost_models.band import band_of
from meshplan.cost_models.memory import GIB, STATE_BYTES
from meshplan.cost_models.mfu import mfu
from meshplan.numbers import significant
from meshplan.planner.results import Candidate, SearchResult
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.outputs import candidates_path, search_counts_path
from meshplan.specs.plan import Plan
from meshplan.specs.plan_label import legend, plan_label
from meshplan.yamlio import atomic_write_json, atomic_write_text


def candidate_row(c: Candidate, base: Plan, profile: ClusterProfile, rank: int | None) -> dict[str, Any]:
    """One CSV row: every plan field as section.field, then the figures."""
    plan = c.to_plan(base)
    d = plan.to_dict()
    row: dict[str, Any] = {"rank": rank, "gpus": plan.gpus, "model": plan.model.name, "cluster": plan.cluster}
    for section in ("training", "parallel", "memory"):
        for k, v in d[section].items():
            row[f"{section}.{k}"] = v if not isinstance(v, list) else ",".join(map(str, v))
    row["compile"] = plan.compile
    row["mesh_order"] = ",".join(c.order)
    row["layout"] = plan_label(plan)
    lay = c.layout
    tokens = lay.global_batch * lay.seq_len / c.step_time_s / lay.gpus
    row.update(step_time_s=c.step_time_s, tokens_per_s_per_gpu=tokens, mfu=mfu(lay.spec, lay.seq_len, tokens, profile),
               peak_memory_gib=c.peak_memory_gib, fits=c.peak_memory_gib <= profile.device.usable_memory_gib)
    if c.estimate is not None:
        row["hfu"] = c.estimate.hfu
        row.update({f"time_s.{k}": v for k, v in c.estimate.time_s.items()})
        row.update({f"memory_gib.{k}": v for k, v in c.estimate.memory_gib.items()})
    return row


def write_candidates(result: SearchResult, out: Path) -> Path:
    """Every exactly scored candidate beside the plan (<stem>.candidates.csv), best first."""
    rank_of = {id(c): i + 1 for i, c in enumerate(result.ranked)}
    rest = sorted((c for c in result.scored if id(c) not in rank_of), key=lambda c: c.step_time_s)
    rows = [candidate_row(c, result.base_plan, result.profile, rank_of.get(id(c))) for c in result.ranked + rest]
    # The csv module, not pandas: importing pandas would cost `meshplan plan` a good share of its time.
    columns = list(dict.fromkeys(k for row in rows for k in row))
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path = candidates_path(out)
    atomic_write_text(path, text.getvalue())
    return path


def write_search_counts(result: SearchResult, out: Path) -> Path:
    """The search's accounting beside the plan (<stem>.search.json), so a report counts as the summary does."""
    from meshplan.planner.constraints import NO_FIT

    counts = result.counts()
    counts["rejected_for_memory"] = result.rejections.get(NO_FIT, 0)
    path = search_counts_path(out)
    atomic_write_json(path, counts)
    return path


def _knobs(lay) -> str:
    sac = ""
    if lay.ac == "selective":
        sac = "(" + ",".join(lay.sac_ops) + ")" if isinstance(lay.sac_ops, tuple) else "(default)"
    pp = f" {lay.schedule} v{lay.v}" if lay.pp > 1 else ""
    flags = [f for f, on in (("SP", lay.sp), ("asyncTP", lay.async_tp), ("fp8", lay.float8),
                             ("compile", lay.compile), ("no-reshard", not lay.reshard_after_forward)) if on]
    return f"mb {lay.micro_batch}{pp}; AC {lay.ac}{sac}; {' '.join(flags)}"


# Plan fields the table shows in its own columns or in `knobs`; any other field is shown where it
# differs among the rows, so that no two rows look the same.
SHOWN_FIELDS = frozenset({
    "parallel.dp_replicate", "parallel.dp_shard", "parallel.cp", "parallel.tp", "parallel.pp",
    "parallel.pp_schedule", "parallel.pp_virtual_stages", "parallel.sequence_parallel", "parallel.async_tp", "parallel.ep",
    "training.micro_batch", "memory.activation_checkpointing", "memory.sac_ops", "memory.float8",
    "memory.reshard_after_forward", "compile",
})


# `placement` follows from the degrees and mesh_order: it never tells two rows apart on its own.
DERIVED_SECTIONS = ("placement",)


def _flat_fields(plan: Plan) -> dict[str, str]:
    """Every plan field as section.field -> its value as text; mesh_order lists only the dims of
    degree > 1 (the order of size-1 dims changes nothing)."""
    d = plan.to_dict()
    out = {}
    for key, value in d.items():
        if key in DERIVED_SECTIONS:
            continue
        if key == "mesh_order":
            value = [dim for dim in value if getattr(plan.parallel, dim, 1) > 1]
        items = value.items() if isinstance(value, dict) and key != "model" else [(None, value)]
        for name, v in items:
            text = ">".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
            out[key if name is None else f"{key}.{name}"] = text
    return out


def differing_fields(plans: list[Plan]) -> list[str]:
    """Fields outside SHOWN_FIELDS whose values are not the same in every one of `plans`."""
    flats = [_flat_fields(p) for p in plans]
    keys = dict.fromkeys(k for f in flats for k in f)
    return [k for k in keys if k not in SHOWN_FIELDS and len({f.get(k) for f in flats}) > 1]


def format_gib(value: float) -> str:
    """GiB to one decimal, or three significant digits below 10 GiB (tiny models on CPU)."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def compact_rows(result: SearchResult) -> tuple[list[str], list[str]]:
    """The top plans one line each (rank, tok/s/GPU, MFU, step s, its band, peak GiB, layout), and the
    notes under them: the band's meaning, what the starred rows extrapolate, the layout's legend."""
    plans = [c.to_plan(result.base_plan) for c in result.ranked]
    labels = [plan_label(p) for p in plans]
    header = f"{'#':>3} {'tok/s/GPU':>9} {'MFU':>6} {'step s':>7} {'band s':>11} {'GiB':>5}  layout"
    lines, reasons = [header], []
    for i, (c, plan, label) in enumerate(zip(result.ranked, plans, labels), 1):
        e = c.estimate
        band = band_of(plan, e)  # only for the plans shown
        star = "*" if band.extrapolated else " "
        if band.extrapolated and not reasons:
            reasons.append(f"#{i}: {band.extrapolation.split(',')[0]}")
        band_text = f"{significant(band.low_s)}-{significant(band.high_s)}{star}"
        lines.append(f"{i:>3} {e.tokens_per_s_per_gpu:>9,.0f} {e.mfu:>6.1%} {significant(e.step_time_s, 4):>7} "
                     f"{band_text:>11} {format_gib(e.peak_memory_gib):>5}  {label}")
    notes = ["band: step time within the out-of-sample errors of the nearest published runs (validate --cross)"]
    notes += [f"* extrapolated: beyond every published run of this device ({r}); `meshplan estimate` says how"
              for r in reasons]
    notes.append(legend(labels))
    return lines, notes


def print_summary(result: SearchResult, profile: ClusterProfile, out: Path, candidates: Path, report: Path | None,
                  wide: bool = False) -> None:
    from rich.console import Console

    console = Console(width=160 if wide else 120, highlight=False)
    base = result.base_plan
    for note in result.assumptions:
        console.print(f"[dim]assumed: {note}[/dim]")
    for w in result.warnings:
        console.print(f"[yellow]warning: {w}[/yellow]")
    title = (f"{base.model.name} on {base.gpus} x {profile.device.name} ({profile.name}), "
             f"seq {result.ranked[0].layout.seq_len}, global batch {result.ranked[0].layout.global_batch}")
    if wide:
        print_wide_table(console, result, title)
    else:
        lines, notes = compact_rows(result)
        console.print(title, soft_wrap=True)
        for line in lines:
            console.print(line, soft_wrap=True, markup=False)
        for note in notes:
            console.print(f"[dim]{note}[/dim]")
    n = result.counts()
    console.print(f"searched {n['space']:,} plans in {result.search_time_s:.2f} s: {n['scored_exactly']:,} scored "
                  f"({n['simulated']:,} pipeline simulations on durations rounded to 1%, {n['simulations_stopped']:,} "
                  f"stopped once a rank held more than fits, {n['resimulated_exactly']:,} leaves within 1% of the cut "
                  f"simulated again exactly), "
                  f"{n['dominated']:,} dominated, "
                  f"{n['pruned_by_bound']:,} pruned by a proven time bound, {n['rejected']:,} rejected")
    for reason, count in n["rejected_by_reason"].items():
        console.print(f"  rejected {count:>12,}  {reason}")
    if result.non_fitting:
        nf = result.non_fitting[0]
        kind = "" if nf.exact else " (bound)"
        console.print(f"fastest plan that does not fit: {nf.step_time_s:.3f} s/step{kind}, needs "
                      f"{nf.peak_memory_gib:.1f} GiB, {nf.peak_memory_gib - result.usable_memory_gib:+.1f} GiB over "
                      f"{result.usable_memory_gib:.1f} usable")
    if result.sac_ilp_check:
        console.print(f"selective AC choice checked with {result.sac_ilp_check}")
    console.print(f"wrote {out} and {candidates}" + (f" and {report}" if report else ""))


def print_wide_table(console, result: SearchResult, title: str) -> None:
    """Every field in its own column (`meshplan plan --wide`)."""
    from rich.table import Table

    base = result.base_plan
    table = Table(title=title)
    plans = [c.to_plan(base) for c in result.ranked]
    extra = differing_fields(plans)
    for col in ("#", "tok/s/GPU", "MFU (bf16 dense peak)", "step s", "step band s", "extrap.", "peak GiB", "dp_rep",
                "dp_shard", "cp", "tp", "pp", "knobs", *extra):
        table.add_column(col, justify="right" if col not in ("knobs", *extra) else "left")
    extrapolated: list[str] = []
    for i, (c, plan) in enumerate(zip(result.ranked, plans), 1):
        e, lay = c.estimate, c.layout
        band = band_of(plan, e)
        if band.extrapolated:
            extrapolated.append(f"#{i}: {band.extrapolation}")
        mfu = f"{e.mfu:.1%}" + (f" ({e.mfu_fp8:.1%} fp8)" if e.mfu_fp8 is not None else "")
        flat = _flat_fields(plan)
        table.add_row(str(i), f"{e.tokens_per_s_per_gpu:,.0f}", mfu, f"{e.step_time_s:.3f}",
                      f"{band.low_s:.2f}-{band.high_s:.2f}", "YES" if band.extrapolated else "no",
                      format_gib(e.peak_memory_gib), str(lay.dp_replicate), str(lay.dp_shard), str(lay.cp),
                      str(lay.tp), str(lay.pp), _knobs(lay), *(flat.get(k, "") for k in extra))
    console.print(table)
    console.print("step band: the out-of-sample errors of the nearest published runs (meshplan validate --cross)")
    for line in extrapolated:
        console.print(f"[yellow]extrapolated {line}[/yellow]")


def what_would_fit(result: SearchResult, plan: Plan, profile: ClusterProfile, jobs: int | None = None) -> list[str]:
    """Why nothing fit, and the nearest changes that would (checked with the same search, on `jobs`)."""
    from meshplan.planner.search import search

    from meshplan.planner.constraints import NO_FIT

    if not result.rejections.get(NO_FIT):
        reasons = [f"{count:,} plans: {reason}" for reason, count in result.rejections.items() if count]
        return ["no plan satisfies the constraints:"] + reasons
    usable = profile.device.usable_memory_gib
    lines = []
    states = (STATE_BYTES["params"] + STATE_BYTES["optimizer"]) * plan.model.num_params() / GIB
    if result.non_fitting:
        nf = min(result.non_fitting, key=lambda n: n.peak_memory_gib)
        lines.append(f"the smallest-memory plan evaluated needs {nf.peak_memory_gib:.1f} GiB per GPU, "
                     f"{nf.peak_memory_gib - usable:.1f} GiB more than the {usable:.1f} GiB usable")
    need = math.ceil(states / usable)
    lines.append(f"fp32 weights and AdamW moments alone take {states:,.0f} GiB: at least {need:,} GPUs even fully sharded")
    # More GPUs: the first power of two from the lower bound that really fits (a few doublings at most).
    gpus = max(plan.gpus * 2, 1 << max(0, (need - 1).bit_length()))
    for _ in range(4):
        got = _trial(search, plan, profile, jobs, gpus=gpus)
        if got is not None:
            lines.append(f"with gpus = {gpus:,}: fits at {got.peak_memory_gib:.1f} GiB, {got.tokens_per_s_per_gpu:,.0f} tokens/s/GPU")
            break
        gpus *= 2
    else:
        lines.append(f"with up to {gpus // 2:,} GPUs: still does not fit")
    for what, value in (("seq_len", plan.training.seq_len // 2), ("global_batch", _half_batch(plan))):
        if value and value >= 1:
            got = _trial(search, plan, profile, jobs, **{what: value})
            verdict = (f"fits at {got.peak_memory_gib:.1f} GiB, {got.tokens_per_s_per_gpu:,.0f} tokens/s/GPU"
                       if got is not None else "still does not fit")
            lines.append(f"with {what} = {value:,}: {verdict}")
    return lines


def _half_batch(plan: Plan) -> int | None:
    gb = plan.training.global_batch
    return gb // 2 if isinstance(gb, int) and gb > 1 else None


def _trial(search, plan: Plan, profile: ClusterProfile, jobs: int | None, gpus: int | None = None,
           seq_len: int | None = None, global_batch: int | None = None):
    trial = plan.copy()
    if gpus:
        trial.gpus = gpus
    if seq_len:
        trial.training.seq_len = seq_len
    if global_batch:
        trial.training.global_batch = global_batch
    got = search(trial, profile, top_k=1, jobs=jobs)
    return got.best.estimate if got.best is not None else None
