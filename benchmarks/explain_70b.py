"""The 70B@256 pick explained (issue 16, item 7): the planner's pick against TorchTitan's layout, term by term.

    python benchmarks/explain_70b.py [--json PATH]

Column `pick` is what `meshplan plan --model llama70b --gpus 256` picks (the default profile, h100-80g-dgx,
700 W), searched in-process; the columns `TT 2D` and `TT 2D+aTP` are TorchTitan's Table 4 (Llama 3.1 70B,
256 H100s, FSDP 32 x TP 8, torch.compile + float8, full AC, local batch 16, seq 8192; without and with async
TP, measured 829 and 876 tok/s/GPU on 500 W Grand Teton H100s), built as `meshplan validate` builds them.
All three are estimated on both profiles, h100-80g-dgx (700 W) and h100-96g-gt (the 500 W machine TorchTitan
measured on).

Each time term is a share of the step on the critical rank; the summed terms add up to the step time. Rows
that start with `.` are not summed: what was issued and what the model hides under compute, per collective,
and the matmuls by kind. Each term names the constants that drive it and their status on that profile, read
from the registry behind `meshplan validate --constants` (meshplan/cost_models/constants.py) and from the
profile's provenance:
  F fitted (on this profile's published rows)  S sourced  D at its physical default  C counted (no constant)
  T transferred (fitted on another profile, applied here unvalidated)  U unsourced (no source, no fit)
The verdict names the terms in which the pick beats the faster TorchTitan row by at least MIN_SHARE of the
pick's step; a deciding term driven by a T or U constant is not trusted. For each such constant that the
registry gives a physical default, both plans are estimated again with it there: does the pick still win?
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from meshplan.commands.plan import build_plan_mapping, parser as plan_parser
from meshplan.cost_models import constants
from meshplan.cost_models.band import band_of
from meshplan.cost_models.estimate import (Estimate, compose_step, compute_windows, data_parallel_comm, estimate_plan,
                                           plan_order, step_parts)
from meshplan.cost_models.layout import Layout, layout_of, runtime_paths
from meshplan.cost_models.memory import fragmentation_field
from meshplan.cost_models.pipeline import stage_rank
from meshplan.cost_models.published import PublishedRow, torchtitan_rows
from meshplan.planner.search import search
from meshplan.profiles.registry import load_profile
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import Plan, plan_from_dict

PROFILES = ("h100-80g-dgx", "h100-96g-gt")
PICK_ARGV = ["--model", "llama70b", "--gpus", "256"]  # as `meshplan plan` is run in the issue
TABLE = "TorchTitan H100 (Table 4)"
PICK = "pick"
MIN_SHARE = 0.01  # a term decides when the pick saves at least this share of its own step on it
TRUSTED = ("F", "S", "D", "C")
STATUS_WORDS = {"F": "fitted", "S": "sourced", "D": "physical default", "C": "counted (no constant)",
                "T": "transferred", "U": "unsourced"}
WIDTH = 120

# The summed time terms, in the order printed. The compute of a step is split by kind (block_compute).
TIME_TERMS = ("matmul", "attention", "memory-bound", "float8 casts", "head + loss", "embedding", "host dispatch",
              "recompute", "TP comm exposed", "CP comm exposed", "pipeline bubble", "FSDP comm exposed",
              "DP comm exposed", "optimizer", "step overhead")


@dataclass
class Driver:
    """One constant behind a term, on one profile."""

    name: str
    value: str
    status: str  # a key of STATUS_WORDS
    note: str


@dataclass
class Column:
    name: str
    plan: Plan
    est: Estimate
    terms: dict[str, float]  # summed: they add up to est.step_time_s
    info: dict[str, float]  # not summed: issued / hidden comm, matmuls by kind
    memory: dict[str, float]  # GiB on the peak rank; they add up to est.peak_memory_gib
    drivers: dict[str, list[str]]  # term -> constant names
    published_tps: float | None = None
    published_gib: float | None = None
    band: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)  # Layout fields the plan cannot say (TorchTitan's)


# -- constants and their status -------------------------------------------------------------------------


def _names(text: str, leaf: str) -> bool:
    """Does a provenance text name this field (reduce_scatter as reduce_scatter, reduce-scatter or reduce scatter)?"""
    return any(form in text for form in (leaf, leaf.replace("_", "-"), leaf.replace("_", " ")))


def provenance(prof: ClusterProfile, path: str, strict: bool) -> str | None:
    """The profile's provenance for `path`: its own entry, a sibling entry that names it, else an enclosing
    entry (which, when strict, must name it too)."""
    parts = path.split(".")
    leaf, parent = parts[-1], ".".join(parts[:-1])
    if path in prof.provenance:
        return str(prof.provenance[path])
    for key, text in prof.provenance.items():
        if key.rsplit(".", 1)[0] == parent and "." in key and _names(str(text), leaf):
            return str(text)
    for i in range(len(parts) - 1, 0, -1):
        text = prof.provenance.get(".".join(parts[:i]))
        if text is not None and (not strict or _names(str(text), leaf)):
            return str(text)
    return None


def _profile_value(prof: ClusterProfile, path: str) -> Any:
    obj: Any = prof
    for part in path.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return f"{len(value)} points"
    if hasattr(value, "bus_bandwidth_gbs"):
        return f"{value.bus_bandwidth_gbs:g} GB/s"
    return str(value)


def driver(name: str, prof: ClusterProfile) -> Driver:
    """Value and status of a constant on a profile: code constants (model.*), registry constants, profile data."""
    if name.startswith("model."):
        f = next(f for f in fields(constants.ModelConstants) if f.name == name[len("model."):])
        value = getattr(constants.MODEL, f.name)
        status = "D" if value == f.metadata["physical"] else "S"
        return Driver(name, _show(float(value)), status, f.metadata["source"])
    registry = {c.name: c for c in constants.PROFILE_CONSTANTS}
    if name in registry:
        return _registry_driver(registry[name], prof)
    if name.startswith("overheads."):  # host pricing: 0 means hidden, its physical default on GPUs
        value = _profile_value(prof, name)
        return Driver(name, _show(value), "D" if value == 0 else "U", provenance(prof, name, True) or "")
    note = provenance(prof, name, strict=False)
    return Driver(name, _show(_profile_value(prof, name)), "S" if note else "U",
                  note or "no provenance in the profile")


def _registry_driver(c: constants.ProfileConstant, prof: ClusterProfile) -> Driver:
    value = c.get(prof)
    here = [k for k in c.fitted_on if k != constants.EVERY_GPU and prof.name in constants.fitted_profiles(k)]
    if here:  # fitted for this profile, alone or with others of its part (constants.H100_CLASS)
        return Driver(c.name, _show(value), "F", "fitted on " + ", ".join(c.fitted_on[here[0]]))
    if value == c.physical:
        return Driver(c.name, _show(value), "D", c.source)
    note = provenance(prof, c.name, strict=True)
    if c.fitted_on:
        where = ", ".join(c.fitted_on)
        if note:
            return Driver(c.name, _show(value), "T", f"fitted on {where}, not on {prof.name}; profile says: {note}")
        return Driver(c.name, _show(value), "U", f"fitted on {where} only; {prof.name} gives no source ({c.source})")
    return Driver(c.name, _show(value), "U" if "unsourced" in c.source.lower() else "S", c.source)


# -- what drives each term ------------------------------------------------------------------------------


def _level(est: Estimate, prof: ClusterProfile, dims: tuple[str, ...]) -> str:
    """The link level a group over `dims` runs on: the cluster's if any of them leaves the node."""
    levels = {est.placement[d] for d in dims if d in est.placement}
    return prof.cluster_level() if prof.cluster_level() in levels else prof.node_level()


def term_drivers(lay: Layout, est: Estimate, prof: ClusterProfile) -> dict[str, list[str]]:
    dev = prof.device
    mm = "fp8" if lay.float8 and "fp8" in dev.peak_tflops else lay.dtype
    rate = ["device.matmul.points"] if dev.matmul.points else [f"device.peak_tflops.{mm}",
                                                                f"device.matmul.max_fraction.{mm}",
                                                                "device.matmul.half_dim"]
    matmul = rate + ["device.sustained_fraction", "overheads.kernel_efficiency"]
    head_rate = ["device.matmul.points"] if dev.matmul.points else [f"device.peak_tflops.{lay.dtype}",
                                                                     f"device.matmul.max_fraction.{lay.dtype}",
                                                                     "device.matmul.half_dim"]
    attention = ["device.attention.points", "device.sustained_fraction", "device.attention.backward_ratio",
                 "model.attention_backward_factor", "overheads.kernel_efficiency"]
    hbm = ["device.memory_bandwidth_gbs", "device.memory_bound_efficiency"]
    fused = ["overheads.compile_speedup"] if lay.compile else []
    elementwise = hbm + ["model.norm_passes", "model.residual_passes", "model.rope_passes", "model.layout_passes",
                         "model.activation_passes"] + fused
    host = ["overheads.op_dispatch_s", "overheads.python_dispatch_s", "overheads.collective_sync_s"]
    tp_kinds = ("all_gather", "reduce_scatter") if lay.sp else ("all_reduce",)
    tp_level, cp_level = _level(est, prof, ("tp",)), _level(est, prof, ("cp",))
    fsdp_level = _level(est, prof, ("dp_shard", "cp"))
    return {
        "matmul": matmul,
        "attention": attention,
        "memory-bound": elementwise,
        "float8 casts": hbm + ["model.float8_cast_passes"] + fused,
        "head + loss": head_rate + ["device.sustained_fraction", "model.loss_passes"] + hbm,
        "embedding": hbm,
        "host dispatch": host,
        "recompute": list(dict.fromkeys(matmul + attention + elementwise)),
        "TP comm exposed": [f"collectives.{tp_level}.{k}" for k in tp_kinds]
        + (["overheads.tp_async_overlap"] if lay.async_tp else []),
        "CP comm exposed": [f"collectives.{cp_level}.all_gather", "overheads.cp_overlap"],
        "pipeline bubble": [f"collectives.{_level(est, prof, ('pp',))}.send_recv"] if lay.pp > 1 else [],
        "FSDP comm exposed": [f"collectives.{fsdp_level}.all_gather", f"collectives.{fsdp_level}.reduce_scatter",
                              "overheads.fsdp_overlap", "overheads.comm_compute_slowdown"],
        "DP comm exposed": [f"collectives.{_level(est, prof, ('dp_replicate',))}.all_reduce",
                            "overheads.fsdp_overlap", "overheads.comm_compute_slowdown"],
        "optimizer": ["model.adamw_bytes_per_param"] + hbm + host,
        "step overhead": ["overheads.step_overhead_s"],
        "overhead (memory)": [f"overheads.{fragmentation_field(lay, prof.overheads)}", "overheads.context_gib"],
    }


# -- one column: an estimate split into its terms --------------------------------------------------------


def column(name: str, plan: Plan, prof: ClusterProfile, row: PublishedRow | None = None) -> Column:
    overrides = dict(row.layout_overrides) if row else {}
    est = estimate_plan(plan, prof, **overrides)
    lay = runtime_paths(layout_of(plan), prof)
    lay = replace(lay, **overrides) if overrides else lay
    parts = step_parts(lay, prof, plan_order(plan))
    crit = compose_step(lay, prof, parts, max(parts.busy))[1]
    stages = [s for s in range(lay.n_stages) if stage_rank(s, lay.pp, lay.schedule) == crit]
    per_block = lay.n_micro * sum(lay.stage_layers[s] for s in stages)  # block passes on the critical rank
    bt, k, m, t = parts.bt, parts.bt.kinds, lay.n_micro, est.time_s
    terms = {
        "matmul": per_block * 3 * k.matmul_forward,
        "attention": per_block * (k.attention_forward + k.attention_backward),
        "memory-bound": per_block * (k.elementwise_forward + k.elementwise_backward),
        "float8 casts": per_block * k.float8_cast,
        "head + loss": m * (parts.head.forward + parts.head.backward) if lay.n_stages - 1 in stages else 0.0,
        "embedding": m * parts.emb if 0 in stages else 0.0,
        "host dispatch": per_block * bt.host,
        "recompute": t["recompute"], "TP comm exposed": t["tp_comm"], "CP comm exposed": t["cp_comm"],
        "pipeline bubble": t["pipeline_bubble"], "FSDP comm exposed": t["fsdp_comm"],
        "DP comm exposed": t["dp_comm"], "optimizer": t["optimizer"], "step overhead": t["overhead"],
    }
    dp = data_parallel_comm(lay, prof, parts.spans, crit, compute_windows(lay, parts, crit))
    info = {f".matmul {kind}": per_block * 3 * s for kind, s in k.matmul_by_kind.items()}
    info.update({
        ".TP comm issued": per_block * bt.tp_comm_issued,
        ".TP hidden by async TP": per_block * (bt.tp_comm_issued - bt.tp_comm),
        ".CP comm issued": per_block * bt.cp_comm_issued,
        ".CP hidden under attention": per_block * (bt.cp_comm_issued - bt.cp_comm),
        ".FSDP all-gather issued": dp.all_gather + dp.tail_all_gather,
        ".FSDP reduce-scatter issued": dp.reduce_scatter + dp.tail_reduce_scatter,
        ".DP all-reduce issued": dp.all_reduce + dp.tail_all_reduce,
        ".FSDP/DP hidden under compute": dp.hidden,
        ".FSDP/DP issued beside compute": dp.total,  # the first gather and the last reduction apart
        ".FSDP/DP at the node rate": dp.at_node_rate,  # their kernels' work (forms.py kernel_work)
        ".FSDP/DP contention": dp.contention,  # the compute slowed beside what hides (comm_compute_slowdown)
        ".FSDP copies on the compute stream": dp.copies,  # FSDP2's copy-out and copy-in (forms.py fsdp_copies)
        ".PP p2p per transfer": est.pipeline.get("p2p_s", 0.0),
    })
    plan_here = plan.copy(cluster=prof.name) if plan.cluster != prof.name else plan
    band = band_of(plan_here, est).to_json()
    return Column(name, plan, est, terms, info, dict(est.memory_gib), term_drivers(lay, est, prof),
                  row.published if row else None, row.published_memory_gib if row else None, band, overrides)


def picked_plan() -> Plan:
    """What `meshplan plan --model llama70b --gpus 256` writes, searched in-process as the command does."""
    args = plan_parser().parse_args(PICK_ARGV)
    plan = plan_from_dict(build_plan_mapping(args))
    result = search(plan, load_profile(plan.cluster), top_k=1, jobs=1)
    if result.best is None:
        raise SystemExit("explain_70b: the planner found no plan for llama70b on 256 GPUs")
    return result.best_plan()


def published_rows() -> list[PublishedRow]:
    rows = [r for r in torchtitan_rows() if r.table == TABLE and r.plan is not None]
    if len(rows) != 2:
        raise SystemExit(f"explain_70b: expected 2 rows of {TABLE}, found {len(rows)}")
    return sorted(rows, key=lambda r: r.plan.parallel.async_tp)  # without async TP first


def profile_columns(pick: Plan, rows: list[PublishedRow], prof: ClusterProfile) -> list[Column]:
    cols = [column(PICK, pick.copy(cluster=prof.name), prof)]
    for r in rows:
        name = "TT 2D+aTP" if r.plan.parallel.async_tp else "TT 2D"
        cols.append(column(name, r.plan.copy(cluster=prof.name), prof, r))
    return cols


# -- the verdict ----------------------------------------------------------------------------------------


# A collective term and what its overlap hides: a pick that issues more and has it hidden leans on the overlap.
HIDDEN = {"TP comm exposed": ".TP hidden by async TP", "CP comm exposed": ".CP hidden under attention",
          "FSDP comm exposed": ".FSDP/DP hidden under compute"}


def verdict(cols: list[Column], prof: ClusterProfile) -> dict[str, Any]:
    """Terms where the pick beats the faster published row by >= MIN_SHARE of its step (in exposed time, or in
    what the model hides for it), and what they rest on."""
    pick, ref = cols[0], min(cols[1:], key=lambda c: c.est.step_time_s)
    margin = ref.est.step_time_s - pick.est.step_time_s
    out: dict[str, Any] = {"against": ref.name, "margin_s": margin, "deciding": [], "leans": [], "untrusted": [],
                           "at_physical_default": {}}
    if margin <= 0:
        out["line"] = f"pick not faster than {ref.name} on {prof.name}: nothing to explain"
        return out
    weak_names: list[str] = []
    for term in TIME_TERMS:
        gain = ref.terms[term] - pick.terms[term]
        if gain < MIN_SHARE * pick.est.step_time_s:
            continue
        names = list(dict.fromkeys(pick.drivers[term] + ref.drivers[term]))
        ds = [driver(n, prof) for n in names]
        weak = [d for d in ds if d.status not in TRUSTED]
        weak_names.extend(d.name for d in weak)
        out["deciding"].append({"term": term, "gain_s": gain, "alone_decides": gain > margin,
                                "constants": {d.name: d.status for d in ds},
                                "untrusted_constants": [f"{d.name} {STATUS_WORDS[d.status]}" for d in weak]})
        if weak:
            out["untrusted"].append(term)
    for term, key in HIDDEN.items():
        extra = pick.info[key] - ref.info[key]
        if extra < MIN_SHARE * pick.est.step_time_s:
            continue
        ds = [driver(n, prof) for n in dict.fromkeys(pick.drivers[term] + ref.drivers[term])]
        weak = [d for d in ds if d.status not in TRUSTED]
        weak_names.extend(d.name for d in weak)
        out["leans"].append({"term": term, "extra_hidden_s": extra, "alone_decides": extra > margin,
                             "constants": {d.name: d.status for d in ds},
                             "untrusted_constants": [f"{d.name} {STATUS_WORDS[d.status]}" for d in weak]})
        if weak:
            out["untrusted"].append(f"{term} (hidden)")
    for name in dict.fromkeys(weak_names):
        test = at_physical_default(name, cols[0], ref, prof)
        out["at_physical_default"][name] = test
    out["line"] = ("pick NOT trusted: " + ", ".join(out["untrusted"]) if out["untrusted"]
                   else "pick rests on sourced terms")
    return out


def at_physical_default(name: str, pick: Column, ref: Column, prof: ClusterProfile) -> dict[str, float] | None:
    """Both plans estimated again with a registry constant at its physical default; None if it has none."""
    c = next((c for c in constants.PROFILE_CONSTANTS if c.name == name), None)
    if c is None:
        return None
    varied = c.set(prof, c.physical)
    p = estimate_plan(pick.plan, varied, **pick.overrides).step_time_s
    r = estimate_plan(ref.plan, varied, **ref.overrides).step_time_s
    return {"physical": c.physical, "pick_step_s": p, "published_step_s": r}


# -- printing -------------------------------------------------------------------------------------------

LABEL, CELL = 30, 11


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _row(label: str, values: list[str]) -> str:
    return f"{label:<{LABEL}}" + "".join(f"{v:>{CELL}}" for v in values)


def _codes(names: list[str], prof: ClusterProfile) -> str:
    return " ".join(f"{n.split('.', 1)[-1]}[{driver(n, prof).status}]" for n in names)


def _wrapped(text: str, indent: int) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=" " * indent, subsequent_indent=" " * (indent + 2))


def print_profile(cols: list[Column], prof: ClusterProfile, v: dict[str, Any]) -> None:
    print("=" * WIDTH)
    print(f"{prof.name}: {prof.device.name}")
    print("=" * WIDTH)
    for c in cols:
        p, t, mem = c.plan.parallel, c.plan.training, c.plan.memory
        sac = f"({','.join(mem.sac_ops)})" if mem.activation_checkpointing == "selective" and isinstance(
            mem.sac_ops, (list, tuple)) else ""
        knobs = [k for k, on in (("float8", mem.float8), ("async TP", p.async_tp), ("compile", c.plan.compile)) if on]
        print(f"{c.name:<10} fsdp {p.dp_shard} x rep {p.dp_replicate} x cp {p.cp} x tp {p.tp} x pp {p.pp}; "
              f"micro {t.micro_batch}; AC {mem.activation_checkpointing}{sac}; {', '.join(knobs)}")
    print("\n" + _row("", [c.name for c in cols] + ["gain"]))
    print("-" * WIDTH)
    ests = [c.est for c in cols]
    pub = [c.published_tps for c in cols]
    for label, vals, spec in (
            ("step time s", [e.step_time_s for e in ests], ".3f"),
            ("tokens/s/GPU", [e.tokens_per_s_per_gpu for e in ests], ",.0f"),
            ("MFU (bf16 dense peak)", [e.mfu for e in ests], ".1%"),
            ("MFU (fp8 dense peak)", [e.mfu_fp8 for e in ests], ".1%"),
            ("step band low s", [c.band["step_time_band_s"][0] for c in cols], ".3f"),
            ("step band high s", [c.band["step_time_band_s"][1] for c in cols], ".3f"),
            ("measured tok/s/GPU (500 W)", pub, ",.0f")):
        print(_row(label, [_fmt(x, spec) for x in vals]))
    if prof.name == "h100-96g-gt":  # the machine TorchTitan measured on
        errs = [None if p is None else e.tokens_per_s_per_gpu / p - 1 for e, p in zip(ests, pub)]
        print(_row("estimate error vs measured", [_fmt(x, "+.1%") for x in errs]))
    print(_row("extrapolated", ["YES" if c.band["extrapolated"] else "no" for c in cols]))
    _print_time(cols, prof, v["against"])
    _print_memory(cols, prof)


def _print_time(cols: list[Column], prof: ClusterProfile, ref_name: str) -> None:
    ref = next(c for c in cols if c.name == ref_name)
    pick = cols[0]
    print(f"\ntime per step on the critical rank, s (gain = {ref_name} - pick; '.' rows are not summed;")
    print("the line under a term: the constants that drive it [status on this profile])")
    zero = []
    for term in TIME_TERMS:
        vals = [c.terms[term] for c in cols]
        if not any(vals):
            zero.append(term)
            continue
        print(_row(term, [f"{x:.3f}" for x in vals] + [f"{ref.terms[term] - pick.terms[term]:+.3f}"]))
        names = list(dict.fromkeys(pick.drivers[term] + ref.drivers[term]))
        for line in _wrapped(_codes(names, prof), 4):
            print(line)
        for key in [k for k in pick.info if _info_of(k) == term]:
            ivals = [c.info.get(key, 0.0) for c in cols]
            if any(ivals):
                print(_row("  " + key, [f"{x:.3f}" for x in ivals]))
    print(_row("sum of the terms = step", [f"{sum(c.terms.values()):.3f}" for c in cols]))
    if zero:
        print(f"zero in every column: {', '.join(zero)}")


INFO_TERMS = {".matmul": "matmul", ".TP": "TP comm exposed", ".CP": "CP comm exposed",
              ".FSDP all": "FSDP comm exposed", ".FSDP reduce": "FSDP comm exposed", ".FSDP/DP": "FSDP comm exposed",
              ".FSDP copies": "FSDP comm exposed",
              ".DP": "DP comm exposed", ".PP": "pipeline bubble"}


def _info_of(key: str) -> str:
    return next(t for prefix, t in INFO_TERMS.items() if key.startswith(prefix))


def _print_memory(cols: list[Column], prof: ClusterProfile) -> None:
    print("\nmemory on the peak rank, GiB (the terms sum to the peak)")
    for k in dict.fromkeys(k for c in cols for k in c.memory):
        print(_row(k, [f"{c.memory.get(k, 0.0):.2f}" for c in cols]))
        if k == "overhead":
            print(_wrapped(_codes(cols[0].drivers["overhead (memory)"], prof), 4)[0])
    print("    other memory terms: bytes counted from the plan (states, buffers, activations.py tensor inventory) [C]")
    print(_row("peak", [f"{c.est.peak_memory_gib:.2f}" for c in cols]))
    print(_row("usable", [f"{c.est.usable_memory_gib:.1f}" for c in cols]))
    print(_row("measured GiB (500 W machine)", [_fmt(c.published_gib, ".1f") for c in cols]))
    if prof.name == "h100-96g-gt":
        errs = [None if c.published_gib is None else c.est.peak_memory_gib / c.published_gib - 1 for c in cols]
        print(_row("memory error vs measured", [_fmt(x, "+.1%") for x in errs]))


def print_constants(names: list[str], profs: list[ClusterProfile]) -> None:
    print("=" * WIDTH)
    print("constants behind the terms: value [status] on " + ", ".join(p.name for p in profs) + "; then the source")
    print("=" * WIDTH)
    for n in names:
        ds = [driver(n, p) for p in profs]
        print(f"{n:<40}" + "".join(f"{d.value:>16} [{d.status}]" for d in ds))
        notes = list(dict.fromkeys(d.note for d in ds if d.note))
        for d, p in zip(ds, profs):
            if d.note and (len(notes) > 1 or d is ds[0]):
                head = f"{p.name}: " if len(notes) > 1 else ""
                for line in textwrap.wrap(head + d.note, WIDTH - 6)[:3]:
                    print("      " + line)


def print_verdict(verdicts: dict[str, dict[str, Any]], picks: dict[str, Column]) -> None:
    print("=" * WIDTH)
    print(f"verdict: terms in which the pick beats the faster published row by >= {MIN_SHARE:.0%} of the pick's step")
    print("=" * WIDTH)
    for prof_name, v in verdicts.items():
        pick = picks[prof_name]
        lo, hi = pick.band["step_time_band_s"]
        print(f"{prof_name}: pick {pick.est.step_time_s:.3f} s (band {lo:.3f}-{hi:.3f} s), extrapolated "
              f"{'YES' if pick.band['extrapolated'] else 'no'}; {v['against']} {v['margin_s']:+.3f} s slower")
        for line in _wrapped("extrapolation: " + pick.band["extrapolation"], 4):
            print(line)
        for d in v["deciding"]:
            rest = ", ".join(d["untrusted_constants"]) or "sourced, fitted or counted constants only"
            alone = " (alone more than the margin)" if d["alone_decides"] else ""
            for i, line in enumerate(_wrapped(f"{d['term']}: saves {d['gain_s']:.3f} s{alone}; rests on {rest}", 2)):
                print(("- " + line[2:]) if i == 0 else line)
        for d in v["leans"]:
            rest = ", ".join(d["untrusted_constants"]) or "sourced, fitted or counted constants only"
            text = (f"{d['term']}: the pick has {d['extra_hidden_s']:.3f} s more hidden under compute than "
                    f"{v['against']}; the hiding rests on {rest}")
            for i, line in enumerate(_wrapped(text, 2)):
                print(("- " + line[2:]) if i == 0 else line)
        for name, t in v["at_physical_default"].items():
            if t is None:
                print(f"  {name}: no physical default in the registry; not varied")
                continue
            still = "still faster" if t["pick_step_s"] < t["published_step_s"] else "NO LONGER faster"
            print(f"  {name} at its physical default {t['physical']:g}: pick {t['pick_step_s']:.3f} s vs "
                  f"{v['against']} {t['published_step_s']:.3f} s: pick {still}")
        print(f"  => {v['line']}")


# -- the whole ------------------------------------------------------------------------------------------


def explain() -> dict[str, Any]:
    pick = picked_plan()
    rows = published_rows()
    profs = [load_profile(n) for n in PROFILES]
    cols = {p.name: profile_columns(pick, rows, p) for p in profs}
    verdicts = {p.name: verdict(cols[p.name], p) for p in profs}
    return {"pick": pick, "profiles": profs, "columns": cols, "verdicts": verdicts}


def to_json(result: dict[str, Any]) -> dict[str, Any]:
    profs = result["profiles"]
    names = _constant_names(result)
    out: dict[str, Any] = {"pick_plan": result["pick"].to_dict(), "min_share": MIN_SHARE, "profiles": {},
                           "constants": {n: {p.name: vars(driver(n, p)) for p in profs} for n in names}}
    for p in profs:
        out["profiles"][p.name] = {
            "columns": {c.name: {"plan": c.plan.to_dict(), "step_time_s": c.est.step_time_s,
                                 "tokens_per_s_per_gpu": c.est.tokens_per_s_per_gpu, "mfu": c.est.mfu,
                                 "mfu_peak": c.est.mfu_peak, "mfu_fp8": c.est.mfu_fp8,
                                 "peak_memory_gib": c.est.peak_memory_gib, "fits": c.est.fits,
                                 "published_tokens_per_s_per_gpu": c.published_tps,
                                 "published_memory_gib": c.published_gib, "layout_overrides": c.overrides,
                                 "time_terms_s": c.terms, "time_info_s": c.info, "memory_gib": c.memory,
                                 "drivers": c.drivers, **c.band}
                        for c in result["columns"][p.name]},
            "verdict": result["verdicts"][p.name]}
    return out


def _constant_names(result: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for cols in result["columns"].values():
        for c in cols:
            for term, ds in c.drivers.items():
                if term in c.terms and not any(x.terms.get(term) for x in cols):
                    continue  # a term zero everywhere: its constants decide nothing
                names.extend(ds)
    return list(dict.fromkeys(names))


def print_all(result: dict[str, Any]) -> None:
    print(textwrap.fill("The 70B@256 pick explained: the planner's pick for `meshplan plan --model llama70b "
                        "--gpus 256` against TorchTitan's Table 4 layout (FSDP 32 x TP 8, compile + float8, full AC), estimated "
                        "term by term on both H100 profiles.", WIDTH))
    print("status: " + ", ".join(f"{k} {w}" for k, w in STATUS_WORDS.items()) + f"; trusted: {' '.join(TRUSTED)}\n")
    for p in result["profiles"]:
        print_profile(result["columns"][p.name], p, result["verdicts"][p.name])
        print()
    print_constants(_constant_names(result), result["profiles"])
    print()
    print_verdict(result["verdicts"], {p.name: result["columns"][p.name][0] for p in result["profiles"]})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The 70B@256 pick against TorchTitan's layout, term by term.")
    ap.add_argument("--json", default=None, metavar="PATH", help="also save the numbers as JSON")
    args = ap.parse_args(argv)
    result = explain()
    print_all(result)
    if args.json:
        path = Path(args.json)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(to_json(result), indent=2, default=str))
        os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
