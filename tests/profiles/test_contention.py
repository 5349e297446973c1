"""profile-cluster's compute slowdown beside collectives (bench/contention.py) on two gloo ranks, with a hard
timeout: the all-reduces outlast every chain of matmuls, and the slowdown is what the timings say."""

import json
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("contention_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.distributed
def test_matmuls_beside_all_reduces_are_timed_while_the_all_reduces_run(tmp_path):
    out = tmp_path / "contention.json"
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0].decode(errors="replace"))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("contention measurement hung (killed after 120 s)")
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    for r in json.loads(out.read_text()):
        # every round's last all-reduce was still running when its chain of matmuls ended
        assert r["covered"] == len(r["ratios"]) == 5
        # sized to 0.15 s from the slowest rank's median matmul: long against timer noise, short for a profile
        assert r["chain"] >= 4 and 0.02 < r["alone_s"] < 2.0
        assert r["slowdown"] == pytest.approx(max(0.0, statistics.median(r["ratios"]) - 1.0))
        if (os.cpu_count() or 1) <= 2:
            # two ranks' matmul threads and gloo's two reduction threads on two cores: the chain slows
            assert r["beside_s"] > 1.1 * r["alone_s"] and r["slowdown"] > 0.1
