"""The search run on several processes at once, each on its own share of the meshes.

Every process counts, bounds and searches its meshes best-first, pruning against its own K-th best.
That is never better than the K-th best of all processes together, so every plan that belongs in
the overall top K is still scored and the result is the one a single process would give. Processes
are forked, so the space and the profile are inherited, not pickled; only what a worker found
comes back. Where fork is not available, or there are few meshes, the search stays on one process.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from typing import Any

DEFAULT_MAX_JOBS = 4
MIN_MESHES_PER_JOB = 64  # below this a fork costs more than it saves


def default_jobs() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(DEFAULT_MAX_JOBS, cpus))


def search_on_workers(search: Any, meshes: list, jobs: int) -> bool:
    """Search `meshes` on `jobs` processes, this one included; False (nothing done) if not worth it."""
    if jobs < 2 or len(meshes) < MIN_MESHES_PER_JOB * jobs or "fork" not in multiprocessing.get_all_start_methods():
        return False
    ctx = multiprocessing.get_context("fork")
    # Dealt round-robin: neighbouring meshes (the same degrees but one) cost alike to search.
    shares = [meshes[i::jobs] for i in range(jobs)]
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
            search.absorb(payload)
    finally:
        for proc, _ in workers:  # after a failure here, the others' work is moot
            if proc.is_alive():
                proc.terminate()
                proc.join()
    return True


def _work(search: Any, share: list, send) -> None:
    try:
        search.search_meshes(share)
        send.send(("ok", search.findings()))
    except BaseException:  # reported, so that the parent raises instead of waiting
        send.send(("error", traceback.format_exc()))
    finally:
        send.close()
