"""The search run on several processes at once, each on its own share of the meshes.

Every process counts, bounds and searches its meshes best-first, pruning against the K-th best step
time all of them have found so far together (shared memory). That is never better than the final
K-th best, so every plan that belongs in the overall top K is still scored and the top K is the one
a single process would give; how many leaves each prunes depends on timing. Processes are forked,
so the space and the profile are inherited, not pickled; only what a worker found comes back.
Where fork is not available, or there are few meshes, the search stays on one process.
"""

from __future__ import annotations

import bisect
import multiprocessing
import os
import signal
import traceback
from typing import Any

DEFAULT_MAX_JOBS = 4
MIN_MESHES_PER_JOB = 64  # below this a fork costs more than it saves


class SharedTopK:
    """The K best step times any worker has scored, in shared memory. Their K-th is a bound every
    worker prunes against: each is a distinct plan that fits, so the overall K-th best is no worse.
    Readers take `kth` without the lock (a double written whole); offers that improve it lock."""

    def __init__(self, ctx: Any, k: int):
        self.steps = ctx.RawArray("d", [float("inf")] * k)
        self.kth = ctx.RawValue("d", float("inf"))
        self.lock = ctx.Lock()

    def offer(self, step: float) -> None:
        """Each plan's step once. Skipping an offer only prunes less, so a lock that a killed worker
        left held costs pruning, not a hang."""
        if step >= self.kth.value or not self.lock.acquire(timeout=1.0):
            return
        try:
            steps = list(self.steps)
            if step < steps[-1]:
                bisect.insort(steps, step)
                steps.pop()
                self.steps[:] = steps
                self.kth.value = steps[-1]
        finally:
            self.lock.release()


def default_jobs() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(DEFAULT_MAX_JOBS, cpus))


def search_on_workers(search: Any, meshes: list, jobs: int) -> bool:
    """Search `meshes` on `jobs` processes, this one included; False (nothing done) if not worth it.
    `search` is the planner's search (search.py): its `search_meshes` runs, its `pool` (pool.py) shares
    the K-th best and gathers what each worker found."""
    if jobs < 2 or len(meshes) < MIN_MESHES_PER_JOB * jobs or "fork" not in multiprocessing.get_all_start_methods():
        return False
    ctx = multiprocessing.get_context("fork")
    search.pool.shared_top = SharedTopK(ctx, search.pool.top_k)
    shares = deal(meshes, jobs)
    workers = []
    for share in shares[1:]:
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_work, args=(search, share, send), daemon=True)
        proc.start()
        send.close()
        workers.append((proc, receive))
    try:
        search.search_meshes(shares[0])
        for proc, receive in workers:
            try:
                status, payload = receive.recv()
            except EOFError:
                status, payload = "error", f"exited with code {proc.exitcode} before reporting"
            proc.join()
            if status == "error":
                raise RuntimeError(f"planner worker failed: {payload}")
            search.pool.absorb(payload)
    finally:
        for proc, _ in workers:  # after a failure here, the others' work is moot
            if proc.is_alive():
                proc.terminate()
                proc.join()
    return True


def deal(meshes: list, jobs: int) -> list[list]:
    """Meshes that differ only in how data parallelism splits (dp_replicate x dp_shard) have the same
    stage durations and micro-batch counts, so the same schedule simulations: they go to one worker,
    which simulates once. The (tp, cp, pp) groups are dealt round-robin."""
    groups: dict[tuple[int, int, int], list] = {}
    for m in meshes:
        groups.setdefault((m.tp, m.cp, m.pp), []).append(m)
    shares: list[list] = [[] for _ in range(jobs)]
    for i, group in enumerate(groups.values()):
        shares[i % jobs].extend(group)
    return shares


def _die_with_parent() -> None:
    """On Linux, have the kernel end this worker if the parent dies (SIGKILL, SIGTERM) before it reports."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _work(search: Any, share: list, send) -> None:
    _die_with_parent()
    try:
        search.search_meshes(share)
        send.send(("ok", search.pool.findings()))
    except BaseException:  # reported, so that the parent raises instead of waiting
        send.send(("error", traceback.format_exc()))
    finally:
        send.close()
