"""`meshplan validate`: predicted vs published for every calibration row the model can express."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from meshplan.cost_models.constants import table_publication
from meshplan.cost_models.estimate import Estimate, estimate_plan, group_spans
from meshplan.cost_models.flops import megatron_flops_per_iteration, model_flops_per_token
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.cost_models.published_comm import collective_rows
from meshplan.cost_models.published import MEMORY_ONLY, PublishedRow, all_training_rows
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
    lay = replace(runtime_paths(layout_of(row.plan), prof), **row.layout_overrides)
    bt = block_time(lay, prof, group_spans(lay, prof))
    if row.metric == "layer_forward_ms":
        return 1e3 * bt.forward_with_comm
    return 1e3 * (bt.backward_input_with_comm + bt.backward_weight)


def predict(row: PublishedRow, load: Callable[[str], ClusterProfile] = load_profile) -> tuple[float, Estimate | None, Plan]:
    """The row's figure as the model predicts it; `load` gives the profile (a variant, for --constants / --cross)."""
    plan = row.plan
    prof = load(plan.cluster)
    if row.network_gbs_per_gpu is not None:
        prof = prof.with_network_per_device(row.network_gbs_per_gpu)
    if row.metric.startswith("layer_"):
        return predict_layer_ms(row, prof), None, plan
    if plan.training.micro_batch == "auto":
        plan, est = _best_micro_batch(plan, row.layout_overrides, prof)
    else:
        est = estimate_plan(plan, prof, **row.layout_overrides)
    if row.metric == MEMORY_ONLY:
        value = est.reserved_peak_gib
    elif row.metric in ("mcore_tflops_per_gpu", "mcore_full_attention_tflops"):
        # Megatron-Core's FLOP count, its attention halved for the causal mask from 8873b55d6a (2025-03-06) on
        causal = row.metric == "mcore_tflops_per_gpu"
        value = model_flops_per_token(plan.model, plan.training.seq_len, causal=causal) * est.tokens_per_s_per_gpu / 1e12
    elif row.metric == "tflops_per_gpu":
        t = plan.training
        value = megatron_flops_per_iteration(plan.model, t.seq_len, t.global_batch) / est.step_time_s / plan.gpus / 1e12
    else:
        value = est.tokens_per_s_per_gpu
    return value, est, plan


def validation_results() -> list[dict]:
    out = []
    for row in all_training_rows():
        if row.skipped:
            out.append({"table": row.table, "label": row.label, "skipped": row.skipped})
            continue
        value, est, _ = predict(row)
        rec = {"table": row.table, "label": row.label, "metric": row.metric, "published": row.published,
               "predicted": value, "error": value / row.published - 1}
        if est is not None:
            # Every row is a run that completed: one the model prices over its GPUs' memory is a miss too.
            rec["fits"] = est.fits
            rec["memory_over_usable"] = est.peak_memory_gib / est.usable_memory_gib - 1
        if row.published_memory_gib is not None:
            rec.update(published_memory_gib=row.published_memory_gib, predicted_memory_gib=est.reserved_peak_gib,
                       memory_error=est.reserved_peak_gib / row.published_memory_gib - 1)
        out.append(rec)
    for c in collective_rows():
        if c.skipped:
            out.append({"table": c.table, "label": c.label, "skipped": c.skipped})
            continue
        value = c.predict()
        out.append({"table": c.table, "label": c.label, "metric": c.metric, "published": c.published,
                    "predicted": value, "error": value / c.published - 1})
    return out


METRIC_UNITS = {"tflops_per_gpu": "TFLOP/s/GPU", "mcore_tflops_per_gpu": "TFLOP/s/GPU",
                "mcore_full_attention_tflops": "TFLOP/s/GPU", "tokens_per_s_per_gpu": "tokens/s/GPU",
                "layer_forward_ms": "ms", "layer_backward_ms": "ms", "time_us": "us", "busbw_gbs": "GB/s",
                MEMORY_ONLY: "GiB reserved"}


def table_groups(results: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for r in results:
        key = table_publication(r["table"])
        groups.setdefault(key, []).append(r)
    return groups
