"""The planner against TorchTitan's hand-tuned Llama 3.1 configurations (H100 96GB, Dec 2024).

    python benchmarks/planner_vs_experts.py

For each expert row (the fastest published variant of each configuration): the expert plan scored by
the cost model, then `search()` over the same model, GPU count, seq len, global batch and cluster,
with every other field auto. Prints the expert's tokens/s/GPU and memory, the planner's choice, the
predicted gain and the plan fields that differ, and whether the planner is at least as fast by the
model (it must be: the expert plan is in the space unless the expert uses something outside it).
"""

from __future__ import annotations

import sys
import time

from meshplan.cost_models.estimate import estimate_plan
from meshplan.cost_models.published import torchtitan_rows
from meshplan.planner.search import search
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import Plan, TrainingSpec, ParallelSpec, MemorySpec

# (model size, GPUs, degrees as published): the four expert layouts in the brief, fastest variant of each.
WANTED = [("8B", 8, "FSDP 8"), ("8B", 128, "FSDP 128"), ("70B", 256, "FSDP 32, TP 8"), ("405B", 512, "FSDP 8, TP 8, PP 8")]
AUTO = "auto"


def fields_of(plan: Plan) -> dict:
    d = plan.to_dict()
    out = {f"training.{k}": v for k, v in d["training"].items()}
    out.update({f"parallel.{k}": v for k, v in d["parallel"].items()})
    out.update({f"memory.{k}": v for k, v in d["memory"].items()})
    out["compile"] = d["compile"]
    return out


def main() -> int:
    rows = torchtitan_rows()
    profile = load_profile("h100-96g-gt")
    bad = []
    for size, gpus, par in WANTED:
        cands = [r for r in rows if r.plan is not None and r.plan.gpus == gpus and f"Llama 3.1 {size}" in r.label
                 and f"{par} seq" in r.label and r.plan.training.seq_len == 8192]
        if not cands:
            print(f"\n{size} on {gpus} GPUs ({par}): no published row found")
            continue
        expert = max(cands, key=lambda r: r.published)  # the fastest published variant
        plan = expert.plan
        est = estimate_plan(plan, profile, **expert.layout_overrides)
        t = plan.training
        print(f"\n=== Llama 3.1 {size}, {gpus} x H100 96GB, seq {t.seq_len}, global batch {t.global_batch} ===")
        print(f"expert ({expert.label.split('|')[-1].strip()}):")
        print(f"  published {expert.published:,.0f} tok/s/GPU, {expert.published_memory_gib} GiB")
        print(f"  model     {est.tokens_per_s_per_gpu:,.0f} tok/s/GPU, {est.peak_memory_gib:.1f} GiB, "
              f"step {est.step_time_s:.3f} s, fits {est.fits}")
        free = Plan(model=plan.model, cluster=plan.cluster, gpus=gpus,
                    training=TrainingSpec(seq_len=t.seq_len, global_batch=t.global_batch, micro_batch=AUTO, dtype="bf16"),
                    parallel=ParallelSpec(), memory=MemorySpec(sac_ops=AUTO), compile=AUTO)
        t0 = time.perf_counter()
        res = search(free, profile, top_k=3)
        dt = time.perf_counter() - t0
        if res.best is None:
            print(f"  planner: nothing fits ({dt:.1f} s)")
            bad.append(f"{size}/{gpus}: planner found nothing")
            continue
        best_plan = res.best_plan()
        b = res.best.estimate
        gain = b.tokens_per_s_per_gpu / est.tokens_per_s_per_gpu - 1
        n = res.counts()
        print(f"planner ({n['space']:,} plans in {dt:.1f} s):")
        print(f"  model     {b.tokens_per_s_per_gpu:,.0f} tok/s/GPU, {b.peak_memory_gib:.1f} GiB, step {b.step_time_s:.3f} s, "
              f"MFU {b.mfu:.1%}")
        print(f"  predicted gain over the expert: {gain:+.1%}")
        ef, pf = fields_of(plan), fields_of(best_plan)
        diffs = [f"{k}: {ef[k]} -> {pf[k]}" for k in ef if ef[k] != pf.get(k)]
        if expert.layout_overrides:
            diffs.append(f"(expert scored with {expert.layout_overrides})")
        print("  differs:\n    " + "\n    ".join(diffs) if diffs else "  same plan")
        ok = b.step_time_s <= est.step_time_s * (1 + 1e-9) or not est.fits
        verdict = "yes" if ok else "NO - BUG: the expert plan is in the space and faster by the model"
        print(f"  planner at least as fast as the expert by the model: {verdict}")
        if not ok:
            bad.append(f"{size}/{gpus}: planner {b.step_time_s:.4f} s vs expert {est.step_time_s:.4f} s")
    print("\nsummary: " + ("planner >= expert everywhere (by the model)" if not bad else "; ".join(bad)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
