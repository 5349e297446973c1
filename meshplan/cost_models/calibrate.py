"""`meshplan calibrate RUN_DIR... [--profile P] [--out P2]`: fit a profile's efficiency terms to measured runs.

Each run directory holds summary.json (written by `meshplan run`): the plan and the measured step time
and peak memory. The cost model (estimate_plan, the one model of the project) predicts every run under
a candidate profile; scipy's bounded least squares moves the profile's fitted terms until the relative
errors are smallest. Time terms and memory terms are fitted separately: the memory model does not
depend on any time term and vice versa, so two small fits are better conditioned than one big one.

Besides the device and link efficiencies, the fit prices the host work eager PyTorch does per op, per op
through Python dispatch and per collective call (cost_models/host.py): on CPUs, and for small models
anywhere, that is most of a step, and without these terms the fit can only explain it with absurd
bandwidths and efficiencies.

Terms a set of runs cannot see (e.g. fsdp_overlap without any FSDP run) keep their profile value and
are reported as unconstrained, rather than drifting wherever the optimiser leaves them.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
from scipy.optimize import least_squares

from meshplan.cost_models.compute import compute_dtype
from meshplan.cost_models.estimate import Estimate, estimate_plan
from meshplan.errors import InputError
from meshplan.profiles.schema import ClusterProfile, profile_from_dict
from meshplan.specs.plan import DTYPES, Plan, plan_from_dict
from meshplan.yamlio import load_yaml_file

UNCONSTRAINED = 1e-9  # a term whose residual sensitivity is below this is not seen by the runs
MAX_EVALUATIONS = 150  # per least-squares fit, a safety cap (each evaluation predicts every run once)
HOST_TERMS = ("op_dispatch_s", "python_dispatch_s", "collective_sync_s")


@dataclass
class Run:
    """One measured run: the plan as it ran (dtype included) and what was measured."""

    path: str
    plan: Plan
    step_time_s: float
    peak_memory_gib: float | None


@dataclass
class Term:
    """One fitted profile term: how to read it, how to build a profile with another value, its bounds."""

    name: str
    kind: str  # time | memory
    get: Callable[[ClusterProfile], float]
    set: Callable[[ClusterProfile, float], ClusterProfile]
    lower: float
    upper: float
    # More starts for the fit, for a term the predictions depend on through a kink (a hidden fraction:
    # exposed = max(0, comm - hidden)): from one side the fit can slide into hiding everything and stall.
    restarts: tuple[float, ...] = ()
    # Fitted as 1/value: a throughput or bandwidth, which times are inversely proportional to. In 1/value the
    # predictions are linear, so the fit cannot run off to a huge bandwidth where nothing depends on it any more.
    inverse: bool = False

    def var(self, value: float) -> float:
        return 1.0 / value if self.inverse else value

    def var_bounds(self) -> tuple[float, float]:
        return (1.0 / self.upper, 1.0 / self.lower) if self.inverse else (self.lower, self.upper)


# -- reading runs --------------------------------------------------------------------------------


def load_run(run_dir: str) -> Run:
    summary_path = Path(run_dir) / "summary.json"
    data = load_yaml_file(summary_path, f"run {run_dir}")
    if not isinstance(data, dict) or not isinstance(data.get("measured"), dict) or "plan" not in data:
        raise InputError(f"run {run_dir}", "summary.json has no 'measured' and 'plan' (not written by meshplan run?)")
    plan = plan_from_dict(data["plan"])
    if plan.auto_fields():
        raise InputError(f"run {run_dir}", f"plan has 'auto' fields ({', '.join(plan.auto_fields())})")
    measured = data["measured"]
    step = measured.get("step_time_s")
    if not isinstance(step, (int, float)) or not math.isfinite(step) or step <= 0:
        raise InputError(f"run {run_dir}", f"measured.step_time_s must be a positive number, got {step!r}")
    mem = measured.get("peak_memory_gib")
    if mem is not None and (not isinstance(mem, (int, float)) or not math.isfinite(mem) or mem <= 0):
        raise InputError(f"run {run_dir}", f"measured.peak_memory_gib must be a positive number or null, got {mem!r}")
    # The dtype the run trained in; summaries without run.dtype come from runtimes that trained
    # CPU runs in fp32 whatever the plan said.
    run = data.get("run") or {}
    ran = run.get("dtype") or ("fp32" if run.get("device") == "cpu" else plan.training.dtype)
    if ran not in DTYPES:
        raise InputError(f"run {run_dir}", f"run.dtype must be one of {', '.join(DTYPES)}, got {ran!r}")
    if ran != plan.training.dtype:
        plan = plan.copy()
        plan.training = replace(plan.training, dtype=ran)
    return Run(str(run_dir), plan, float(step), None if mem is None else float(mem))


# -- profile variants ----------------------------------------------------------------------------


def with_matmul_fraction(prof: ClusterProfile, dtype: str, value: float) -> ClusterProfile:
    """max_fraction[dtype] = value; measured points of that dtype scale by the same ratio, since with
    points present the cost model reads them and not max_fraction."""
    mm = prof.device.matmul
    old = mm.max_fraction.get(dtype, mm.max_fraction.get("bf16", 0.7))
    ratio = value / old
    points = [dict(p, tflops=p["tflops"] * ratio) if p.get("dtype") == dtype else p for p in mm.points]
    matmul = replace(mm, max_fraction={**mm.max_fraction, dtype: value}, points=points)
    return replace(prof, device=replace(prof.device, matmul=matmul))


def with_bus_scale(prof: ClusterProfile, level: str, base: ClusterProfile, scale: float) -> ClusterProfile:
    """Every collective's bus bandwidth at `level` = `scale` x its value in `base`."""
    table = {c: base.collectives[level][c].scaled(scale) for c in prof.collectives[level]}
    return replace(prof, collectives={**prof.collectives, level: table})


def with_overhead(prof: ClusterProfile, name: str, value: float) -> ClusterProfile:
    return replace(prof, overheads=replace(prof.overheads, **{name: value}))


def bus_scale(prof: ClusterProfile, level: str, base: ClusterProfile) -> float:
    fit = next(iter(prof.collectives[level]))
    return prof.collectives[level][fit].bus_bandwidth_gbs / base.collectives[level][fit].bus_bandwidth_gbs


def fit_terms(base: ClusterProfile, runs: list[Run], max_step_s: float, max_mem_gib: float) -> list[Term]:
    """The terms to fit, with bounds; one matmul fraction per compute dtype the runs used."""
    terms = []
    for dtype in sorted({compute_dtype(r.plan.training.dtype, base.device) for r in runs}):
        terms.append(Term(f"device.matmul.max_fraction.{dtype}", "time",
                          lambda p, d=dtype: p.device.matmul.max_fraction.get(d, p.device.matmul.max_fraction.get("bf16", 0.7)),
                          lambda p, v, d=dtype: with_matmul_fraction(p, d, v), 1e-3, 1.0, inverse=True))
    terms.append(Term("device.memory_bound_efficiency", "time", lambda p: p.device.memory_bound_efficiency,
                      lambda p, v: replace(p, device=replace(p.device, memory_bound_efficiency=v)), 1e-3, 1.0,
                      inverse=True))
    for level in base.collectives:
        terms.append(Term(f"collectives.{level}.bus_bandwidth_scale", "time",
                          lambda p, l=level: bus_scale(p, l, base),
                          lambda p, v, l=level: with_bus_scale(p, l, base, v), 1e-3, 1e3, inverse=True))
    terms.append(replace(_overhead_term("fsdp_overlap", "time", 0.0, 1.0), restarts=(0.0,)))
    terms.append(_overhead_term("step_overhead_s", "time", 0.0, max_step_s))
    # Host work per op / per collective call (host.py): no single op or call can outlast the longest step.
    for name in HOST_TERMS:
        terms.append(_overhead_term(name, "time", 0.0, max_step_s))
    terms.append(_overhead_term("memory_fragmentation", "memory", 0.0, 3.0))
    terms.append(_overhead_term("context_gib", "memory", 0.0, max(max_mem_gib, 1e-6)))
    return terms


def _overhead_term(name: str, kind: str, lower: float, upper: float) -> Term:
    return Term(f"overheads.{name}", kind, lambda p: getattr(p.overheads, name),
                lambda p, v: with_overhead(p, name, v), lower, upper)


def apply(base: ClusterProfile, terms: list[Term], values) -> ClusterProfile:
    prof = base
    for term, v in zip(terms, values):
        prof = term.set(prof, float(v))
    # replace() builds new objects, but be sure no memo of the cost model survives from `base`.
    prof.__dict__.pop("_cost_cache", None)
    return prof


# -- errors and the fit --------------------------------------------------------------------------


def predict(runs: list[Run], prof: ClusterProfile) -> list[Estimate]:
    return [estimate_plan(r.plan, prof) for r in runs]


@dataclass
class Errors:
    """Relative errors (predicted / measured - 1) per run; memory None where it was not measured."""

    step: list[float]
    memory: list[float | None]

    @property
    def mean_abs_step(self) -> float:
        return statistics.fmean(abs(e) for e in self.step)

    @property
    def mean_abs_memory(self) -> float | None:
        mem = [abs(e) for e in self.memory if e is not None]
        return statistics.fmean(mem) if mem else None


def errors(runs: list[Run], ests: list[Estimate]) -> Errors:
    step = [e.step_time_s / r.step_time_s - 1 for r, e in zip(runs, ests)]
    # A run measures allocated tensors: compared with the estimate's peak less its overhead part.
    mem = [None if r.peak_memory_gib is None else e.allocated_peak_gib / r.peak_memory_gib - 1
           for r, e in zip(runs, ests)]
    return Errors(step, mem)


def residuals(kind: str, runs: list[Run], base: ClusterProfile, terms: list[Term], x) -> np.ndarray:
    err = errors(runs, predict(runs, apply(base, terms, x)))
    values = err.step if kind == "time" else [e for e in err.memory if e is not None]
    return np.array(values, dtype=float)


@dataclass
class FitResult:
    profile: ClusterProfile
    before: dict[str, float]
    after: dict[str, float]
    unconstrained: list[str] = field(default_factory=list)


def fit_kind(kind: str, runs: list[Run], base: ClusterProfile, terms: list[Term]) -> tuple[ClusterProfile, list[str]]:
    """Least squares over the terms of one kind; terms the runs do not see keep their value.

    Terms the profile has no value for (0, e.g. host costs on a freshly measured profile) are fitted first,
    alone: started from 0 with everything else free, the first steps move the measured terms to make up for
    them and can park one where it no longer matters (a bandwidth at its upper bound), and stall there."""
    terms = [t for t in terms if t.kind == kind]
    x0 = np.array([min(max(t.get(base), t.lower), t.upper) for t in terms])
    if residuals(kind, runs, base, terms, x0).size == 0:
        return base, [t.name for t in terms]
    unset = [i for i in range(len(terms)) if x0[i] == 0]
    x1 = _least_squares(kind, runs, base, terms, x0, unset)[0] if unset else x0
    every = list(range(len(terms)))
    x, cost = _least_squares(kind, runs, base, terms, x1, every)
    blind = [i for i in every if _blind(kind, runs, base, terms, x, i)]
    stalled = [i for i in blind if terms[i].restarts]
    if stalled:  # a kink term hides everything: see whether the runs are better explained from its other side
        starts = [_put(x1, [i], [v]) for i in stalled for v in terms[i].restarts]
        x, cost = min([(x, cost)] + [_least_squares(kind, runs, base, terms, s, every) for s in starts],
                      key=lambda f: f[1])
        blind = [i for i in every if _blind(kind, runs, base, terms, x, i)]
    # Kept as they were, not as clamped into the fit's bounds (a context larger than every run's memory).
    x[blind] = [terms[i].get(base) for i in blind]
    return apply(base, terms, x), [terms[i].name for i in blind]


def _least_squares(kind: str, runs: list[Run], base: ClusterProfile, terms: list[Term], start: np.ndarray,
                   idx: list[int]) -> tuple[np.ndarray, float]:
    """Fit terms `idx` from `start`, the others fixed; returns all values and the final cost."""
    free = [terms[i] for i in idx]
    values = lambda y: _put(start, idx, [t.var(v) for t, v in zip(free, y)])  # noqa: E731 (var is its own inverse)
    fun = lambda y: residuals(kind, runs, base, terms, values(y))  # noqa: E731
    lower, upper = zip(*(t.var_bounds() for t in free))
    # Central differences with a visible step: exposed communication is max(0, comm - hidden), a
    # kink that a 1e-8 forward difference can sit on and see as a flat direction.
    # dogbox, not trf: terms that settle on a bound (no overlap, no fixed cost) are pinned there, where trf
    # creeps towards the bound for hundreds of evaluations after the predictions have stopped changing.
    res = least_squares(fun, [t.var(start[i]) for t, i in zip(free, idx)], bounds=(lower, upper),
                        method="dogbox", jac="3-point", diff_step=1e-3, x_scale="jac", xtol=1e-10, ftol=1e-10,
                        max_nfev=MAX_EVALUATIONS)
    return values(res.x), float(res.cost)


def _blind(kind: str, runs: list[Run], base: ClusterProfile, terms: list[Term], x: np.ndarray, i: int) -> bool:
    """No run's prediction moves when term i does (least_squares' own Jacobian is zeroed at an active bound,
    so it cannot tell a term resting on its bound from one the runs do not see)."""
    scale = max(abs(x[i]), 1e-3)
    h = 1e-3 * scale if x[i] + 1e-3 * scale <= terms[i].upper else -1e-3 * scale
    r0 = residuals(kind, runs, base, terms, x)
    r1 = residuals(kind, runs, base, terms, _put(x, [i], [x[i] + h]))
    return float(np.abs(r1 - r0).max()) / abs(h) * scale < UNCONSTRAINED


def _put(x0: np.ndarray, idx: list[int], values) -> np.ndarray:
    x = x0.copy()
    x[idx] = values
    return x


def calibrate(runs: list[Run], base: ClusterProfile) -> FitResult:
    max_step = max(r.step_time_s for r in runs)
    max_mem = max((r.peak_memory_gib or 0.0) for r in runs)
    terms = fit_terms(base, runs, max_step, max_mem)
    prof, blind_t = fit_kind("time", runs, base, terms)
    prof, blind_m = fit_kind("memory", runs, prof, terms)
    before = {t.name: t.get(base) for t in terms}
    after = {t.name: t.get(prof) for t in terms}
    return FitResult(prof, before, after, blind_t + blind_m)


# -- output --------------------------------------------------------------------------------------


def _pct(e: float | None) -> str:
    return "n/a" if e is None else f"{e * 100:+.1f}%"


def error_table(runs: list[Run], before: Errors, after: Errors, ests_b: list[Estimate], ests_a: list[Estimate]) -> str:
    lines = [f"{'run':<28} {'measured s':>11} {'pred before':>11} {'err':>8} {'pred after':>11} {'err':>8}   "
             f"{'meas MiB':>9} {'err before':>10} {'err after':>9}"]
    for i, r in enumerate(runs):
        mem = "n/a" if r.peak_memory_gib is None else f"{r.peak_memory_gib * 1024:.2f}"
        lines.append(f"{Path(r.path).name[:28]:<28} {r.step_time_s:>11.4f} {ests_b[i].step_time_s:>11.4f} "
                     f"{_pct(before.step[i]):>8} {ests_a[i].step_time_s:>11.4f} {_pct(after.step[i]):>8}   "
                     f"{mem:>9} {_pct(before.memory[i]):>10} {_pct(after.memory[i]):>9}")
    mb, ma = before.mean_abs_memory, after.mean_abs_memory
    lines.append(f"mean |error|: step time {before.mean_abs_step * 100:.1f}% -> {after.mean_abs_step * 100:.1f}%, "
                 f"peak memory {'n/a' if mb is None else f'{mb * 100:.1f}%'} -> {'n/a' if ma is None else f'{ma * 100:.1f}%'}")
    return "\n".join(lines)


def provenance(fit: FitResult, runs: list[Run], before: Errors, after: Errors, base_name: str) -> dict[str, Any]:
    def summary(e: Errors) -> dict[str, Any]:
        return {"mean_abs_step_time": round(e.mean_abs_step, 5),
                "mean_abs_peak_memory": None if e.mean_abs_memory is None else round(e.mean_abs_memory, 5),
                "per_run_step_time": [round(x, 5) for x in e.step],
                "per_run_peak_memory": [None if x is None else round(x, 5) for x in e.memory]}

    return {
        "source": f"calibrated from {base_name} by meshplan calibrate (scipy least_squares on relative errors, bounded)",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": [str(Path(r.path).resolve()) for r in runs],
        "terms": {k: {"before": _round(fit.before[k]), "after": _round(fit.after[k])} for k in fit.before},
        "unconstrained_kept": fit.unconstrained,
        "errors_before": summary(before),
        "errors_after": summary(after),
        "note": "errors_after are in-sample: measured on the same runs the terms were fitted to",
    }


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def profile_document(prof: ClusterProfile, calib: dict[str, Any]) -> dict[str, Any]:
    data = prof.to_dict()
    data["provenance"] = {**data.get("provenance", {}), "calibration": calib}
    profile_from_dict(json.loads(json.dumps(data)), "calibrated profile")  # what we write must load back
    return data
