"""`meshplan estimate --plan P [--json]`: score one plan; `auto` fields get the best choice."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from meshplan.commands.argparsing import ArgumentParser
from meshplan.cost_models.band import band_of
from meshplan.cost_models.estimate import Estimate, estimate_plan
from meshplan.cost_models.stacks import STACKS
from meshplan.cost_models.plan_checks import check_against_profile
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import Plan, check_consistency, load_plan
from meshplan.specs.rules import MESHPLAN, check_backend_rules, normalise_moot_fields, profile_backend


# Memory budgets tried, as multiples of the device's usable memory, when no completion fits: the first is
# the memory model's error band on published runs (18 of 18 TorchTitan rows within 15 %, `validate --cross`).
RELAXED_BUDGETS = (1.15, 1.5, 2.0, 4.0)


def fill_auto(plan: Plan, profile) -> tuple[Plan, Estimate]:
    """The best complete plan that keeps every field the user gave (the planner's search). Where none fits,
    the best that fits the smallest relaxed budget, scored on the real profile (fits: false) and said on
    stderr: a run that was measured must still get a number, and the user sees by how much it misses."""
    from meshplan.planner.search import search

    result = search(plan, profile)
    if result.best is not None:
        return result.best_plan(), result.best.estimate  # the search's exact estimate of that plan
    usable = profile.device.usable_memory_gib
    for factor in RELAXED_BUDGETS:
        relaxed = replace(profile, device=replace(profile.device, usable_memory_gib=usable * factor,
                                                  memory_gib=max(profile.device.memory_gib, usable * factor)))
        best = search(plan, relaxed).best_plan()
        if best is not None:
            est = estimate_plan(best, profile)
            print(f"meshplan estimate: no completion of the plan's auto fields fits in {usable:.1f} GiB; scored the "
                  f"best that fits {factor:g}x that ({est.peak_memory_gib:.1f} GiB, fits: false)", file=sys.stderr)
            return best, est
    raise InputError("plan", "no completion of its auto fields fits in memory or divides evenly; "
                             "run `meshplan plan` for what would")


def _print_breakdown(plan: Plan, est: Estimate) -> None:
    p, t, m = plan.parallel, plan.training, plan.memory
    print(f"model {plan.model.name} ({plan.model.num_params() / 1e9:.2f}B params) on {plan.gpus} x {plan.cluster}")
    print(f"layout: dp_replicate {p.dp_replicate} x dp_shard {p.dp_shard} x cp {p.cp} x tp {p.tp}"
          f"{' (SP)' if p.sequence_parallel and p.tp > 1 else ''} x pp {p.pp}"
          f"{f' {p.pp_schedule} v={p.pp_virtual_stages}' if p.pp > 1 else ''}")
    print(f"batch: seq {t.seq_len}, global {t.global_batch}, micro {t.micro_batch}, "
          f"{est.pipeline['microbatches']} micro-batches per step; AC {m.activation_checkpointing}, "
          f"float8 {m.float8}, compile {plan.compile}"
          f"{f'; {t.mtp_layers} MTP module(s) on the last stage' if t.mtp_layers else ''}")
    if plan.stack != MESHPLAN:
        print(f"stack: {plan.stack}, priced as that stack runs the layout ({'; '.join(STACKS[plan.stack].sources)})")
    print(f"\nstep time      {est.step_time_s:10.4f} s")
    print(f"tokens/s/GPU   {est.tokens_per_s_per_gpu:10.1f}")
    print(f"MFU / HFU      {est.mfu:10.1%} / {est.hfu:.1%}  (against the {est.mfu_peak} peak)")
    if est.mfu_fp8 is not None:
        print(f"MFU (fp8 peak) {est.mfu_fp8:10.1%}")
    band = band_of(plan, est)
    print(f"step time band {band.low_s:10.4f} .. {band.high_s:.4f} s  (out-of-sample errors of the "
          f"{len(band.nearest)} nearest published runs; nearest at distance {band.nearest[0]['distance']:g})")
    print(f"extrapolated   {'YES' if band.extrapolated else 'no':>10}  {band.extrapolation}")
    fit = "fits" if est.fits else "DOES NOT FIT"
    print(f"peak memory    {est.peak_memory_gib:10.2f} GiB of {est.usable_memory_gib:.1f} usable ({fit})")
    print(f"  allocated {est.allocated_peak_gib:.2f} GiB (tensors), reserved {est.reserved_peak_gib:.2f} GiB "
          f"(+ allocator slack), + {est.context_gib:.2f} GiB context")
    print("\ntime per step (s):")
    for k, v in est.time_s.items():
        print(f"  {k:<16} {v:10.4f}  {v / est.step_time_s:6.1%}")
    print("memory on the peak rank (GiB):")
    for k, v in est.memory_gib.items():
        print(f"  {k:<16} {v:10.3f}")
    if est.moe:
        _print_moe(est.moe, plan.parallel.ep_dispatch, bool(plan.parallel.ep_overlap),
                   bool(plan.parallel.shared_expert_overlap))
    if est.placement:
        print("placement: " + ", ".join(f"{k} -> {v}" for k, v in est.placement.items()))


def _print_moe(moe: dict, dispatch: str, overlap: bool, shared_overlap: bool = False) -> None:
    print(f"experts on the peak-time rank: ep {moe['ep']}, {moe['local_experts']} local experts, "
          f"{moe['tokens_per_local_expert']:.0f} tokens each per micro-batch at imbalance {moe['imbalance']:g}, "
          f"{moe['moe_layers']} MoE layers")
    print(f"  expert compute   {moe['expert_compute_s']:10.4f} s  (grouped GEMMs, forward and backward)")
    print(f"  dispatch+combine {moe['ep_comm_issued_s']:10.4f} s issued, {moe['ep_comm_exposed_s']:.4f} s exposed"
          f"{' (DeepEP: once per destination node)' if dispatch == 'deepep' else ''}"
          f"{' (EP overlap: under another micro-batch, but in its unpaired passes)' if overlap else ''}"
          f"{' (shared-expert overlap: beside the shared experts)' if shared_overlap else ''}")
    print(f"  routed experts   {moe['routed_state_gib']:10.3f} GiB of states (params, grads, AdamW's moments: "
          f"{moe['routed_state_bytes_per_param']:g} B each)")


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="meshplan estimate", description="Estimate step time, throughput, MFU and memory of a plan.")
    ap.add_argument("--plan", required=True, help="plan file (YAML)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the estimate contract)")
    return ap


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    plan = load_plan(args.plan)
    profile = load_profile(plan.cluster)
    notes: list[str] = []
    if plan.is_complete():
        check_consistency(plan)
        check_backend_rules(plan, profile_backend(profile.provenance))  # what the planner prunes on this profile
        check_against_profile(plan, profile)
        notes = normalise_moot_fields(plan)
        est = estimate_plan(plan, profile)
    elif plan.stack != MESHPLAN:
        # The search fills 'auto' fields with meshplan-runtime layouts only (planner/space.py): name what is left.
        raise InputError("stack", f"{plan.stack} plans are priced complete; set {', '.join(plan.auto_fields())} "
                                  f"(still auto), or use stack {MESHPLAN} to have them chosen")
    else:
        plan, est = fill_auto(plan, profile)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        json.dump({**est.to_json(plan), **band_of(plan, est).to_json(), "notes": notes}, sys.stdout, indent=2)
        print()
    else:
        _print_breakdown(plan, est)
    return 0
