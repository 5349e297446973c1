"""How much slower compute runs while a collective shares the device: overheads.comm_compute_slowdown.

The estimate charges it on the collectives a step hides beside its compute (estimate.contended): their kernels
take SMs and memory bandwidth from the matmuls beside them. Measured as Lee et al. define it (arXiv 2507.03114,
2025, whose mean over A100, H100, MI250 and MI210, 18.9 %, the GPU built-ins carry): the time of compute
overlapped with communication over the same compute alone, minus 1. Here that compute is a chain of large
matmuls, and the communication all-reduces of a large buffer over the node's group, issued before the chain
and enough of them to outlast it, so the whole chain runs beside them. On a GPU the chain is timed on the
compute stream while NCCL's kernels run on their own; on a CPU gloo's reductions run on its own thread, on
the cores the matmuls use.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from meshplan.bench.env import BenchEnv

MIB = 1 << 20
# (matmul dimension, all-reduce buffer) per device type: on a GPU a bf16 8192^3 product (about 1.5 ms on an
# H100) beside 256 MiB all-reduces (about 1 ms on 8 NVLink GPUs), on a CPU an fp32 384^3 one beside 8 MiB
SIZES = {"cuda": (8192, 256 * MIB), "cpu": (384, 8 * MIB)}
CHAIN_S = {"cuda": 0.05, "cpu": 0.15}  # how long a chain of matmuls runs alone
ROUNDS = 5  # alone and beside, alternately; the median ratio is kept
# All-reduces issued for REACH times the chain's time alone (the chain slows beside them, 2.6x at most on this
# project's 2-core VM, and so do they); a round whose all-reduces ran out first is run again with twice as many,
# up to TRIES times.
REACH = 3.0
TRIES = 3


@dataclass
class ContentionResult:
    """One rank's medians over rounds: a chain's seconds alone and beside the all-reduces."""

    alone_s: float
    beside_s: float
    matmul_dim: int
    chain: int  # matmuls per chain
    buffer_bytes: int
    group_size: int
    ratios: list[float]  # beside / alone, per round
    covered: int = 0  # rounds whose last all-reduce was still running when the chain ended

    @property
    def slowdown(self) -> float:
        """Median over rounds of beside / alone - 1; never below 0 (a collective does not speed compute up:
        below 0 is noise)."""
        return max(0.0, statistics.median(self.ratios) - 1.0)


def _timer(env: BenchEnv):
    """Seconds of work queued on this rank's compute stream by `fn` (the CPU: wall time; it runs in line)."""
    def run(fn) -> float:
        if not env.is_cuda:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()  # the compute stream only: the all-reduces go on
        return start.elapsed_time(end) / 1e3
    return run


def measure_contention(env: BenchEnv, group: object, group_size: int) -> ContentionResult:
    """Every rank of `group` (the node's, from collectives.plan_groups) runs this at the same time."""
    dim, nbytes = SIZES[env.device.type]
    dtype = torch.bfloat16 if env.is_cuda else torch.float32
    a = torch.randn(dim, dim, dtype=dtype, device=env.device)
    b = torch.randn(dim, dim, dtype=dtype, device=env.device)
    c = torch.empty(dim, dim, dtype=dtype, device=env.device)
    buf = torch.ones(nbytes // a.element_size(), dtype=dtype, device=env.device)
    timed = _timer(env)
    timed(lambda: torch.mm(a, b, out=c))  # warm-up
    one = _agreed(env, statistics.median(timed(lambda: torch.mm(a, b, out=c)) for _ in range(5)))
    chain = max(4, math.ceil(CHAIN_S[env.device.type] / max(one, 1e-6)))

    def matmuls() -> None:
        for _ in range(chain):
            torch.mm(a, b, out=c)

    dist.all_reduce(buf, group=group)  # warm-up: the communicator and its buffers exist
    env.sync()
    t0 = time.perf_counter()
    dist.all_reduce(buf, group=group)
    env.sync()
    reduce_s = _agreed(env, time.perf_counter() - t0)
    ratios, alone, beside, covered = [], [], [], 0
    reach = REACH  # all-reduces for this many times the chain's time alone
    for _ in range(ROUNDS):
        for attempt in range(TRIES):
            env.sync()
            dist.barrier()
            t_alone = timed(matmuls)
            count = max(2, math.ceil(reach * _agreed(env, t_alone) / max(reduce_s, 1e-6)) + 1)  # alike on every rank
            env.sync()
            dist.barrier()
            works = [dist.all_reduce(buf, group=group, async_op=True) for _ in range(count)]
            t_beside = timed(matmuls)
            ran_out = works[-1].is_completed()
            for w in works:
                w.wait()
            env.sync()
            # where the all-reduces ran out before the chain on any rank, every rank tries again with twice as many
            if not _agreed(env, float(ran_out)) or attempt == TRIES - 1:
                break
            reach *= 2
        alone.append(t_alone)
        beside.append(t_beside)
        ratios.append(t_beside / t_alone)
        covered += not ran_out
    return ContentionResult(statistics.median(alone), statistics.median(beside), dim, chain, nbytes, group_size,
                            ratios, covered)


def _agreed(env: BenchEnv, seconds: float) -> float:
    """The slowest rank's figure, so every rank sizes its chain and its all-reduces alike."""
    return env.max_over_ranks([seconds])[0]


def contention_source(r: ContentionResult, dtype: str) -> str:
    return (f"measured (bench/contention.py): a chain of {r.chain} {dtype} {r.matmul_dim}^3 matmuls, "
            f"{r.alone_s * 1e3:.1f} ms alone and {r.beside_s * 1e3:.1f} ms beside all-reduces of "
            f"{r.buffer_bytes // MIB} MiB over the node's {r.group_size} ranks kept running the whole time "
            f"(still running at the chain's end in {r.covered} of {len(r.ratios)} rounds on rank 0; medians over "
            f"rounds, then over ranks); slowdown = beside / alone - 1, as Lee et al. "
            "define it (arXiv 2507.03114)")
