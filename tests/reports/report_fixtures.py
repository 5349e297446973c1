"""Helpers for the report tests: small complete plans (fast to estimate) and a synthetic planner search."""

from __future__ import annotations

import copy

import pandas as pd

from meshplan.cost_models.estimate import estimate_plan
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import Plan, plan_from_dict

BASE = {
    "model": "llama3-8b", "cluster": "h100-80g-dgx", "gpus": 64,
    "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "dtype": "bf16"},
    "parallel": {"dp_replicate": 1, "dp_shard": 4, "tp": 4, "sequence_parallel": True, "async_tp": False,
                 "pp": 4, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "cp": 1},
    "memory": {"activation_checkpointing": "selective", "float8": False, "reshard_after_forward": True},
    "compile": False,
}


def plan_dict(**parallel) -> dict:
    d = copy.deepcopy(BASE)
    d["parallel"].update(parallel)
    return d


def make_plan(**parallel) -> Plan:
    return plan_from_dict(plan_dict(**parallel))


def candidates_frame() -> pd.DataFrame:
    """A small planner search over TP / PP / AC, flattened the way the planner writes it."""
    rows = []
    prof = load_profile("h100-80g-dgx")
    for tp, pp, ac in [(1, 1, "none"), (2, 2, "none"), (4, 4, "selective"), (4, 2, "full"), (8, 1, "selective"),
                       (2, 4, "full"), (8, 2, "none"), (1, 4, "selective")]:
        d = plan_dict(tp=tp, pp=pp, dp_shard=64 // (tp * pp), sequence_parallel=tp > 1)
        d["memory"]["activation_checkpointing"] = ac
        est = estimate_plan(plan_from_dict(d), prof)
        row = {f"{s}.{k}": v for s in ("training", "parallel", "memory") for k, v in d[s].items()}
        row.update(model=d["model"], cluster=d["cluster"], gpus=d["gpus"], step_time_s=est.step_time_s,
                   tokens_per_s_per_gpu=est.tokens_per_s_per_gpu, mfu=est.mfu, hfu=est.hfu,
                   peak_memory_gib=est.peak_memory_gib, fits=est.fits)
        row.update({f"time_s.{k}": v for k, v in est.time_s.items()})
        row.update({f"memory_gib.{k}": v for k, v in est.memory_gib.items()})
        rows.append(row)
    frame = pd.DataFrame(rows)
    frame.loc[0, "fits"] = False  # make sure the search has an infeasible point
    return frame
