"""How much the published training runs trust the model: constants at their physical defaults
(`validate --constants`) and the fitted constants refit with each published table left out (`validate --cross`).

Errors are step-time errors, predicted / measured - 1 (negative = the model is optimistic), whatever
figure a table printed: a throughput row's step-time error is published / predicted - 1.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

from meshplan.cost_models import constants
from meshplan.cost_models.comm import runs_nccl
from meshplan.cost_models.constants import (EVERY_GPU, IBM_FMS, LLMFOUNDRY, MOE_SOURCES, MOE_TABLE_SEPARATOR,
                                            OLMO_CORE, PROFILE_CONSTANTS, RUNTIME_RUNS, ProfileConstant, fitted_profiles)
from meshplan.cost_models.published import MEMORY_ONLY, PublishedRow, all_training_rows
from meshplan.profiles.registry import load_profile
from meshplan.profiles.schema import ClusterProfile

Transform = Callable[[str, ClusterProfile], ClusterProfile]  # (profile name, profile) -> profile to predict with
GOLDEN_ITERATIONS = 14  # interval shrinks to 0.618^14 ~ 0.1 % of the bounds
MAX_SWEEPS = 12
CONVERGED = 1e-3  # a sweep that moves no constant by more than this share of its bounds ends the descent


def training_rows() -> list[PublishedRow]:
    return [r for r in all_training_rows() if not r.skipped]


def step_time_rows() -> list[PublishedRow]:
    """The training rows with a step time to judge (every one but the memory-only rows)."""
    return [r for r in training_rows() if r.metric != MEMORY_ONLY]


def loader(transform: Transform | None = None) -> Callable[[str], ClusterProfile]:
    """load_profile with `transform` applied, on fresh profile objects (no cost-model memo carried over)."""
    cache: dict[str, ClusterProfile] = {}

    def load(name: str) -> ClusterProfile:
        if name not in cache:
            prof = replace(load_profile(name))
            cache[name] = transform(name, prof) if transform else prof
        return cache[name]
    return load


@dataclass
class RowError:
    source: str
    label: str
    step: float | None  # predicted / measured step time - 1; None for a memory-only row
    memory: float | None = None


def row_errors(rows: list[PublishedRow], transform: Transform | None = None) -> list[RowError]:
    from meshplan.cost_models.validate import predict  # validate imports this module's users

    load = loader(transform)
    out = []
    for row in rows:
        value, est, _ = predict(row, load)
        if row.metric == MEMORY_ONLY:
            step = None
        elif row.metric.startswith("layer_"):
            step = value / row.published - 1
        else:
            step = row.published / value - 1
        mem = None
        if row.published_memory_gib is not None and est is not None:
            mem = est.reserved_peak_gib / row.published_memory_gib - 1  # published: max reserved
        out.append(RowError(row.table, row.label, step, mem))
    return out


@dataclass
class Score:
    rows: int
    mape: float
    bias: float
    within_15: int

    def text(self) -> str:
        return f"{self.mape:6.1%} {self.bias:+7.1%} {self.within_15:>3}/{self.rows:<3}"


def score(errors: list[float]) -> Score | None:
    if not errors:
        return None
    return Score(len(errors), statistics.fmean(abs(e) for e in errors), statistics.fmean(errors),
                 sum(abs(e) <= 0.15 for e in errors))


def by_source(errs: list[RowError], memory: bool = False) -> dict[str, Score]:
    out: dict[str, list[float]] = {}
    for e in errs:
        v = e.memory if memory else e.step
        if v is not None:
            out.setdefault(e.source, []).append(v)
    return {k: score(v) for k, v in out.items()}


# -- validate --constants -----------------------------------------------------------------------------


@dataclass
class ConstantEffect:
    name: str
    values: str  # the value, or per profile
    physical: float
    source: str
    fitted_on: str
    mape: float  # overall step-time MAPE with this constant at its physical default
    memory_mape: float | None
    worst_source: str  # the table it moves most, and by how much


def _set_everywhere(c: ProfileConstant, value: float) -> Transform:
    return lambda _name, prof: c.set(prof, value)


def constant_effects(rows: list[PublishedRow] | None = None) -> tuple[Score, Score | None, list[ConstantEffect]]:
    """Baseline scores, and for every constant the scores with it at its physical default."""
    rows = rows or training_rows()
    base = row_errors(rows)
    base_src = by_source(base)
    effects = []
    profiles = sorted({r.plan.cluster for r in rows})

    def effect(name, values, physical, source, fitted, errs):
        src = by_source(errs)
        moved = max(src, key=lambda s: abs(src[s].mape - base_src[s].mape))
        mem = score([e.memory for e in errs if e.memory is not None])
        return ConstantEffect(name, values, physical, source, fitted,
                              score(step_errors(errs)).mape, mem.mape if mem else None,
                              f"{moved}: {base_src[moved].mape:.1%} -> {src[moved].mape:.1%}")

    for f in fields(constants.ModelConstants):
        physical, value = f.metadata["physical"], f.default
        if physical == value:
            errs = base
        else:
            with constants.model_constants(**{f.name: physical}):
                errs = row_errors(rows)
        effects.append(effect(f.name, f"{value:g}", physical, f.metadata["source"], "sourced (code)", errs))
    for c in PROFILE_CONSTANTS:
        vals = ", ".join(f"{p} {c.get(load_profile(p)):g}" for p in profiles)
        fitted = "; ".join(f"{p}: {', '.join(t)} ({_sources_text(t)})" for p, t in c.fitted_on.items()) or "sourced"
        effects.append(effect(c.name, vals, c.physical, c.source, fitted, row_errors(rows, _set_everywhere(c, c.physical))))
    mem = score([e.memory for e in base if e.memory is not None])
    return score(step_errors(base)), mem, effects


def step_errors(errs: list[RowError]) -> list[float]:
    """The step-time errors of the rows that have one (memory-only rows have none)."""
    return [e.step for e in errs if e.step is not None]


def source_of(table: str) -> str:
    """The publication a table comes from: TorchTitan's six tables are one source, and each MoE publication's
    tables, one per model, another (constants.MOE_SOURCES)."""
    moe = moe_source_and_model(table)
    if moe:
        return moe[0]
    return constants.table_publication(table)


def _sources_text(tables: tuple[str, ...]) -> str:
    n = len(dict.fromkeys(source_of(t) for t in tables))
    return f"{n} source{'s' if n != 1 else ''}"


# -- validate --cross ---------------------------------------------------------------------------------


@dataclass
class FitTarget:
    """One fitted constant on one profile."""

    constant: ProfileConstant
    profile: str
    tables: tuple[str, ...]


def fit_targets() -> list[FitTarget]:
    return [FitTarget(c, p, t) for c in PROFILE_CONSTANTS for p, t in c.fitted_on.items()]


def _golden(f: Callable[[float], float], lo: float, hi: float, iterations: int = GOLDEN_ITERATIONS) -> float:
    """Minimum of a unimodal f on [lo, hi] by golden-section search (the ends are tried too)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iterations):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    best = min([(fc, c), (fd, d), (f(lo), lo), (f(hi), hi)])
    return best[1]


def _objective(errs: list[RowError], memory: bool = False, spread: bool = False) -> float:
    """Mean squared log error of step time (or of peak memory, for a memory constant): symmetric in
    over- and under-prediction. With `spread`, each source's mean log error is taken out first
    (ProfileConstant.objective)."""
    logs: dict[str, list[float]] = {}
    for e in errs:
        v = e.memory if memory else e.step
        if v is not None:
            logs.setdefault(e.source if spread else "", []).append(math.log1p(v))
    centre = {s: statistics.fmean(v) if spread else 0.0 for s, v in logs.items()}
    return statistics.fmean((x - centre[s]) ** 2 for s, v in logs.items() for x in v)


def coupled_targets() -> list[list[FitTarget]]:
    """The fit targets in registry order, those of one profile key and one set of tables together: constants
    fitted on the same rows of the same parts trade off against each other (the Blackwell parts' tensor-core
    and memory-bound rates under forms.py memory_rate fitted), so they are searched jointly."""
    groups: dict[tuple, list[FitTarget]] = {}
    for t in fit_targets():
        groups.setdefault((t.profile, t.tables, t.constant.time, t.constant.objective), []).append(t)
    return list(groups.values())


def _joint(loss: Callable[[tuple[float, ...]], float], start: tuple[float, ...],
           bounds: list[tuple[float, float]]) -> tuple[float, ...]:
    """Minimum of `loss` over a box by Nelder-Mead's simplex (scipy), each coordinate scaled to its bounds and
    searched to CONVERGED of them: along a ridge, where one coordinate at a time zig-zags (a sweep of coordinate
    descent at 1d68a06 still moved the Blackwell rates by 0.31 % of their bounds at its cap of 12 sweeps), the
    simplex follows it, and it asks no gradient of a loss that is piecewise (maxima, interpolated points).
    scipy's bounded Powell stalled on the ridge of the test (tests/calibrate/test_published_fit.py)."""
    from scipy.optimize import minimize

    def at(u) -> tuple[float, ...]:
        return tuple(lo + float(x) * (hi - lo) for x, (lo, hi) in zip(u, bounds))

    u0 = [(v - lo) / (hi - lo) for v, (lo, hi) in zip(start, bounds)]
    res = minimize(lambda u: loss(at(u)), u0, method="Nelder-Mead", bounds=[(0.0, 1.0)] * len(bounds),
                   options={"xatol": CONVERGED, "fatol": 1e-9})
    return at(res.x)


def fit(rows: list[PublishedRow], values: dict[tuple[str, str], float] | None = None) -> dict[tuple[str, str], float]:
    """Each fitted constant by a 1-D search on the rows of its tables (coupled ones jointly: coupled_targets),
    coordinate descent in registry order until a sweep moves no constant by more than CONVERGED of its bounds:
    the compute rate and the overlaps trade off, so a fixed number of passes would leave the answer depending
    on the starting guesses."""
    values = dict(values or {})
    for _ in range(MAX_SWEEPS):
        moved = 0.0
        for group in coupled_targets():
            t = group[0]
            members = fitted_profiles(t.profile)
            mine = [r for r in rows if r.table in t.tables and (members is None or r.plan.cluster in members)
                    and (t.constant.time or r.published_memory_gib is not None)]
            if not mine:
                continue  # no row to fit on: keeps its built-in value
            keys = tuple((g.constant.name, g.profile) for g in group)

            def loss(v: tuple[float, ...], keys=keys, mine=mine, memory=not t.constant.time,
                     spread=t.constant.objective == "spread") -> float:
                return _objective(row_errors(mine, transform_of({**values, **dict(zip(keys, v))})), memory, spread)
            bounds = [g.constant.bounds for g in group]
            start = tuple(values.get(k, g.constant.get(load_profile(mine[0].plan.cluster))) for k, g in zip(keys, group))
            new = ((_golden(lambda v: loss((v,)), *bounds[0]),) if len(group) == 1 else _joint(loss, start, bounds))
            if loss(new) <= loss(start):  # a search brackets a local minimum: never step uphill
                moved = max([moved] + [abs(n - s) / (hi - lo) for n, s, (lo, hi) in zip(new, start, bounds)])
                values.update(zip(keys, new))
            else:
                values.update(zip(keys, start))
        if moved <= CONVERGED:
            break
    return values


def transform_of(values: dict[tuple[str, str], float]) -> Transform:
    by_name = {c.name: c for c in PROFILE_CONSTANTS}

    def apply(name: str, prof: ClusterProfile) -> ClusterProfile:
        for (cname, pname), v in values.items():
            members = fitted_profiles(pname)
            if (name in members) if members is not None else runs_nccl(prof):
                prof = by_name[cname].set(prof, v)
        return prof
    return apply


@dataclass
class CrossResult:
    in_sample: list[RowError]  # every row, constants fitted on all rows
    out_of_sample: list[RowError]  # each row predicted with constants fitted without its table
    fitted_all: dict[tuple[str, str], float]
    fitted_without: dict[str, dict[tuple[str, str], float]] = field(default_factory=dict)
    builtin: list[RowError] = field(default_factory=list)  # the built-in profiles as shipped


def fold_of(table: str) -> str:
    """What is held out with a table: itself, but for the MoE tables their model, whichever publication
    printed it (Megatron-Bridge's pages, the model zoo and Megatron-LM's notes print the same models), so
    that leaving a fold out leaves a model out and no fit sees that model's runs."""
    moe = moe_source_and_model(table)
    return moe[1] if moe else table


def _without(rows: list[PublishedRow], by: str, name: str) -> list[PublishedRow]:
    """`rows` less one fold (by="fold": fold_of) or one source (by="source": source_of)."""
    of = fold_of if by == "fold" else source_of
    return [r for r in rows if of(r.table) != name]


def _fit_leaving_out(args: tuple[str, str, frozenset[tuple[str, str]]]) -> dict[tuple[str, str], float]:
    """A worker's fit of the training rows named by (table, label) in `keys`, without one fold or source."""
    by, name, keys = args
    return fit(_without([r for r in training_rows() if (r.table, r.label) in keys], by, name))


def _fits_leaving_out(rows: list[PublishedRow], by: str, names: list[str], jobs: int) -> list[dict]:
    """fit() on the training rows `rows` without each of `names` in turn; with jobs > 1 in that many processes,
    each rebuilding the rows (the same fits: each is deterministic)."""
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        keys = frozenset((r.table, r.label) for r in rows)
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(_fit_leaving_out, [(by, n, keys) for n in names]))
    return [fit(_without(rows, by, n)) for n in names]


def leave_one_table_out(rows: list[PublishedRow], jobs: int = 1) -> tuple[list[RowError], dict[str, dict[tuple[str, str], float]]]:
    """Every row predicted with the constants fitted without its fold (fold_of: its table, or for an MoE row
    its model), fold by fold, and those fits."""
    folds = list(dict.fromkeys(fold_of(r.table) for r in rows))
    fitted_without = dict(zip(folds, _fits_leaving_out(rows, "fold", folds, jobs)))
    errors: list[RowError] = []
    for fold, values in fitted_without.items():
        errors += row_errors([r for r in rows if fold_of(r.table) == fold], transform_of(values))
    return errors, fitted_without


def leave_one_source_out(rows: list[PublishedRow], jobs: int = 1) -> dict[str, dict[tuple[str, str], float]]:
    """The constants fitted without each publication in turn (source_of): how far each fitted value rests on
    any one source. A constant whose every row comes from the left-out source keeps no value there."""
    sources = list(dict.fromkeys(source_of(r.table) for r in rows))
    return dict(zip(sources, _fits_leaving_out(rows, "source", sources, jobs)))


def cross_validate(rows: list[PublishedRow] | None = None, jobs: int = 1) -> CrossResult:
    rows = rows or training_rows()
    fitted_all = fit(rows)
    result = CrossResult(row_errors(rows, transform_of(fitted_all)), [], fitted_all, builtin=row_errors(rows))
    result.out_of_sample, result.fitted_without = leave_one_table_out(rows, jobs)
    order = {(r.table, r.label): i for i, r in enumerate(rows)}
    result.out_of_sample.sort(key=lambda e: order[(e.source, e.label)])
    return result


# -- text -------------------------------------------------------------------------------------------


def constants_text() -> str:
    """`meshplan validate --constants`: every constant, its value and source, and what its physical default does."""
    rows = training_rows()
    base, base_mem, effects = constant_effects(rows)
    saved = saved_fits()
    lines = [f"step-time MAPE over the {base.rows} published training rows with every constant as shipped: "
             f"{base.mape:.1%} (bias {base.bias:+.1%}, {base.within_15}/{base.rows} within 15 %)"
             + (f"; memory MAPE {base_mem.mape:.1%} over {base_mem.rows} rows ({_memory_rows_text(rows)})" if base_mem else ""),
             "", f"{'constant':<34} {'value':<40} {'physical':>8} {'MAPE at physical':>17} {'mem MAPE':>9}  most moved table"]
    for e in effects:
        mem = "" if e.memory_mape is None else f"{e.memory_mape:.1%}"
        lines.append(f"{e.name:<34} {e.values[:40]:<40} {e.physical:>8g} {e.mape:>8.1%} ({e.mape - base.mape:+5.1%}) "
                     f"{mem:>9}  {e.worst_source}")
        lines.append(f"    source: {e.source}")
        lines.append(f"    fitted on: {e.fitted_on}")
        for key, fitted in saved.items():
            if key[0] == e.name:
                lines.append(f"    left out by source (validate --cross --save): {leave_one_source_out_text(fitted)}")
    return "\n".join(lines)


def _memory_rows_text(rows: list[PublishedRow]) -> str:
    """How many of `rows` with a memory figure are published and how many are the runtime's own runs."""
    memory = [r for r in rows if r.published_memory_gib is not None]
    own = sum(r.table == RUNTIME_RUNS for r in memory)
    return f"{len(memory) - own} published, {own} of the runtime's own runs"


def _score_lines(title: str, errs: dict[str, list[RowError]], memory: bool = False) -> list[str]:
    lines = [title, f"{'source':<40} " + " ".join(f"{k + ' MAPE  bias  w/in15':>28}" for k in errs)]
    sources = list(dict.fromkeys(e.source for v in errs.values() for e in v))
    # The groups are of published runs: the runtime's own (memory only, dense and MoE) count in overall alone.
    groups = {"dense runs": lambda e: not is_moe_source(e.source) and e.source != RUNTIME_RUNS,
              "dense, TorchTitan and Megatron":
                  lambda e: not is_moe_source(e.source) and e.source not in (LLMFOUNDRY, IBM_FMS, OLMO_CORE, RUNTIME_RUNS),
              "MoE runs": lambda e: is_moe_source(e.source)}
    if memory:
        groups["published runs"] = lambda e: e.source != RUNTIME_RUNS
    groups["overall"] = lambda e: True
    for src in sources + list(groups):
        cells = []
        for v in errs.values():
            vals = [e.memory if memory else e.step for e in v if groups.get(src, lambda e: e.source == src)(e)]
            s = score([x for x in vals if x is not None])
            cells.append(f"{s.text() if s else 'n/a':>28}")
        if any(c.strip() != "n/a" for c in cells):
            lines.append(f"{src[:40]:<40} " + " ".join(cells))
    return lines


def moe_source_and_model(table: str) -> tuple[str, str] | None:
    """(publication, model) of an MoE table (constants.moe_table), or None for any other table."""
    source, sep, model = table.partition(MOE_TABLE_SEPARATOR)
    return (source, model) if sep and source in MOE_SOURCES else None


def is_moe_source(source: str) -> bool:
    return moe_source_and_model(source) is not None


def _worst_memory(errs: list[RowError]) -> str:
    worst = max((e for e in errs if e.memory is not None), key=lambda e: abs(e.memory), default=None)
    return "n/a" if worst is None else f"{worst.memory:+.1%} ({worst.label})"


def cross_text(result: CrossResult | None = None) -> str:
    """`meshplan validate --cross`: in-sample and leave-one-table-out scores per source and overall."""
    r = result or cross_validate()
    sets = {"built-in": r.builtin, "in-sample": r.in_sample, "out-of-sample": r.out_of_sample}
    lines = ["step time (error = predicted / measured - 1; negative bias = optimistic)"]
    lines += _score_lines("", sets)
    lines += ["", "peak memory (error = predicted / measured - 1)"]
    lines += _score_lines("", sets, memory=True)
    lines += [f"largest memory error {name}: {_worst_memory(v)}" for name, v in sets.items()]
    lines += ["", "fitted constants: on every table | range over the leave-one-table-out fits"]
    for key, v in r.fitted_all.items():
        others = [w[key] for w in r.fitted_without.values() if key in w]
        lines.append(f"  {key[0]:<32} {key[1]:<14} {v:8.4g} | {min(others):.4g} .. {max(others):.4g}")
    return "\n".join(lines)


def oos_document(result: CrossResult, rows: list[PublishedRow] | None = None) -> dict:
    """What band.py reads: every whole-run row's features, out-of-sample error, published MFU and term shares."""
    from meshplan.cost_models.band import features
    from meshplan.cost_models.validate import predict

    rows = rows or training_rows()
    oos = {(e.source, e.label): e.step for e in result.out_of_sample}
    builtin = {(e.source, e.label): e.step for e in result.builtin}
    out = []
    for row in rows:
        if row.metric.startswith("layer_") or row.metric == MEMORY_ONLY:
            continue  # one layer, not a run: no scale, no MFU; or no step time
        _, est, plan = predict(row)
        key = (row.table, row.label)
        out.append({"source": row.table, "label": row.label, "oos_step_error": round(oos[key], 5),
                    "published_mfu": round(est.mfu * (1 + builtin[key]), 5),
                    "time_shares": {k: round(v / est.step_time_s, 4) for k, v in est.time_s.items()},
                    "features": features(plan, row.table)})
    return {"note": "written by `meshplan validate --cross --save`; rerun it after changing the cost model",
            "rows": out}


OOS_PATH = Path(__file__).parent.parent / "data" / "validation" / "oos_errors.json"


def fits_document(result: CrossResult, by_source: dict[str, dict[tuple[str, str], float]]) -> list[dict]:
    """Each fitted constant's value on every row, and without each source it was fitted on (None where that
    source held all its rows): what `validate --constants` prints as its leave-one-source-out range."""
    out = []
    for t in fit_targets():
        key = (t.constant.name, t.profile)
        if key not in result.fitted_all:
            continue
        sources = dict.fromkeys(source_of(table) for table in t.tables)
        out.append({"constant": key[0], "profile": key[1], "all": round(result.fitted_all[key], 6),
                    "without_source": {s: (round(by_source[s][key], 6) if key in by_source.get(s, {}) else None)
                                       for s in sources}})
    return out


def save_oos(result: CrossResult, rows: list[PublishedRow], jobs: int = 1) -> str:
    from meshplan.yamlio import atomic_write_text

    doc = oos_document(result, rows)
    doc["fits"] = fits_document(result, leave_one_source_out(rows, jobs))
    atomic_write_text(OOS_PATH, json.dumps(doc, indent=1) + "\n")
    return str(OOS_PATH)


def saved_fits() -> dict[tuple[str, str], dict]:
    """The fits `validate --cross --save` last wrote, by (constant, profile key); empty before any."""
    if not OOS_PATH.is_file():
        return {}
    return {(f["constant"], f["profile"]): f for f in json.loads(OOS_PATH.read_text()).get("fits", [])}


def leave_one_source_out_text(fitted: dict) -> str:
    """One fitted constant's leave-one-source-out line, from saved_fits."""
    kept = {s: v for s, v in fitted["without_source"].items() if v is not None}
    parts = [f"{fitted['profile']}: {fitted['all']:.4g} on every source"]
    if kept:
        parts.append(f"{min(kept.values()):.4g} .. {max(kept.values()):.4g} leaving one of {len(kept)} out")
    lost = [s for s, v in fitted["without_source"].items() if v is None]
    if lost:
        parts.append(f"no row left without {', '.join(lost)}")
    return ", ".join(parts)


def cross_report(save: bool = False, jobs: int = 1) -> str:
    rows = training_rows()
    result = cross_validate(rows, jobs)
    text = cross_text(result)
    return text + (f"\nout-of-sample errors and leave-one-source-out fits written to {save_oos(result, rows, jobs)}"
                   if save else "")
