"""Where `meshplan plan` writes the files beside a plan, read back by reports: one definition."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def candidates_path(plan_path: Path) -> Path:
    """Every exactly scored candidate of the search that chose `plan_path` (CSV)."""
    return plan_path.with_name(f"{plan_path.stem}.candidates.csv")


def search_counts_path(plan_path: Path) -> Path:
    """The search's accounting (space, scored, rejected by reason) for `plan_path` (JSON)."""
    return plan_path.with_name(f"{plan_path.stem}.search.json")


def _cell(text: str) -> Any:
    """A candidates-CSV cell as the plan file has it."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


def plan_mapping_of_candidate(row: dict[str, str]) -> dict[str, Any]:
    """The plan mapping a candidates-CSV row describes (its plan columns; the figures left out):
    the inverse of planner.summary.candidate_row."""
    out: dict[str, Any] = {"version": 1, "model": row["model"], "cluster": row["cluster"], "gpus": int(row["gpus"]),
                           "compile": _cell(row["compile"]), "mesh_order": row["mesh_order"].split(","),
                           "training": {}, "parallel": {}, "memory": {}}
    for key, text in row.items():
        section, _, name = key.partition(".")
        if section in ("training", "parallel", "memory"):
            value = _cell(text)
            if name in ("sac_ops", "pp_layers") and value is not None:
                value = [_cell(v) for v in str(value).split(",")]
            out[section][name] = value
    return out
