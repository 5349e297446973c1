"""Where `meshplan plan` writes the files beside a plan, read back by reports: one definition."""

from __future__ import annotations

from pathlib import Path


def candidates_path(plan_path: Path) -> Path:
    """Every exactly scored candidate of the search that chose `plan_path` (CSV)."""
    return plan_path.with_name(f"{plan_path.stem}.candidates.csv")


def search_counts_path(plan_path: Path) -> Path:
    """The search's accounting (space, scored, rejected by reason) for `plan_path` (JSON)."""
    return plan_path.with_name(f"{plan_path.stem}.search.json")
