"""`meshplan plan`: search the parallelism space, write the best plan that fits, show the top K."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from meshplan.commands.argparsing import ArgumentParser
from meshplan.errors import InputError
from meshplan.fields import AUTO
from meshplan.planner.search import SearchResult, search
from meshplan.planner.summary import print_summary, what_would_fit, write_candidates, write_search_counts
from meshplan.planner.workers import DEFAULT_MAX_JOBS
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import plan_from_dict
from meshplan.specs.rules import model_runs_reason

DEFAULT_CLUSTER = "h100-80g-dgx"
SECTIONS = ("training", "parallel", "memory")


def parse_assignment(text: str, flag: str) -> tuple[str, Any]:
    """KEY=VALUE with KEY like parallel.tp or compile; VALUE parsed as a YAML scalar (or list)."""
    if "=" not in text:
        raise InputError(flag, f"must be KEY=VALUE (e.g. parallel.tp=8), got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise InputError(flag, f"{key}: value {raw!r} is not a valid scalar")
    parts = key.split(".")
    if not ((len(parts) == 2 and parts[0] in SECTIONS) or key == "compile"):
        raise InputError(flag, f"unknown field {key!r}; use section.field with section in "
                               f"{', '.join(SECTIONS)} (e.g. parallel.tp), or compile")
    return key, value


def build_plan_mapping(args) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": 1, "model": args.model, "cluster": args.cluster, "gpus": args.gpus,
        # dtype auto: bf16 where the device has a bf16 peak, else fp32 (a CPU profile).
        "training": {"seq_len": args.seq_len or AUTO, "global_batch": args.global_batch or AUTO, "dtype": AUTO},
        "parallel": {"ep": AUTO}, "memory": {}, "compile": AUTO,  # ep: searched for MoE models, 1 for dense
    }
    for text in args.fix:
        key, value = parse_assignment(text, "--fix")
        if key == "compile":
            data["compile"] = value
        else:
            section, name = key.split(".")
            data[section][name] = value
    if "sac_ops" not in data["memory"]:
        data["memory"]["sac_ops"] = AUTO if data["memory"].get("activation_checkpointing", AUTO) in (AUTO, "selective") else None
    return data


def parse_excludes(texts: list[str]) -> dict[str, list]:
    out: dict[str, list] = {}
    for text in texts:
        key, value = parse_assignment(text, "--exclude")
        values = value if isinstance(value, list) else [value]
        out.setdefault(key, []).extend(values)
    return out


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="meshplan plan", description="Search DP/FSDP/HSDP x TP/SP x PP x CP x AC x float8 and "
                        "write the fastest plan that fits in memory.")
    ap.add_argument("--model", required=True, help="model name (meshplan models), model YAML or HF config.json")
    ap.add_argument("--gpus", required=True, type=int, help="world size")
    ap.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"profile name or path (default {DEFAULT_CLUSTER})")
    ap.add_argument("--seq-len", type=int, default=None,
                    help="sequence length (default: the model's context, at most 8192)")
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences per optimizer step (default: 16k tokens per GPU, at most 16M; "
                         "about a second of work per step on a CPU profile)")
    ap.add_argument("--fix", action="append", default=[], metavar="KEY=VALUE",
                    help="pin a plan field, e.g. --fix parallel.tp=8 --fix memory.float8=false (repeatable)")
    ap.add_argument("--exclude", action="append", default=[], metavar="KEY=VALUE",
                    help="leave a value out of the search, e.g. --exclude parallel.pp_schedule=GPipe (repeatable)")
    ap.add_argument("--top", type=int, default=10, help="how many plans to rank and show (default 10)")
    ap.add_argument("--out", default="best.yaml", help="where to write the best plan (default best.yaml)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    ap.add_argument("--wide", action="store_true", help="the table with every field in its own column")
    ap.add_argument("--jobs", type=int, default=None,
                    help=f"processes to search on (default: the CPUs available, at most {DEFAULT_MAX_JOBS}; "
                         "1: no workers)")
    ap.add_argument("--report", default=None, help="also write a report of the search (.html, .md or .csv)")
    return ap


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.gpus < 1:
        raise InputError("--gpus", f"must be >= 1, got {args.gpus}")
    if args.seq_len is not None and args.seq_len < 1:
        raise InputError("--seq-len", f"must be >= 1, got {args.seq_len}")
    if args.global_batch is not None and args.global_batch < 1:
        raise InputError("--global-batch", f"must be >= 1, got {args.global_batch}")
    if args.top < 1:
        raise InputError("--top", f"must be >= 1, got {args.top}")
    if args.jobs is not None and args.jobs < 1:
        raise InputError("--jobs", f"must be >= 1, got {args.jobs}")
    out = Path(args.out)
    if out.suffix not in (".yaml", ".yml"):
        raise InputError("--out", f"must name a .yaml file, got {args.out!r}")
    plan = plan_from_dict(build_plan_mapping(args))
    profile = load_profile(plan.cluster)
    warnings = _version_warnings(profile)
    result = search(plan, profile, top_k=args.top, excludes=parse_excludes(args.exclude), jobs=args.jobs)
    result.warnings.extend(warnings)
    runs = model_runs_reason(plan.model)
    if runs:
        result.warnings.append(f"planned and priced only: `meshplan run` refuses it ({runs})")
    if result.best is None:
        return _nothing_fits(result, plan, profile, args)
    best_plan = result.best_plan()
    best_plan.save(out, estimate=result.best.estimate.summary())
    candidates = write_candidates(result, out)
    write_search_counts(result, out)
    report = None
    if args.report:
        from meshplan.reports.writer import write_report_for_search

        report = write_report_for_search(out, candidates, args.report)
    if args.json:
        json.dump({"best": result.best.estimate.to_json(best_plan), "search": _search_json(result),
                   "files": {"plan": str(out), "candidates": str(candidates), "report": str(report) if report else None}},
                  sys.stdout, indent=2)
        print()
    else:
        print_summary(result, profile, out, candidates, report, wide=args.wide)
    return 0


def _search_json(result: SearchResult) -> dict[str, Any]:
    return {"counts": result.counts(), "search_time_s": result.search_time_s, "assumptions": result.assumptions,
            "warnings": result.warnings, "sac_ilp_check": result.sac_ilp_check,
            "best_not_fitting": [{"step_time_s": n.step_time_s, "peak_memory_gib": n.peak_memory_gib,
                                  "over_by_gib": n.peak_memory_gib - result.usable_memory_gib, "exact": n.exact}
                                 for n in result.non_fitting]}


def _version_warnings(profile) -> list[str]:
    try:
        from meshplan.profiles.versions import check_profile_versions
    except ImportError:
        return []
    return list(check_profile_versions(profile))


def _nothing_fits(result: SearchResult, plan, profile, args) -> int:
    lines = what_would_fit(result, result.base_plan, profile, args.jobs)
    if args.json:
        json.dump({"best": None, "search": _search_json(result), "what_would_fit": lines}, sys.stdout, indent=2)
        print()
    else:
        from meshplan.planner.constraints import NO_FIT

        what = "fits in memory" if result.rejections.get(NO_FIT) else "satisfies the constraints"
        print(f"meshplan plan: no plan {what}; nothing written.", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
    return 2
