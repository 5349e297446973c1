"""`meshplan validate [--json | --constants | --cross]`: predictions against published measurements."""

from __future__ import annotations

import json

from meshplan.commands.argparsing import ArgumentParser
from meshplan.cost_models.published_comm import USED_ELSEWHERE
from meshplan.cost_models.validate import METRIC_UNITS, table_groups, validation_results
from meshplan.errors import InputError


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="meshplan validate", description="Predicted vs published measurements.")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--constants", action="store_true", help="every cost-model constant: value, source, and MAPE at its physical default")
    ap.add_argument("--cross", action="store_true", help="refit the fitted constants with each published table left out")
    ap.add_argument("--save", action="store_true", help="with --cross: write the out-of-sample errors the estimate bands use, and the "
                    "fits with each source left out that --constants prints")
    ap.add_argument("--nested", action="store_true",
                    help="with --cross: choose the cost model's forms by nested cross-validation and score the held-out "
                         "tables (slow: one leave-one-table-out fit per table, form and alternative)")
    ap.add_argument("--form", action="append", metavar="NAME",
                    help="with --nested: choose this form only (repeatable); the others stay at the shipped alternative")
    ap.add_argument("--jobs", type=int, default=1, help="with --cross: processes to run the held-out folds' fits on "
                                                          "(the same fits: each is deterministic)")
    return ap


def _nested_text(names: list[str] | None, jobs: int) -> str:
    from meshplan.cost_models import forms
    from meshplan.cost_models.nested import nested_cross_validate, nested_text

    for name in names or []:
        if name not in forms.ALTERNATIVES:
            raise InputError("--form", f"must be one of {', '.join(forms.ALTERNATIVES)}, got {name!r}")
    alternatives = {n: forms.ALTERNATIVES[n] for n in names} if names else None
    return nested_text(nested_cross_validate(alternatives=alternatives, jobs=jobs))


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.nested and not args.cross:
        raise InputError("--nested", "goes with --cross")
    if args.form and not args.nested:
        raise InputError("--form", "goes with --nested")
    if args.jobs != 1 and not args.cross:
        raise InputError("--jobs", "goes with --cross")
    if args.jobs < 1:
        raise InputError("--jobs", f"must be at least 1, got {args.jobs}")
    if args.constants or args.cross:
        from meshplan.cost_models.crossval import constants_text, cross_report
        print("\n\n".join(f() for f, on in ((constants_text, args.constants),
                                             (lambda: cross_report(args.save, args.jobs), args.cross and not args.nested),
                                             (lambda: _nested_text(args.form, args.jobs), args.nested)) if on))
        return 0
    results = validation_results()
    groups = table_groups(results)
    summary = {}
    for name, rows in groups.items():
        done = [r for r in rows if "error" in r]
        mem = [r for r in done if "memory_error" in r]
        summary[name] = {
            "rows": len(done),
            "mape": sum(abs(r["error"]) for r in done) / len(done) if done else None,
            "memory_rows": len(mem),
            "memory_mape": sum(abs(r["memory_error"]) for r in mem) / len(mem) if mem else None,
            "memory_max_abs_error": max((abs(r["memory_error"]) for r in mem), default=None),
            "skipped": [r for r in rows if "skipped" in r],
            "runs": sum("fits" in r for r in done),
            "priced_over_memory": sum(r.get("fits") is False for r in done),
        }
    if args.json:
        print(json.dumps({"rows": results, "summary": summary, "used_elsewhere": USED_ELSEWHERE}, indent=2))
        return 0
    for name, rows in groups.items():
        print(f"\n== {name}")
        s = summary[name]
        header = f"{'configuration':<92} {'published':>10} {'predicted':>10} {'error':>7}"
        print(header + (f"   {'mem GiB':>7} {'pred':>6} {'error':>7}" if s["memory_rows"] else ""))
        for r in rows:
            if "skipped" in r:
                print(f"{r['label']:<92} left out: {r['skipped']}")
                continue
            line = f"{r['label'][:92]:<92} {r['published']:>10.1f} {r['predicted']:>10.1f} {r['error']:>+7.1%}"
            line += f"  over memory ({r['memory_over_usable']:+.1%})" if r.get("fits") is False else ""
            if "memory_error" in r:
                line += f"   {r['published_memory_gib']:>7.1f} {r['predicted_memory_gib']:>6.1f} {r['memory_error']:>+7.1%}"
            print(line)
        if not s["rows"]:
            print("no row the model can express")
            continue
        unit = METRIC_UNITS[next(r["metric"] for r in rows if "metric" in r)]
        line = f"mean absolute error ({unit}): {s['mape']:.1%} over {s['rows']} rows"
        if s["memory_rows"]:
            line += f"; memory: mean {s['memory_mape']:.1%}, max {s['memory_max_abs_error']:.1%} over {s['memory_rows']} rows"
        print(line)
        if s["runs"]:
            print(f"runs priced over their GPUs' memory: {s['priced_over_memory']} of {s['runs']}")
    runs = sum(s["runs"] for s in summary.values())
    over = sum(s["priced_over_memory"] for s in summary.values())
    print(f"\n== Every published run completed on its GPUs\nruns priced over their GPUs' memory, all tables: {over} of {runs}")
    print("\n== Published tables that are not runs or collectives")
    for name, use in USED_ELSEWHERE.items():
        print(f"{name:<50} {use}")
    return 0
