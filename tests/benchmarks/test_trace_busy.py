"""benchmarks/trace_busy.py: the GPU-busy share of a profiled step, from a chrome trace."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

from trace_busy import summarise, union_length  # noqa: E402


@pytest.mark.parametrize("seed", range(5))
def test_union_length_matches_a_brute_force_count(seed):
    """Integer intervals, overlapping at random: the union's length is the count of unit cells covered."""
    rng = random.Random(seed)
    intervals = [(s, s + rng.randint(0, 20)) for s in (rng.randint(0, 200) for _ in range(40))]
    cells = {c for s, e in intervals for c in range(s, e)}
    assert union_length([(float(s), float(e)) for s, e in intervals]) == len(cells)


def test_summary_of_a_hand_made_trace(tmp_path):
    """Host ops over 0-100 us; kernels at 10-30 and 20-40 (overlapping: 30 us busy) and 60-70: 40 us busy
    of a 100 us span; one synchronize; one 20 us gap between kernels."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},
              {"ph": "X", "cat": "kernel", "name": "k1", "ts": 10, "dur": 20},
              {"ph": "X", "cat": "kernel", "name": "k2", "ts": 20, "dur": 20},
              {"ph": "X", "cat": "kernel", "name": "k3", "ts": 60, "dur": 10},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 40, "dur": 5}]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    s = summarise(trace)
    assert s["span_ms"] == pytest.approx(0.1)
    assert s["gpu_busy_ms"] == pytest.approx(0.04)
    assert s["busy_share"] == pytest.approx(0.4)
    assert (s["kernels"], s["blocking_calls"]) == (3, 1)
    assert s["gap_ms_total"] == pytest.approx(0.02)
