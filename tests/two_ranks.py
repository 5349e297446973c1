"""A worker script run as two gloo ranks on this machine, on a free port, with a hard time limit so that a
hang fails the test (the profile benchmarks' multi-process tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_ranks(worker: Path, out: Path, timeout_s: int, what: str) -> None:
    """Run `worker out` as ranks 0 and 1 (one thread each); fail with both logs if either fails, and kill
    both if they outlast `timeout_s`."""
    port = free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k != "GROUP_RANK"}
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(worker), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout_s)[0].decode(errors="replace"))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{what} hung (killed after {timeout_s} s)")
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
