"""Start torchrun on this node for `--nproc K`, with a hard timeout so a hung rank cannot outlive the budget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from meshplan.errors import InputError

DEADLINE_ENV = "MESHPLAN_PROFILE_DEADLINE"  # time.time() by which the workers must be done
ERROR_FILE_ENV = "MESHPLAN_PROFILE_ERROR_FILE"  # rank 0 writes a one-line InputError message here
COMMAND_ENV = "MESHPLAN_PROFILE_COMMAND"  # the command line the user typed, for provenance
GRACE_S = 20.0  # process start-up and teardown on top of the workers' own deadline


def in_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch(nproc: int, worker_argv: list[str], deadline: float | None, threads_per_proc: int, command: str) -> int:
    """Run `python -m meshplan profile-cluster <worker_argv>` as `nproc` torchrun workers; return their exit code."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--monitor-interval=0.1",  # notice finished workers at once, not seconds later
           "-m", "meshplan", "profile-cluster", *worker_argv]
    with tempfile.TemporaryDirectory(prefix="meshplan-profile-") as tmp:
        err_file = Path(tmp) / "error.txt"
        env = dict(os.environ, OMP_NUM_THREADS=str(threads_per_proc), **{ERROR_FILE_ENV: str(err_file), COMMAND_ENV: command})
        if deadline is not None:
            env[DEADLINE_ENV] = repr(deadline)
        # own session: on timeout the whole tree (agent and workers) goes, and nothing else
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=None if deadline is None else max(1.0, deadline - time.time() + GRACE_S))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise InputError("--time-budget", "benchmarks overran the time budget and were stopped")
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
        if err_file.is_file() and err_file.read_text().strip():
            field, _, message = err_file.read_text().strip().partition("\t")
            raise InputError(field, message)
        return code
