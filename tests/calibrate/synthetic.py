"""Synthetic runs for the calibration tests: summary.json files whose "measured" values are the cost
model's own predictions under a known, modified profile, so a correct fit must recover that profile."""

from __future__ import annotations

import json
from pathlib import Path

from meshplan.cost_models.calibrate import with_bus_scale, with_matmul_fraction, with_overhead
from meshplan.cost_models.estimate import estimate_plan
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import plan_from_dict

# (dp_replicate, dp_shard, cp, tp, pp, micro_batch, ac, pp_schedule): DP, FSDP, HSDP, TP, PP, CP and AC.
MESHES = [
    (4, 1, 1, 1, 1, 1, "none", "1F1B"),
    (1, 4, 1, 1, 1, 1, "none", "1F1B"),
    (1, 4, 1, 1, 1, 2, "full", "1F1B"),
    (2, 2, 1, 1, 1, 1, "selective", "1F1B"),
    (1, 2, 1, 2, 1, 1, "none", "1F1B"),
    (2, 1, 1, 2, 1, 2, "none", "1F1B"),
    (1, 2, 1, 1, 2, 1, "none", "1F1B"),
    (1, 1, 1, 1, 4, 1, "full", "GPipe"),
    (1, 2, 2, 1, 1, 1, "none", "1F1B"),
    (1, 1, 2, 2, 1, 1, "selective", "1F1B"),
    (1, 1, 1, 2, 2, 1, "none", "1F1B"),
    (1, 4, 1, 1, 1, 4, "none", "1F1B"),
]

TRUE_TERMS = {
    "device.matmul.max_fraction.fp32": 0.3,
    "device.memory_bound_efficiency": 0.5,
    "collectives.loopback.bus_bandwidth_scale": 0.5,
    "collectives.network.bus_bandwidth_scale": 0.2,
    "overheads.fsdp_overlap": 0.5,
    "overheads.step_overhead_s": 0.05,
    "overheads.op_dispatch_s": 2e-5,
    "overheads.python_dispatch_s": 1e-4,
    "overheads.collective_sync_s": 2e-3,
    "overheads.memory_fragmentation": 0.2,
    "overheads.context_gib": 0.01,
}


def true_profile(base: ClusterProfile) -> ClusterProfile:
    t = TRUE_TERMS
    prof = with_matmul_fraction(base, "fp32", t["device.matmul.max_fraction.fp32"])
    from dataclasses import replace

    prof = replace(prof, device=replace(prof.device, memory_bound_efficiency=t["device.memory_bound_efficiency"]))
    prof = with_bus_scale(prof, "loopback", base, t["collectives.loopback.bus_bandwidth_scale"])
    prof = with_bus_scale(prof, "network", base, t["collectives.network.bus_bandwidth_scale"])
    for name in ("fsdp_overlap", "step_overhead_s", "op_dispatch_s", "python_dispatch_s", "collective_sync_s",
                 "memory_fragmentation", "context_gib"):
        prof = with_overhead(prof, name, t[f"overheads.{name}"])
    return prof


def plan_dict(mesh: tuple, model: str = "small", seq_len: int = 256, global_batch: int = 16) -> dict:
    r, s, c, t, p, mb, ac, sched = mesh
    return {"version": 1, "model": model, "cluster": "cpu-gloo", "gpus": r * s * c * t * p,
            "training": {"seq_len": seq_len, "global_batch": global_batch, "micro_batch": mb, "dtype": "fp32"},
            "parallel": {"dp_replicate": r, "dp_shard": s, "cp": c, "tp": t, "pp": p, "sequence_parallel": t > 1,
                         "async_tp": False, "pp_schedule": sched, "pp_virtual_stages": 1, "pp_layers": None},
            "memory": {"activation_checkpointing": ac, "sac_ops": None, "float8": False,
                       "reshard_after_forward": True},
            "compile": False}


def write_runs(root: Path, truth: ClusterProfile, meshes=MESHES, **plan_kw) -> list[str]:
    dirs = []
    for i, mesh in enumerate(meshes):
        data = plan_dict(mesh, **plan_kw)
        est = estimate_plan(plan_from_dict(data), truth)
        d = root / f"run{i:02d}"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({
            "measured": {"step_time_s": est.step_time_s, "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
                         # What a run measures: allocated tensors, the estimate's peak less its overhead.
                         "peak_memory_gib": est.allocated_peak_gib},
            "plan": data, "run": {"device": "cpu"}}))
        dirs.append(str(d))
    return dirs
