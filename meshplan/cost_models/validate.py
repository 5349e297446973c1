"""`meshplan validate`: predicted vs published for every calibration row the model can express."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Callable

from meshplan.argparsing import ArgumentParser
from meshplan.cost_models.estimate import Estimate, estimate_plan, group_spans
from meshplan.cost_models.flops import megatron_flops_per_iteration
from meshplan.cost_models.layout import layout_of
from meshplan.cost_models.published_comm import USED_ELSEWHERE, collective_rows
from meshplan.cost_models.published import PublishedRow, korthikanti_layer_rows, megatron_rows, torchtitan_rows
from meshplan.cost_models.timing import block_time
from meshplan.profiles.registry import load_profile
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import Plan


def _best_micro_batch(plan: Plan, overrides: dict, prof: ClusterProfile) -> tuple[Plan, Estimate]:
    """Where a source leaves the micro-batch unstated: the fastest that fits, by this model."""
    local = plan.training.global_batch // plan.parallel.dp()
    best = None
    for mb in [d for d in range(1, local + 1) if local % d == 0]:
        cand = plan.copy()
        cand.training = replace(plan.training, micro_batch=mb)
        est = estimate_plan(cand, prof, **overrides)
        key = (est.fits, -est.step_time_s)
        if best is None or key > best[0]:
            best = (key, cand, est)
    return best[1], best[2]


def predict_layer_ms(row: PublishedRow, prof: ClusterProfile) -> float:
    """One block's forward, or backward (recompute included), for one micro-batch, in milliseconds."""
    lay = replace(layout_of(row.plan), **row.layout_overrides)
    bt = block_time(lay, prof, group_spans(lay, prof))
    if row.metric == "layer_forward_ms":
        return 1e3 * bt.forward_with_comm
    return 1e3 * (bt.backward_input_with_comm + bt.backward_weight)


def predict(row: PublishedRow, load: Callable[[str], ClusterProfile] = load_profile) -> tuple[float, Estimate | None, Plan]:
    """The row's figure as the model predicts it; `load` gives the profile (a variant, for --constants / --cross)."""
    plan = row.plan
    prof = load(plan.cluster)
    if row.metric.startswith("layer_"):
        return predict_layer_ms(row, prof), None, plan
    if plan.training.micro_batch == "auto":
        plan, est = _best_micro_batch(plan, row.layout_overrides, prof)
    else:
        est = estimate_plan(plan, prof, **row.layout_overrides)
    if row.metric == "tflops_per_gpu":
        t = plan.training
        value = megatron_flops_per_iteration(plan.model, t.seq_len, t.global_batch) / est.step_time_s / plan.gpus / 1e12
    else:
        value = est.tokens_per_s_per_gpu
    return value, est, plan


def validation_results() -> list[dict]:
    out = []
    for row in megatron_rows() + korthikanti_layer_rows() + torchtitan_rows():
        if row.skipped:
            out.append({"table": row.table, "label": row.label, "skipped": row.skipped})
            continue
        value, est, _ = predict(row)
        rec = {"table": row.table, "label": row.label, "metric": row.metric, "published": row.published,
               "predicted": value, "error": value / row.published - 1}
        if row.published_memory_gib is not None:
            rec.update(published_memory_gib=row.published_memory_gib, predicted_memory_gib=est.peak_memory_gib,
                       memory_error=est.peak_memory_gib / row.published_memory_gib - 1)
        out.append(rec)
    for c in collective_rows():
        if c.skipped:
            out.append({"table": c.table, "label": c.label, "skipped": c.skipped})
            continue
        value = c.predict()
        out.append({"table": c.table, "label": c.label, "metric": c.metric, "published": c.published,
                    "predicted": value, "error": value / c.published - 1})
    return out


METRIC_UNITS = {"tflops_per_gpu": "TFLOP/s/GPU", "tokens_per_s_per_gpu": "tokens/s/GPU",
                "layer_forward_ms": "ms", "layer_backward_ms": "ms", "time_us": "us", "busbw_gbs": "GB/s"}


def _table_groups(results: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for r in results:
        key = "TorchTitan H100" if r["table"].startswith("TorchTitan") else r["table"]
        groups.setdefault(key, []).append(r)
    return groups


def main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="meshplan validate", description="Predicted vs published measurements.")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--constants", action="store_true", help="every cost-model constant: value, source, and MAPE at its physical default")
    ap.add_argument("--cross", action="store_true", help="refit the fitted constants with each published table left out")
    ap.add_argument("--save", action="store_true", help="with --cross: write the out-of-sample errors the estimate bands use")
    args = ap.parse_args(argv)
    if args.constants or args.cross:
        from meshplan.cost_models.crossval import constants_text, cross_report
        print("\n\n".join(f() for f, on in ((constants_text, args.constants),
                                             (lambda: cross_report(args.save), args.cross)) if on))
        return 0
    results = validation_results()
    groups = _table_groups(results)
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
    print("\n== Published tables that are not runs or collectives")
    for name, use in USED_ELSEWHERE.items():
        print(f"{name:<50} {use}")
    return 0
