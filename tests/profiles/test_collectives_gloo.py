"""Two gloo ranks run the collective sweep for real (tiny sizes), with a hard timeout so a hang fails."""

import json
from pathlib import Path

import pytest
from two_ranks import run_two_ranks

from meshplan.bench.collectives import bus_factor
from meshplan.profiles.schema import COLLECTIVES

WORKER = Path(__file__).with_name("collective_worker.py")


def test_two_rank_gloo_sweep(tmp_path):
    out = tmp_path / "points.json"
    run_two_ranks(WORKER, out, 90, "collective benchmark")
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
