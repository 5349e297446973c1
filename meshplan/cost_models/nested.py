"""Model selection by nested cross-validation (`meshplan validate --cross --nested`).

A functional form (forms.py) is a model choice: choosing it by the leave-one-table-out score and then
quoting that score would make the score partly in-sample. Here each published table is held out in
turn (the outer fold); on the tables left, every alternative of every form is scored by its own
leave-one-table-out fits (the inner folds), the alternative with the lowest inner error is taken, the
constants are refitted with it on those tables, and only then is the held-out table predicted. The
outer predictions are the honest out-of-sample figure; how often each alternative won says how firmly
the evidence chose it.

Forms are chosen one after another in ALTERNATIVES' order, each with the forms before it at their
choice and the ones after at the shipped form. The inner error weighs every table alike (the mean over
tables of each table's mean squared log step-time error), so a source with many rows does not decide
alone.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from meshplan.cost_models import forms
from meshplan.cost_models.crossval import (RowError, _objective, _score_lines, fit, fold_of, leave_one_table_out,
                                           row_errors, step_time_rows, transform_of)
from meshplan.cost_models.published import PublishedRow


@dataclass
class Fold:
    held_out: str
    inner: dict[str, dict[str, float]]  # form -> alternative -> inner error
    chosen: dict[str, str]  # form -> alternative


@dataclass
class NestedResult:
    out_of_sample: list[RowError] = field(default_factory=list)
    folds: list[Fold] = field(default_factory=list)
    on_every_table: Fold | None = None  # the choice made on all tables: what should ship
    forms: tuple[str, ...] = ()  # the forms chosen; the others stay at the shipped alternative


def table_mean_error(errs: list[RowError]) -> float:
    """The mean over tables of each table's mean squared log step-time error."""
    tables = dict.fromkeys(e.source for e in errs)
    return statistics.fmean(_objective([e for e in errs if e.source == t]) for t in tables)


def choose_forms(rows: list[PublishedRow], alternatives: dict[str, tuple[str, ...]]) -> tuple[dict, dict]:
    """(form -> alternative chosen, form -> alternative -> inner error) on `rows` alone."""
    chosen: dict[str, str] = {}
    inner: dict[str, dict[str, float]] = {}
    for name, options in alternatives.items():
        inner[name] = {}
        for option in options:
            with forms.forms(**chosen, **{name: option}):
                inner[name][option] = table_mean_error(leave_one_table_out(rows)[0])
        chosen[name] = min(options, key=lambda o: (inner[name][o], options.index(o)))
    return chosen, inner


def outer_fold(rows: list[PublishedRow], held_out: str | None,
               alternatives: dict[str, tuple[str, ...]]) -> tuple[list[RowError], Fold]:
    """One outer fold: forms chosen and constants fitted without `held_out`, which is then predicted.
    held_out None: the choice on every table (nothing predicted)."""
    train = [r for r in rows if fold_of(r.table) != held_out]
    chosen, inner = choose_forms(train, alternatives)
    if held_out is None:
        return [], Fold("", inner, chosen)
    with forms.forms(**chosen):
        values = fit(train)
        errs = row_errors([r for r in rows if fold_of(r.table) == held_out], transform_of(values))
    return errs, Fold(held_out, inner, chosen)


def _published_rows(keep: Callable[[str], bool] | None) -> list[PublishedRow]:
    """The published step-time rows, those of the tables `keep` takes where given."""
    return [r for r in step_time_rows() if keep is None or keep(r.table)]


def _outer_fold_of_the_training_rows(args: tuple[str | None, dict[str, tuple[str, ...]], Callable[[str], bool] | None]):
    """outer_fold on the published training rows `keep` takes, in a worker process (rows are rebuilt there)."""
    held_out, alternatives, keep = args
    return outer_fold(_published_rows(keep), held_out, alternatives)


def nested_cross_validate(rows: list[PublishedRow] | None = None,
                          alternatives: dict[str, tuple[str, ...]] | None = None, jobs: int = 1,
                          keep: Callable[[str], bool] | None = None) -> NestedResult:
    """Every table held out in turn, and the choice on every table. Without `rows`, the published training
    rows, of the tables `keep` (a module-level function of the table, so that a worker can take it) takes
    where given; jobs > 1 runs their folds in that many processes (a worker rebuilds them). The forms are of
    step time: rows without one (memory-only) take no part."""
    alternatives = alternatives or forms.ALTERNATIVES
    published = rows is None
    rows = _published_rows(keep) if published else rows
    tables: list[str | None] = list(dict.fromkeys(fold_of(r.table) for r in rows))
    tasks = tables + [None]
    if jobs > 1 and published:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            done = list(pool.map(_outer_fold_of_the_training_rows, [(t, alternatives, keep) for t in tasks]))
    else:
        done = [outer_fold(rows, t, alternatives) for t in tasks]
    result = NestedResult(forms=tuple(alternatives))
    for errs, fold in done[:-1]:
        result.out_of_sample += errs
        result.folds.append(fold)
    result.on_every_table = done[-1][1]
    return result


def nested_text(result: NestedResult | None = None) -> str:
    """`meshplan validate --cross --nested`: the held-out tables' scores, and each fold's choices."""
    r = result or nested_cross_validate()
    lines = ["step time, nested cross-validation (error = predicted / measured - 1): each table held out; on the",
             "rest, each form's alternatives scored by their own leave-one-table-out fits (inner error: mean over",
             "tables of the mean squared log error), the best refitted, then the held-out table predicted"]
    lines += _score_lines("", {"nested out-of-sample": r.out_of_sample})
    lines += ["", "chosen per held-out table (inner error of each alternative)"]
    for fold in r.folds:
        picks = "; ".join(f"{name}: {alt} (" + ", ".join(f"{o} {v:.5f}" for o, v in fold.inner[name].items()) + ")"
                          for name, alt in fold.chosen.items())
        lines.append(f"  {fold.held_out[:40]:<40} {picks}")
    every = r.on_every_table
    for name, options in forms.ALTERNATIVES.items():
        if name not in r.forms:
            lines.append(f"form {name}: not chosen here, held at the shipped {getattr(forms.FORMS, name)}")
            continue
        wins = {o: sum(f.chosen.get(name) == o for f in r.folds) for o in options}
        lines.append(f"form {name}: " + ", ".join(f"{o} chosen in {n} of {len(r.folds)} folds" for o, n in wins.items())
                     + (f"; on every table: {every.chosen[name]} ("
                        + ", ".join(f"{o} {v:.5f}" for o, v in every.inner[name].items()) + ")" if every else "")
                     + f"; shipped: {getattr(forms.FORMS, name)}")
    return "\n".join(lines)
