"""Collective benchmarks over groups inside a node and across nodes, in nccl-tests bus-bandwidth terms.

Message size conventions (nccl-tests): all_reduce and all_to_all use the per-rank buffer; all_gather the
total output; reduce_scatter the total input; send_recv the message each rank sends to its ring neighbour
(while receiving one from the other side). busbw = (bytes / time) * bus_factor.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from meshplan.profiles.bench.env import BenchEnv
from meshplan.profiles.bench.progress import Reporter
from meshplan.profiles.bench.timing import Budget, summarize
from meshplan.profiles.schema import COLLECTIVES

KIB, MIB = 1 << 10, 1 << 20
QUICK_SIZES = [4 * KIB, 64 * KIB, 1 * MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB, 32 * MIB]
FULL_SIZES = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB] + [MIB << i for i in range(9)]  # up to 256 MiB
MIN_SAMPLE_S = 0.004  # small messages are timed in batches at least this long, so timer and barrier noise fade


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests: busbw = algbw * factor, the bytes each rank's link carries per byte of message."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "send_recv":
        return 1.0
    raise ValueError(collective)


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
    min_reps: int
    max_reps: int = 200


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
        return lambda: dist.all_gather_into_tensor(out, inp, group=pg)
    if collective == "reduce_scatter":
        out, inp = torch.empty(numel // n, dtype=dtype, device=device), torch.ones(numel, dtype=dtype, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=pg)
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


def measure_point(env: BenchEnv, gs: GroupSet, collective: str, nbytes: int, settings: CollectiveSettings,
                  dtype: torch.dtype) -> dict:
    """One (collective, group size, size) point; every rank of the world takes part in the bookkeeping."""
    members = gs.my_group(env.rank)
    fn = _op(collective, nbytes, members, env.rank, gs.handle, dtype, env.device) if members else None
    if fn:
        _run(env, fn, 1)  # warm-up: connections, buffers, first-touch of pages
    once = env.max_over_ranks([_run(env, fn, 1) if fn else 0.0])[0]
    batch = max(1, min(100, math.ceil(MIN_SAMPLE_S / max(once, 1e-7))))
    reps = max(settings.min_reps, min(settings.max_reps, math.ceil(settings.target_s / max(once * batch, 1e-7))))
    samples = []
    for _ in range(reps):
        if fn:
            _barrier(env, gs.handle)
            samples.append(_run(env, fn, batch))
        else:
            samples.append(0.0)
    meas = summarize(env.max_over_ranks(samples))
    return {"collective": collective, "level": gs.level, "group_size": gs.size, "bytes": int(nbytes),
            "time_s": meas.median_s, "busbw_gbs": nbytes / meas.median_s * bus_factor(collective, gs.size) / 1e9,
            "p10_s": meas.p10_s, "p90_s": meas.p90_s, "samples": meas.samples * batch}


def _cost(prev: dict | None, nbytes: int, settings: CollectiveSettings) -> float:
    """Expected seconds for the next point: the previous size's time scaled linearly with bytes."""
    t = 0.01 if prev is None else prev["time_s"] * max(1.0, nbytes / prev["bytes"])
    return 3 * t + max(settings.target_s, settings.min_reps * t) + 0.01


def bench_collectives(env: BenchEnv, sets: list[GroupSet], settings: CollectiveSettings, budget: Budget,
                      rep: Reporter, dtype: torch.dtype) -> list[dict]:
    """Sizes ascending, collectives interleaved: a budget cut leaves every collective the same range."""
    points: list[dict] = []
    for gs in sets:
        last: dict[str, dict | None] = {c: None for c in COLLECTIVES}
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
                p = measure_point(env, gs, coll, nbytes, settings, dtype)
                last[coll] = p
                points.append(p)
                rep.advance(cost)
    return points


def estimate_total_s(sets: list[GroupSet], settings: CollectiveSettings, seconds_per_byte: float = 2e-9) -> float:
    """Rough wall time of the whole sweep, for the progress bar before anything is measured."""
    per_set = sum(3 * (1e-3 + s * seconds_per_byte) + max(settings.target_s, settings.min_reps * s * seconds_per_byte)
                  + 0.01 for s in settings.sizes)
    return per_set * len(COLLECTIVES) * len(sets)
