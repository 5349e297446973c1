"""`meshplan run --profile-steps N`: torch.profiler over N steps after the timing warm-up, one
chrome trace and one table of the most expensive ops per rank under <out>/profile/ (what
TorchTitan's `--profiling.enable_profiling` gives): where a step's time goes when it disagrees
with the estimate."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from meshplan.yamlio import atomic_write_text

TOP_OPS = 40


def profiled_steps(first: int, count: int) -> range:
    """The steps (0-based) a run profiles: `count` of them from `first`, the first timed step."""
    return range(first, first + count)


def step_profiler(device: torch.device, active: bool):
    """A profiler context for one step (nullcontext when this step is not profiled)."""
    if not active:
        return contextlib.nullcontext()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    return profile(activities=activities, record_shapes=False, with_stack=False)


def save_profile(prof: profile, out: Path, rank: int, step: int, device: torch.device) -> Path:
    """Write rank `rank`'s trace of `step` and its top-ops table; returns the trace path."""
    folder = out / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / f"rank{rank}_step{step}.json"
    prof.export_chrome_trace(str(trace))
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=TOP_OPS)
    atomic_write_text(folder / f"rank{rank}_step{step}_ops.txt", table + "\n")
    return trace
