"""Repeated timing with warm-up (median and spread), and the wall-clock budget every rank obeys."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch.distributed as dist

if TYPE_CHECKING:
    from meshplan.bench.env import BenchEnv


@dataclass
class Measurement:
    """Seconds per call: median over samples, and the 10th / 90th percentiles as the spread."""

    median_s: float
    p10_s: float
    p90_s: float
    samples: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative width of the middle 80 % of samples."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else math.nan


def summarize(samples: list[float]) -> Measurement:
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, max(0, round(f * (len(s) - 1))))]  # noqa: E731
    return Measurement(statistics.median(s), q(0.1), q(0.9), len(s))


def time_slowest_rank(fn: Callable[[], object], env: BenchEnv, reps: int = 1) -> float:
    """Seconds per call over `reps` calls started together on every rank (after a barrier): the
    slowest rank's time. Every rank must call it the same number of times."""
    env.sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    env.sync()
    return env.max_over_ranks([(time.perf_counter() - t0) / reps])[0]


def time_local(fn: Callable[[], object], sync: Callable[[], None], target_s: float, min_reps: int,
               max_reps: int = 1000, warmup: int = 1) -> Measurement:
    """Time `fn` on this rank alone: warm-up, then repetitions until `target_s` or `max_reps`."""
    for _ in range(warmup):
        fn()
    sync()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_reps and (len(samples) < min_reps or time.perf_counter() - start < target_s):
        t0 = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - t0)
    return summarize(samples)


@dataclass
class Budget:
    """A deadline (time.time() seconds) and a reserve kept back for fitting and writing the profile."""

    deadline: float | None
    # fit, write, then worker, torchrun-agent and launcher exit: 10 s measured on a busy 2-core host
    reserve_s: float = 12.0

    def remaining(self) -> float:
        return math.inf if self.deadline is None else self.deadline - self.reserve_s - time.time()

    def allows(self, cost_s: float) -> bool:
        return cost_s <= self.remaining()

    def section(self, fraction: float) -> "Budget":
        """A sub-budget: at most `fraction` of what is left now."""
        if self.deadline is None:
            return Budget(None, 0.0)
        return Budget(time.time() + max(0.0, self.remaining()) * fraction, 0.0)
