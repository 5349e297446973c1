"""profile-cluster's compute slowdown beside collectives (bench/contention.py) on two gloo ranks, with a hard
timeout: the all-reduces outlast every chain of matmuls, and the slowdown is what the timings say."""

import json
import os
import statistics
from pathlib import Path

import pytest
from two_ranks import run_two_ranks

WORKER = Path(__file__).with_name("contention_worker.py")


@pytest.mark.distributed
def test_matmuls_beside_all_reduces_are_timed_while_the_all_reduces_run(tmp_path):
    out = tmp_path / "contention.json"
    run_two_ranks(WORKER, out, 120, "contention measurement")
    for r in json.loads(out.read_text()):
        # every round's last all-reduce was still running when its chain of matmuls ended
        assert r["covered"] == len(r["ratios"]) == 5
        # sized to 0.15 s from the slowest rank's median matmul: long against timer noise, short for a profile
        assert r["chain"] >= 4 and 0.02 < r["alone_s"] < 2.0
        assert r["slowdown"] == pytest.approx(max(0.0, statistics.median(r["ratios"]) - 1.0))
        if (os.cpu_count() or 1) <= 2:
            # two ranks' matmul threads and gloo's two reduction threads on two cores: the chain slows
            assert r["beside_s"] > 1.1 * r["alone_s"] and r["slowdown"] > 0.1
