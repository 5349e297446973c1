"""Collective benchmarks over groups inside a node and across nodes, in nccl-tests bus-bandwidth terms.

Message size conventions (nccl-tests): all_reduce and all_to_all use the per-rank buffer; all_gather the
total output; reduce_scatter the total input; send_recv the message each rank sends to its ring neighbour
(while receiving one from the other side). busbw = (bytes / time) * bus_factor.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from meshplan.cost_models.comm import bus_factor
from meshplan.bench.env import BenchEnv
from meshplan.bench.progress import Reporter
from meshplan.bench.timing import Budget, summarize
from meshplan.profiles.schema import COLLECTIVES

KIB, MIB = 1 << 10, 1 << 20
# torch 2.13 renamed them (the old names warn); the GPU image's 2.11 has only the old ones.
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
# quick stops below 32 MiB: from there glibc serves gloo's temporary buffers by mmap and every call pays
# page faults, a second regime that a minute-long run cannot cover with enough points
QUICK_SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 24 * MIB]
FULL_SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB] + [MIB << i for i in range(9)]  # up to 256 MiB
MIN_SAMPLE_S = 0.004  # small messages are timed in batches at least this long, so timer and barrier noise fade


@dataclass
class GroupSet:
    """Disjoint groups of one size on one link level; all run the benchmark at the same time."""

    level: str
    size: int
    members: list[list[int]]
    handle: object = None  # this rank's process group (None when it sits this one out)

    def my_group(self, rank: int) -> list[int] | None:
        return next((g for g in self.members if rank in g), None)


@dataclass
class CollectiveSettings:
    sizes: list[int]
    target_s: float
    min_reps: int  # over all rounds
    rounds: int
    dtype: torch.dtype
    max_reps: int = 400


def plan_groups(env: BenchEnv, node_level: str, network_level: str) -> list[GroupSet]:
    """Node level: the whole node and power-of-two sub-groups of it; network level: one rank per node, then all."""
    sets: list[GroupSet] = []
    local = min(len(env.node_ranks(n)) for n in range(env.nnodes))
    sizes = sorted({local} | {2 ** i for i in range(1, int(math.log2(local)) + 1) if local % 2 ** i == 0}, reverse=True)
    for size in sizes:
        if size < 2:
            continue
        members = [ranks[i:i + size] for n in range(env.nnodes) for ranks in [env.node_ranks(n)]
                   for i in range(0, len(ranks) - size + 1, size)]
        sets.append(GroupSet(node_level, size, members))
    if env.nnodes >= 2:
        sets.append(GroupSet(network_level, env.world, [list(range(env.world))]))
        per_node = [[env.node_ranks(n)[i] for n in range(env.nnodes)] for i in range(local)]
        if env.nnodes < env.world:
            sets.append(GroupSet(network_level, env.nnodes, per_node))
    for gs in sets:  # every rank creates every group, in the same order (a torch.distributed rule)
        for members in gs.members:
            pg = dist.group.WORLD if len(members) == env.world else dist.new_group(members)
            if env.rank in members:
                gs.handle = pg
    return sets


def _op(collective: str, nbytes: int, members: list[int], rank: int, pg, dtype: torch.dtype,
        device: torch.device) -> Callable[[], None]:
    """A closure running one collective of `nbytes` (rounded down to whole elements per rank)."""
    n = len(members)
    elem = torch.tensor([], dtype=dtype).element_size()
    numel = max(n, nbytes // elem // n * n)
    if collective == "all_reduce":
        buf = torch.ones(numel, dtype=dtype, device=device)
        return lambda: dist.all_reduce(buf, group=pg)
    if collective == "all_gather":
        out, inp = torch.empty(numel, dtype=dtype, device=device), torch.ones(numel // n, dtype=dtype, device=device)
        return lambda: ALL_GATHER(out, inp, group=pg)
    if collective == "reduce_scatter":
        out, inp = torch.empty(numel // n, dtype=dtype, device=device), torch.ones(numel, dtype=dtype, device=device)
        return lambda: REDUCE_SCATTER(out, inp, group=pg)
    if collective == "all_to_all":
        out, inp = torch.empty(numel, dtype=dtype, device=device), torch.ones(numel, dtype=dtype, device=device)
        return lambda: dist.all_to_all_single(out, inp, group=pg)
    if collective == "send_recv":
        i = members.index(rank)
        nxt, prv = members[(i + 1) % n], members[(i - 1) % n]
        out, inp = torch.ones(numel, dtype=dtype, device=device), torch.empty(numel, dtype=dtype, device=device)

        def ring() -> None:
            ops = [dist.P2POp(dist.isend, out, nxt, group=pg), dist.P2POp(dist.irecv, inp, prv, group=pg)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()

        return ring
    raise ValueError(collective)


def _barrier(env: BenchEnv, pg) -> None:
    if env.is_cuda:
        dist.barrier(group=pg, device_ids=[env.device.index])
    else:
        dist.barrier(group=pg)


def _run(env: BenchEnv, fn: Callable[[], None], count: int) -> float:
    """Seconds per call of `count` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    env.sync()
    return (time.perf_counter() - t0) / count


@dataclass
class Point:
    """Samples of one (group set, collective, size), gathered over several rounds of the sweep."""

    gs: GroupSet
    collective: str
    nbytes: int
    batch: int = 1
    reps_per_round: int = 1
    samples: list[float] = field(default_factory=list)
    round_medians: list[float] = field(default_factory=list)

    def median_se(self) -> float | None:
        """Relative standard error of the median, from how much the per-round medians disagree (None: one round)."""
        r = self.round_medians
        return statistics.stdev(r) / math.sqrt(len(r)) / statistics.median(self.samples) if len(r) > 1 else None

    def record(self) -> dict:
        meas = summarize(self.samples)
        n = self.gs.size
        return {"collective": self.collective, "level": self.gs.level, "group_size": n, "bytes": int(self.nbytes),
                "time_s": meas.median_s, "busbw_gbs": self.nbytes / meas.median_s * bus_factor(self.collective, n) / 1e9,
                "p10_s": meas.p10_s, "p90_s": meas.p90_s, "samples": meas.samples * self.batch,
                "median_se": self.median_se()}


def measure_round(env: BenchEnv, pt: Point, settings: CollectiveSettings, first: bool) -> None:
    """One round of a point: warm-up, (first round: choose batch and repetitions), timed samples.

    Buffers are made afresh each round so the sweep never holds every size in memory at once.
    """
    members = pt.gs.my_group(env.rank)
    fn = _op(pt.collective, pt.nbytes, members, env.rank, pt.gs.handle, settings.dtype, env.device) if members else None
    if fn:
        _run(env, fn, 1)  # warm-up: connections, buffers, first-touch of pages
    if first:
        once = env.max_over_ranks([_run(env, fn, 1) if fn else 0.0])[0]
        pt.batch = max(1, min(100, math.ceil(MIN_SAMPLE_S / max(once, 1e-7))))
        total = max(settings.min_reps, min(settings.max_reps, math.ceil(settings.target_s / max(once * pt.batch, 1e-7))))
        pt.reps_per_round = math.ceil(total / settings.rounds)
    samples = []
    if fn:
        _barrier(env, pt.gs.handle)  # start together; afterwards the collectives themselves keep ranks in step
    for _ in range(pt.reps_per_round):
        samples.append(_run(env, fn, pt.batch) if fn else 0.0)
    samples = env.max_over_ranks(samples)
    pt.samples += samples
    pt.round_medians.append(statistics.median(samples))


def _cost(prev: Point | None, nbytes: int, settings: CollectiveSettings) -> float:
    """Expected seconds of the first round of the next point: the previous size's time scaled with bytes."""
    t = 0.01 if prev is None else statistics.median(prev.samples) * max(1.0, nbytes / prev.nbytes)
    return 3 * t + max(settings.target_s, settings.min_reps * t) / settings.rounds + 0.01


def _round_cost(pt: Point) -> float:
    return statistics.median(pt.samples) * (pt.reps_per_round * pt.batch + 1) + 0.005


def bench_collectives(env: BenchEnv, sets: list[GroupSet], settings: CollectiveSettings, budget: Budget,
                      rep: Reporter) -> list[dict]:
    """Sizes ascending, collectives interleaved, the whole sweep repeated in rounds.

    Interleaving spreads bursts of outside load over all points instead of spoiling one, and a budget
    cut leaves every collective the same size range.
    """
    records: list[dict] = []
    for gs in sets:
        points: list[Point] = []
        last: dict[str, Point | None] = {c: None for c in COLLECTIVES}
        stopped: set[str] = set()
        for nbytes in settings.sizes:
            for coll in COLLECTIVES:
                if coll in stopped:
                    continue
                cost = _cost(last[coll], nbytes, settings)
                if not env.agree(budget.allows(cost)):
                    stopped.add(coll)
                    rep.skip(f"{coll} on {gs.level} (group {gs.size}) from {nbytes // KIB} KiB up (time budget)")
                    continue
                pt = Point(gs, coll, nbytes)
                measure_round(env, pt, settings, first=True)
                last[coll] = pt
                points.append(pt)
                rep.advance(cost)
        for r in range(1, settings.rounds):
            if not env.agree(budget.allows(sum(_round_cost(p) for p in points))):
                rep.skip(f"rounds {r + 1}-{settings.rounds} of the {gs.level} group-{gs.size} sweep (time budget)")
                break
            for pt in points:
                measure_round(env, pt, settings, first=False)
                rep.advance(_cost(pt, pt.nbytes, settings))
        records += [p.record() for p in points]
    return records


@dataclass
class Probe:
    """A first look at the largest node group: seconds per call = latency_s + bytes * seconds_per_byte."""

    latency_s: float
    seconds_per_byte: float


def probe(env: BenchEnv, gs: GroupSet, dtype: torch.dtype) -> Probe:
    """all_reduce at 64 KiB and 4 MiB, a few calls each: enough to plan repetitions within a budget."""
    quick = CollectiveSettings([], target_s=0.0, min_reps=3, rounds=1, dtype=dtype)
    small, large = Point(gs, "all_reduce", 64 * KIB), Point(gs, "all_reduce", 4 * MIB)
    for pt in (small, large):
        measure_round(env, pt, quick, first=True)
    t_small, t_large = statistics.median(small.samples), statistics.median(large.samples)
    spb = max((t_large - t_small) / (4 * MIB - 64 * KIB), t_large / (4 * MIB) * 0.1)
    return Probe(latency_s=max(t_small, 1e-6), seconds_per_byte=spb)


def estimate_total_s(sets: list[GroupSet], settings: CollectiveSettings, pr: Probe) -> float:
    """Expected wall time of the whole sweep from the probe (progress bar and budget planning)."""
    per_set = 0.0
    for s in settings.sizes:
        t = pr.latency_s + s * pr.seconds_per_byte
        per_set += 3 * t + max(settings.target_s, settings.min_reps * t) + 0.005 * settings.rounds
    return per_set * len(COLLECTIVES) * len(sets)


def fit_to_budget(sets: list[GroupSet], settings: CollectiveSettings, pr: Probe, seconds: float) -> CollectiveSettings:
    """Fewer repetitions and rounds (never under 3 and 2) when the full plan would not fit in `seconds`."""
    need = estimate_total_s(sets, settings, pr)
    if need <= seconds:
        return settings
    scale = max(seconds / need, 0.0)
    return CollectiveSettings(settings.sizes, target_s=settings.target_s * scale,
                              min_reps=max(3, int(settings.min_reps * scale)),
                              rounds=max(2, int(settings.rounds * scale)), dtype=settings.dtype,
                              max_reps=settings.max_reps)
