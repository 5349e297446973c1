"""Tables (pandas) of the configurations: plan fields side by side, predictions, memory per rank, runs."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from meshplan.cost_models.band import band_of
from meshplan.numbers import significant
from meshplan.reports.inputs import RUN_METRICS, Config
from meshplan.specs.plan_label import plan_label

PLAN_SECTIONS = ("training", "parallel", "memory")
SUMMARY_METRICS = {
    "step_time_s": "step time (s)",
    "tokens_per_s_per_gpu": "tokens/s per GPU",
    "mfu": "MFU",
    "hfu": "HFU",
    "peak_memory_gib": "peak memory (GiB)",
    "usable_memory_gib": "usable memory (GiB)",
    "fits": "fits",
}


def scalar(value: Any) -> Any:
    """A CSV/table cell: lists and mappings become JSON text, everything else stays as is."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    return value


def flatten_plan(config: Config) -> dict[str, Any]:
    """Plan fields named as in the planner's candidates CSV (`section.field`)."""
    plan = config.plan
    out: dict[str, Any] = {"model": plan.model.name, "cluster": plan.cluster, "gpus": plan.gpus}
    if plan.is_complete():
        out["layout"] = plan_label(plan)  # as the planner's table and candidates CSV write it
    for section in PLAN_SECTIONS:
        for key, value in asdict(getattr(plan, section)).items():
            out[f"{section}.{key}"] = scalar(value)
    out["compile"] = plan.compile
    out["stack"] = plan.stack  # the same layout prices differently per stack
    return out


def flatten_estimate(config: Config) -> dict[str, Any]:
    """Every predicted number: summary metrics, time_s.*, memory_gib.*, pipeline.*, per-rank memory."""
    est = config.estimate
    if est is None:
        return {}
    out: dict[str, Any] = {k: getattr(est, k) for k in SUMMARY_METRICS}
    out["model_flops_per_token"] = est.model_flops_per_token
    out.update({f"time_s.{k}": v for k, v in est.time_s.items()})
    out.update({f"memory_gib.{k}": v for k, v in est.memory_gib.items()})
    out.update({f"pipeline.{k}": scalar(v) for k, v in est.pipeline.items()})
    for rank in est.per_rank_memory_gib:
        r = int(rank["pp_rank"])
        out.update({f"rank{r}.memory_gib.{k}": v for k, v in rank.items() if k != "pp_rank"})
    out.update({f"placement.{k}": v for k, v in est.placement.items()})
    return out


def flatten_run(config: Config) -> dict[str, Any]:
    run = config.run
    if run is None:
        return {}
    out: dict[str, Any] = {}
    for key in RUN_METRICS:
        out[f"measured.{key}"] = run.measured.get(key)
        out[f"predicted.{key}"] = run.predicted.get(key)
    out.update({f"ratio.{k}": v for k, v in run.ratios().items()})
    return out


def flatten_config(config: Config) -> dict[str, Any]:
    """One configuration as one flat row: identity, plan, prediction and (for runs) measurements."""
    row: dict[str, Any] = {"name": config.name, "kind": config.kind, "source": str(config.source)}
    row.update(flatten_plan(config))
    row.update(flatten_estimate(config))
    row.update(flatten_run(config))
    return row


def plan_table(configs: list[Config]) -> pd.DataFrame:
    """Plan fields (rows) by configuration (columns), without the optional fields no configuration sets
    (a stack's own field such as memory.recompute_modules, pp_layers on an even split): a row of blanks
    says nothing. The CSV export keeps every field."""
    table = pd.DataFrame({c.name: flatten_plan(c) for c in configs})
    return table[table.notna().any(axis=1)]


def differing_rows(table: pd.DataFrame) -> list[str]:
    """Rows whose values are not all equal across the columns."""
    return [idx for idx, row in table.iterrows() if len({str(v) for v in row.values}) > 1]


def metrics_table(configs: list[Config]) -> pd.DataFrame:
    """Predicted summary metrics (rows) by configuration (columns)."""
    cols = {}
    for c in configs:
        est = c.estimate
        col = {label: (getattr(est, key) if est else None) for key, label in SUMMARY_METRICS.items()}
        col["pipeline bubble fraction"] = est.pipeline.get("bubble_fraction") if est else None
        band = band_of(c.plan, est) if est else None
        # The out-of-sample errors of the nearest published runs (meshplan validate --cross).
        col["step time band (s)"] = f"{band.low_s:.4g} to {band.high_s:.4g}" if band else None
        col["extrapolated"] = (band.extrapolation if band.extrapolated else "no") if band else None
        # Every rank's parts are drawn in the memory figure; the table names the rank that peaks.
        top = max(est.per_rank_memory_gib, key=lambda r: r["total"]) if est and est.per_rank_memory_gib else None
        col["pp rank with the peak (see the memory figure)"] = int(top["pp_rank"]) if top else None
        cols[c.name] = col
    return pd.DataFrame(cols)


def time_table(configs: list[Config]) -> pd.DataFrame:
    """Step-time breakdown (rows: time_s keys plus the total) by configuration."""
    cols = {}
    for c in configs:
        if c.estimate is not None:
            cols[c.name] = {**c.estimate.time_s, "step time": c.estimate.step_time_s}
    return pd.DataFrame(cols)


MOE_ROWS = {"ep": "expert-parallel degree", "local_experts": "routed experts per rank",
            "tokens_per_local_expert": "tokens per local expert (micro-batch)", "imbalance": "busiest rank / mean load",
            "moe_layers": "MoE layers on the critical rank", "expert_compute_s": "expert GEMMs (s, fwd + bwd)",
            "ep_comm_issued_s": "dispatch + combine issued (s)", "ep_comm_exposed_s": "dispatch + combine exposed (s)",
            "routed_state_gib": "routed experts' states (GiB)",
            "routed_state_bytes_per_param": "their states per parameter (bytes)"}


def moe_table(configs: list[Config]) -> pd.DataFrame:
    """The expert terms (Estimate.moe) of the MoE configurations, by configuration."""
    cols = {c.name: {MOE_ROWS[k]: v for k, v in c.estimate.moe.items()} for c in configs
            if c.estimate is not None and c.estimate.moe}
    return pd.DataFrame(cols)


def rank_memory_table(config: Config) -> pd.DataFrame:
    """Memory parts (columns, GiB) per pipeline rank (rows), with the total."""
    ranks = config.estimate.per_rank_memory_gib if config.estimate else []
    frame = pd.DataFrame([{k: v for k, v in r.items() if k != "pp_rank"} for r in ranks],
                         index=[f"pp rank {int(r['pp_rank'])}" for r in ranks])
    if "total" in frame.columns:
        frame = frame[[c for c in frame.columns if c != "total"] + ["total"]]
    return frame


def run_table(config: Config) -> pd.DataFrame:
    """Measured, predicted and measured/predicted for a run."""
    run = config.run
    ratios = run.ratios()
    return pd.DataFrame({
        "measured": {k: run.measured.get(k) for k in RUN_METRICS},
        "predicted": {k: run.predicted.get(k) for k in RUN_METRICS},
        "measured / predicted": ratios,
    })


def format_cell(value: Any, row: Any = "", column: Any = "", title: str = "") -> str:
    """Short human text for a table cell, by what its row, column and table say it is: MFU as a
    percentage, tokens/s whole with separators, GiB and seconds to 3-4 significant digits, the
    measured/predicted ratio as 0.95x; never scientific notation (the CSV keeps the raw values)."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if not isinstance(value, (float, np.floating)):
        return str(value)
    value = float(value)
    name, col = str(row).lower(), str(column).lower()
    if "/ predicted" in col:
        return f"{value:.2f}x"
    if any(k in name for k in ("mfu", "hfu", "fraction")):
        return f"{value:.1%}"
    if "tokens" in name or "flops" in name:
        return f"{value:,.0f}"
    if "gib" in name or "gib" in title.lower():
        return significant(value, 3)
    return significant(value, 4)
