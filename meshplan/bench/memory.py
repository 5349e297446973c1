"""Device memory: capacity, the largest allocation that succeeds once the context is up, and context size."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from meshplan.bench.env import BenchEnv
from meshplan.cost_models.memory import GIB

# Share of available RAM a CPU "device" may plan to use: the rest is left to the OS, page cache and
# the other processes' Python heaps.
CPU_USABLE_FRACTION = 0.8


@dataclass
class MemoryResult:
    memory_gib: float
    usable_gib: float
    context_gib: float
    source: str


def _meminfo_kib(key: str) -> float | None:
    try:
        m = re.search(rf"^{key}:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return float(m.group(1)) if m else None


def _rss_gib() -> float:
    try:
        m = re.search(r"^VmRSS:\s*(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return 0.0
    return float(m.group(1)) * 1024 / GIB if m else 0.0


def measure_memory(env: BenchEnv) -> MemoryResult:
    return _cuda_memory(env) if env.is_cuda else _cpu_memory(env)


def _cuda_memory(env: BenchEnv) -> MemoryResult:
    free, total = torch.cuda.mem_get_info(env.device)
    step = 256 << 20
    size = free - step  # leave a little for the allocator's own bookkeeping
    while size > step:
        try:
            block = torch.empty(size, dtype=torch.uint8, device=env.device)
            del block
            break
        except torch.OutOfMemoryError:
            size -= step
    torch.cuda.empty_cache()
    return MemoryResult(total / GIB, size / GIB, (total - free) / GIB,
                        "measured: largest single allocation after CUDA context + NCCL init (256 MiB steps); "
                        "context = total - free at that point")


def _cpu_memory(env: BenchEnv) -> MemoryResult:
    total = _meminfo_kib("MemTotal")
    avail = _meminfo_kib("MemAvailable")
    if total is None or avail is None:
        raise RuntimeError("cannot read /proc/meminfo to size CPU memory")
    per = env.local_world
    return MemoryResult(total * 1024 / GIB / per, CPU_USABLE_FRACTION * avail * 1024 / GIB / per, _rss_gib(),
                        f"CPU: MemTotal / {per} processes per node; usable = {CPU_USABLE_FRACTION} x MemAvailable / "
                        f"{per}; context = resident size of a benchmark process after gloo init")
