"""A plan's layout as one compact string, the same in the planner's table, its candidates CSV and
the reports, e.g. `fsdp16·tp4·pp4 I1F1B v4 mb1 SAC(qkv,att,fi) fp8 compile aTP`.

Legend (LEGEND_ENTRIES): parallel degrees joined by `·` (ddp: replicas, fsdp: shards, hsdp: replicas x
shards, cp, tp, pp, then ep, which folds into the others; `1gpu` when there are none), the pipeline schedule and its virtual stages,
`split` for an explicit stage split, the micro-batch, then the knobs that are on."""

from __future__ import annotations

import re

from meshplan.specs.plan import DEFAULT_SAC_OPS, MESH_DIMS, Plan
from meshplan.specs.rules import MEGATRON_CORE, MEGATRON_DEFAULT_RECOMPUTE

SCHEDULE_ABBREV = {"GPipe": "GPipe", "1F1B": "1F1B", "Interleaved1F1B": "I1F1B", "LoopedBFS": "LBFS",
                   "InterleavedZeroBubble": "IZB", "ZBVZeroBubble": "ZBV", "DualPipeV": "DPV"}
OP_ABBREV = {"qkv": "qkv", "attention": "att", "attn_out": "ao", "ffn_in": "fi", "ffn_out": "fo"}
# (a regex matching a label's word, the legend's entry), in the order a label writes them; a table's
# legend lists the entries its rows use (cp, tp, pp, mb, fp8 and compile explain themselves).
LEGEND_ENTRIES = (
    (r"ep\d", "epN expert parallel, folded into fsdp x cp x tp"), (r"ddp\d", "ddpN replicas"), (r"fsdp\d", "fsdpN shards"), (r"hsdp\d", "hsdpRxS replicas x shards"),
    (r"I1F1B", "I1F1B Interleaved1F1B"), (r"LBFS", "LBFS LoopedBFS"), (r"IZB", "IZB InterleavedZeroBubble"),
    (r"ZBV", "ZBV ZBVZeroBubble"), (r"DPV", "DPV DualPipeV"), (r"v\d+", "vN virtual stages"),
    (r"split", "split uneven pp_layers"), (r"AC", "AC full AC"),
    (r"SAC\(", "SAC(saved op kinds: att attention, ao attn_out, fi ffn_in, fo ffn_out)"),
    (r"RC\(", "RC(Megatron-Core's recomputed modules)"),
    (r"a2aO", "a2aO all-to-alls overlapped (Megatron-Core's EP overlap)"),
    (r"shO", "shO shared experts beside the all-to-alls (Megatron-Core's shared-expert overlap)"),
    (r"aTP", "aTP async TP"), (r"noSP", "noSP TP without SP"), (r"keep", "keep no reshard after forward"),
    (r"order", "order mesh order, outer to inner"),
)


def legend(labels: list[str]) -> str:
    """The legend entries for the words these labels use."""
    words = {w for label in labels for part in label.split() for w in part.split("·")}
    used = [entry for pattern, entry in LEGEND_ENTRIES if any(re.fullmatch(pattern + ".*", w) for w in words)]
    return "layout: " + "; ".join(used)


def _degrees(plan: Plan) -> list[str]:
    p = plan.parallel
    out = []
    if p.dp_replicate > 1 and p.dp_shard > 1:
        out.append(f"hsdp{p.dp_replicate}x{p.dp_shard}")
    elif p.dp_shard > 1:
        out.append(f"fsdp{p.dp_shard}")
    elif p.dp_replicate > 1:
        out.append(f"ddp{p.dp_replicate}")
    out += [f"{name}{getattr(p, name)}" for name in ("cp", "tp", "pp") if getattr(p, name) > 1]
    if p.ep not in (1, "auto"):
        out.append(f"ep{p.ep}")  # folded into the degrees before it: it adds no GPUs
    return out or ["1gpu"]


def _ac(plan: Plan) -> str:
    m = plan.memory
    if m.activation_checkpointing == "full":
        return "AC"
    if m.activation_checkpointing == "selective" and plan.stack == MEGATRON_CORE:
        return "RC(" + ",".join(m.recompute_modules or MEGATRON_DEFAULT_RECOMPUTE) + ")"
    if m.activation_checkpointing == "selective":
        ops = DEFAULT_SAC_OPS if m.sac_ops is None else m.sac_ops
        return "SAC(" + ",".join(OP_ABBREV.get(k, k) for k in ops) + ")"
    return ""


def plan_label(plan: Plan) -> str:
    """The compact layout string of a complete plan (see the module doc and LEGEND)."""
    p, m = plan.parallel, plan.memory
    parts = ["·".join(_degrees(plan))]
    if p.pp > 1:
        parts.append(SCHEDULE_ABBREV.get(p.pp_schedule, p.pp_schedule) + (f" v{p.pp_virtual_stages}"
                                                                         if p.pp_virtual_stages > 1 else ""))
        if p.pp_layers:
            parts.append("split")  # the layers per stage: parallel.pp_layers in the plan and the CSV
    parts.append(f"mb{plan.training.micro_batch}")
    flags = [_ac(plan), "fp8" if m.float8 else "", "compile" if plan.compile else "",
             "a2aO" if p.ep_overlap else "", "shO" if p.shared_expert_overlap else "",
             "aTP" if p.async_tp and p.tp > 1 else "",
             "noSP" if p.tp > 1 and not p.sequence_parallel else "",
             "keep" if p.dp_shard > 1 and p.pp == 1 and not m.reshard_after_forward else ""]
    parts += [f for f in flags if f]
    order = [d for d in (plan.mesh_order or MESH_DIMS) if getattr(p, d) > 1]
    if order != [d for d in MESH_DIMS if getattr(p, d) > 1]:
        parts.append("order " + ">".join(order))
    return " ".join(parts)
