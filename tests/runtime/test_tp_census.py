"""runtime/tp_census: the post-grad pass that counts what inductor made of the TP collectives (async TP's
proof on CUDA: fused ops > 0). On gloo, 2 ranks, a compiled all-gather -> matmul -> all-reduce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from meshplan.runtime.tp_census import FUSED_TP_OPS, fused, op_name

HERE = Path(__file__).parent


def test_op_names_drop_namespace_and_overload():
    import torch.distributed._symmetric_memory  # noqa: F401  registers the symm_mem ops

    assert op_name(torch.ops.symm_mem.fused_all_gather_matmul.default) == "fused_all_gather_matmul"
    assert op_name(torch.ops._c10d_functional.reduce_scatter_tensor.default) == "reduce_scatter_tensor"
    assert fused({"fused_matmul_reduce_scatter": 2, "fused_all_gather_matmul": 3, "all_gather_into_tensor": 7}) == 5


@pytest.mark.distributed
def test_the_census_counts_the_collectives_of_a_compiled_graph(tmp_path):
    out = tmp_path / "census.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           str(HERE / "tp_census_worker.py"), str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["before"] is None  # nothing counted before the census is installed
    # ones(2, 4) gathered over 2 ranks is ones(4, 4); times ones(4, 3) gives 4 each; summed over 2 ranks: 8.
    assert (r["world"], r["value"]) == (2, 8.0)
    after = r["after"]
    assert after["graphs"] == 1  # one compiled graph, seen by the pass
    assert (after["all_gather_into_tensor"], after["all_reduce"], after["reduce_scatter_tensor"]) == (1, 1, 0)
    assert all(after[name] == 0 for name in FUSED_TP_OPS)  # no micro-pipeline pass on gloo: nothing fused
