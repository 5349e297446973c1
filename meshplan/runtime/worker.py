"""The torchrun worker: join the process group (NCCL on CUDA, gloo on CPU), train, and on rank 0
write DIR/summary.json (measured vs what `meshplan estimate` predicts for the same plan)."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import replace
from datetime import timedelta

import torch
import torch.distributed as dist

from meshplan.errors import InputError
from meshplan.runtime import tp_census
from meshplan.runtime.checkpoint import CheckpointError
from meshplan.runtime.launcher import ALLOCATOR_ENV_NAMES
from meshplan.runtime.metrics import measured_summary, predicted, ratios
from meshplan.runtime.options import RunOptions
from meshplan.runtime.train import counts_live_tensors, run_training
from meshplan.specs.plan import Plan
from meshplan.yamlio import atomic_write_json

PG_TIMEOUT = timedelta(minutes=10)
# What measured.peak_memory_gib (allocated) and peak_memory_reserved_gib are, by device (CUDA?).
MEMORY_MEASURE = {
    True: "allocated: torch.cuda.max_memory_allocated, reserved: torch.cuda.max_memory_reserved; max over ranks",
    False: "allocated: live tensor storage bytes, max over ranks (runtime/metrics.py); reserved: null "
           "(the CPU allocator keeps no cache)",
}


def memory_measure(plan: Plan, device: torch.device) -> str:
    """What measured.peak_memory_gib is on this run, or why it is null."""
    if device.type == "cpu" and not counts_live_tensors(plan, device):
        return ("not measured: compiled blocks on a CPU (the live-tensor count's dispatch mode would run them "
                "uncompiled; runtime/train.py counts_live_tensors)")
    return MEMORY_MEASURE[device.type == "cuda"]


def pick_device() -> tuple[torch.device, str]:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local), "nccl"
    return torch.device("cpu"), "gloo"


def restart_count() -> int:
    """How many times torchrun has restarted this worker group (--max-restarts)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def run_worker(plan: Plan, opts: RunOptions) -> int:
    if restart_count() > 0 and opts.out:
        # A restart after a failure continues from the newest complete checkpoint, --resume or not.
        opts = replace(opts, resume=True)
    device, backend = pick_device()
    dist.init_process_group(backend, timeout=PG_TIMEOUT)
    rank0 = dist.get_rank() == 0
    notes = []
    if device.type == "cpu" and plan.memory.float8:
        notes.append("float8 is emulated on CPU (torchao emulate=True): float8 numerics, not float8 speed")
    if opts.balanced_routing:
        notes.append("balanced routing (test mode): every expert gets the same load, imbalance 1, whatever the "
                     "estimate assumed for a trained router")
    if rank0 and not opts.quiet:
        for note in notes:
            print(f"meshplan run: {note}", flush=True)
        print(f"meshplan run: {plan.model.name} on {dist.get_world_size()} x {device.type} ({backend}), "
              f"{opts.steps} steps", flush=True)
    if rank0 and restart_count() > 0:  # said even with --quiet: a restart is news
        print(f"meshplan run: restart {restart_count()} after a failure", flush=True)
    try:
        rows = run_training(plan, opts, device)
    except (InputError, CheckpointError) as exc:
        # every rank raised the same one-line error: rank 0 says it; 2 = bad input, 1 = a failure
        if rank0:
            print(f"meshplan run: error: {exc}", file=sys.stderr)
        dist.destroy_process_group()
        return 2 if isinstance(exc, InputError) else 1
    if rank0 and opts.out and rows:
        write_summary(plan, opts, rows, device, backend, notes)
    dist.destroy_process_group()
    return 0


def write_summary(plan: Plan, opts: RunOptions, rows, device: torch.device, backend: str, notes: list[str]) -> None:
    import meshplan

    measured = measured_summary(rows, opts.timing_warmup)
    if (tp_ops := tp_census.census()) is not None:  # compiled TP: the collectives inductor left and fused
        measured["compiled_tp_ops"] = tp_ops
    pred, why = predicted(plan)
    summary = {
        "measured": measured,
        "predicted": pred,
        "predicted_unavailable": why,
        "ratio_measured_over_predicted": ratios(measured, pred),
        "plan": plan.to_dict(),
        "run": {"steps": opts.steps, "seed": opts.seed, "data": opts.data, "world_size": dist.get_world_size(),
                "device": device.type, "backend": backend, "timing_warmup": opts.timing_warmup,
                "dtype": str(plan.training.dtype), "memory_measure": memory_measure(plan, device),
                "allocator_conf": allocator_conf(),
                "notes": notes},
        "versions": {"meshplan": meshplan.__version__, "torch": torch.__version__, "python": platform.python_version(),
                     "torchao": _version("torchao")},
    }
    atomic_write_json(os.path.join(opts.out, "summary.json"), summary)


def allocator_conf() -> str | None:
    """The CUDA caching allocator's settings this worker runs under (launcher.worker_env sets them)."""
    return next((os.environ[name] for name in ALLOCATOR_ENV_NAMES if os.environ.get(name)), None)


def _version(dist_name: str) -> str | None:
    # Package metadata, not an import: importing torchao only to read its version costs seconds.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return None
