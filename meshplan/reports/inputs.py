"""Report inputs: plan files, planner outputs (plan + candidates CSV) and run directories."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from meshplan.cost_models.estimate import Estimate, estimate_plan
from meshplan.cost_models.pipeline import ScheduleResult
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.profiles.schema import ClusterProfile
from meshplan.reports.schedule import check_schedule, pipeline_schedule
from meshplan.specs.outputs import candidates_path, search_counts_path
from meshplan.specs.plan import Plan, load_plan, plan_from_dict

PLAN_SUFFIXES = (".yaml", ".yml", ".json")
RUN_FILES = ("metrics.jsonl", "summary.json")
RUN_METRICS = ("step_time_s", "tokens_per_s_per_gpu", "peak_memory_gib")


@dataclass
class RunData:
    """A run directory: per-step metrics and the summary's measured and predicted numbers."""

    metrics: pd.DataFrame
    measured: dict[str, Any]
    predicted: dict[str, Any]
    ratio: dict[str, Any] = field(default_factory=dict)  # summary.json's ratio_measured_over_predicted

    def ratios(self) -> dict[str, float | None]:
        """measured / predicted per metric as the run computed them (None where either is missing)."""
        return {key: self.ratio.get(key) for key in RUN_METRICS}


@dataclass
class Config:
    """One configuration in the report, with everything its tables and pictures need."""

    name: str
    kind: str  # plan | search | run
    source: Path
    plan: Plan
    estimate: Estimate | None
    schedule: ScheduleResult | None = None
    profile: ClusterProfile | None = None
    candidates: pd.DataFrame | None = None
    search_counts: dict[str, Any] | None = None  # the planner's <stem>.search.json, when it wrote one
    run: RunData | None = None
    notes: list[str] = field(default_factory=list)


def load_inputs(paths: list[str | Path]) -> list[Config]:
    """Load every input; names are file stems, made unique with the parent folder when needed."""
    if not paths:
        raise InputError("inputs", "give at least one plan file, planner output or run directory")
    configs = [load_input(Path(p)) for p in paths]
    _unique_names(configs)
    return configs


def load_input(path: Path) -> Config:
    if path.is_dir():
        return load_run(path)
    if not path.exists():
        raise InputError(str(path), "file or directory not found")
    if path.suffix.lower() not in PLAN_SUFFIXES:
        raise InputError(str(path), f"unknown input type; give a plan file ({', '.join(PLAN_SUFFIXES)}) or a run directory")
    sibling = candidates_path(path)
    if sibling.is_file():
        return load_search(path, sibling)
    return load_plan_input(path)


def load_plan_input(path: Path) -> Config:
    plan = load_plan(path)
    profile, est, schedule = estimate_complete(plan, str(path))
    return Config(path.stem, "plan", path, plan, est, schedule, profile)


def load_search(plan_path: Path, candidates_csv: Path) -> Config:
    config = load_plan_input(Path(plan_path))
    config.kind = "search"
    config.candidates = read_candidates(Path(candidates_csv))
    counts = search_counts_path(Path(plan_path))
    if counts.is_file():
        config.search_counts = _read_json(counts)
    return config


def read_candidates(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise InputError(str(path), "candidates file not found")
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"not a readable CSV ({exc.__class__.__name__})")
    missing = [c for c in ("tokens_per_s_per_gpu", "peak_memory_gib", "fits") if c not in frame.columns]
    if missing:
        raise InputError(str(path), f"candidates CSV lacks columns: {', '.join(missing)}")
    frame["fits"] = frame["fits"].map(_as_bool)
    return frame


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def estimate_complete(plan: Plan, where: str) -> tuple[ClusterProfile, Estimate, ScheduleResult | None]:
    """Profile, estimate and pipeline schedule of a complete plan (the schedule checked against the estimate)."""
    if not plan.is_complete():
        raise InputError(where, f"plan has 'auto' fields ({', '.join(plan.auto_fields())}); "
                                "fill them with `meshplan estimate` or `meshplan plan` first")
    profile = load_profile(plan.cluster)
    est = estimate_plan(plan, profile)
    schedule = pipeline_schedule(plan, profile)
    if schedule is not None:
        check_schedule(schedule, est)
    return profile, est, schedule


def load_run(path: Path) -> Config:
    for name in RUN_FILES:
        if not (path / name).is_file():
            raise InputError(str(path), f"not a run directory: {name} is missing")
    metrics = _read_metrics(path / "metrics.jsonl")
    summary = _read_json(path / "summary.json")
    if not isinstance(summary.get("plan"), dict):
        raise InputError(str(path / "summary.json"), "has no 'plan' object")
    plan = plan_from_dict(summary["plan"])
    run = RunData(metrics, dict(summary.get("measured") or {}), dict(summary.get("predicted") or {}),
                  dict(summary.get("ratio_measured_over_predicted") or {}))
    config = Config(path.name, "run", path, plan, None, run=run)
    try:
        config.profile, config.estimate, config.schedule = estimate_complete(plan, str(path))
    except InputError as exc:
        config.notes.append(f"no current estimate: {exc}")
    return config


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(str(path), f"not readable JSON ({exc.__class__.__name__})")
    if not isinstance(data, dict):
        raise InputError(str(path), "must hold a JSON object")
    return data


def _read_metrics(path: Path) -> pd.DataFrame:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"not readable ({exc.__class__.__name__})")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise InputError(str(path), f"line {i} is not JSON")
        if not isinstance(row, dict) or "step" not in row:
            raise InputError(str(path), f"line {i} is not a step record (needs 'step')")
        if isinstance(row["step"], bool) or not isinstance(row["step"], int):
            raise InputError(str(path), f"line {i}: step must be an integer, got {row['step']!r}")
        for key in ("loss", "step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_memory_gib"):
            value = row.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError(str(path), f"line {i}: {key} must be a number or null, got {value!r}")
        rows.append(row)
    if not rows:
        raise InputError(str(path), "has no steps")
    return pd.DataFrame(rows).sort_values("step").reset_index(drop=True)


def _unique_names(configs: list[Config]) -> None:
    seen: dict[str, int] = {}
    for c in configs:
        seen[c.name] = seen.get(c.name, 0) + 1
    for c in configs:
        if seen[c.name] > 1:
            c.name = f"{c.source.parent.name}/{c.name}"
    counts: dict[str, int] = {}
    for c in configs:
        counts[c.name] = counts.get(c.name, 0) + 1
        if counts[c.name] > 1:
            c.name = f"{c.name} ({counts[c.name]})"
