"""Two gloo ranks run the collective sweep for real (tiny sizes), with a hard timeout so a hang fails."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.bench.collectives import bus_factor
from meshplan.profiles.schema import COLLECTIVES

WORKER = Path(__file__).with_name("collective_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_rank_gloo_sweep(tmp_path):
    out = tmp_path / "points.json"
    port = _free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k not in ("GROUP_RANK",)}
        env.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=90)[0].decode(errors="replace"))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("collective benchmark hung (killed after 90 s)")
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    data = json.loads(out.read_text())
    assert data["world"] == 2 and data["nnodes"] == 1
    assert data["groups"] == [["loopback", 2, [[0, 1]]]]
    points = data["points"]
    assert sorted({p["collective"] for p in points}) == sorted(COLLECTIVES)
    for p in points:
        assert p["bytes"] in (4096, 65536) and p["group_size"] == 2 and p["level"] == "loopback"
        assert 0 < p["p10_s"] <= p["time_s"] <= p["p90_s"] < 1.0
        assert p["busbw_gbs"] == pytest.approx(p["bytes"] / p["time_s"] * bus_factor(p["collective"], 2) / 1e9)
        assert p["samples"] >= 3
