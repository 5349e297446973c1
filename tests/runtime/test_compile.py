"""Compiled plans run compiled: under every AC mode, with FSDP2, a pipeline stage and float8
(emulated), every block and every loss of every micro-batch runs its compiled graph forward and
backward in a training step on 2 gloo ranks, and Dynamo records no graph break. Layouts whose blocks cannot
compile here (TP, CP's gather path) are refused by the plan rules, never run eager.

Measured in the workers (layouts_worker.py, "compile_check"): Dynamo's graph-break and skipped-frame
counters over the whole run, and the profiler's CompiledFunction / CompiledFunctionBackward events
of the last step. A block that falls back to eager (as every checkpointed block did while the SAC
tag was module state mutated inside the checkpointed forward) runs no compiled region.
"""

from __future__ import annotations

import pytest

from cases import plan, pp
from worlds import collect, start_world
from meshplan.errors import InputError
from meshplan.runtime.options import check_runnable
from meshplan.specs.plan import plan_from_dict

STEPS = 3
WORLD_TIMEOUT_S = 420  # about 90 s here: inductor builds each case's C++ kernels
AC = {"none": ("none", None), "full": ("full", None), "selective": ("selective", None),
      "selective_attention_ffn_out": ("selective", ["attention", "ffn_out"])}
LAYOUTS = {"fsdp2": lambda mem: plan("tiny-4l", memory=mem, dp_shard=2),
           "pp2": lambda mem: pp("1F1B", 1, memory=mem),
           "float8_fsdp2": lambda mem: plan("tiny-4l", memory={**mem, "float8": True}, dp_shard=2)}


def compiled_case(layout: str, ac: str) -> dict:
    mode, ops = AC[ac]
    p = LAYOUTS[layout]({"activation_checkpointing": mode, "sac_ops": ops})
    p["compile"] = True
    return p


def compiled_regions(p: dict) -> int:
    """Compiled regions rank 0 runs forward in a step, by hand: its layers times its micro-batches, plus
    one loss per micro-batch where it holds the last stage (the loss compiles with the blocks)."""
    par, t = p["parallel"], p["training"]
    layers = 4 // par["pp"]  # tiny-4l, cut evenly
    dp = par["dp_replicate"] * par["dp_shard"]
    micro = t["global_batch"] // dp // t["micro_batch"]
    losses = micro if par["pp"] == 1 else 0  # rank 0 holds the first of two stages
    return layers * micro + losses


CASES = {f"{layout}_{ac}": compiled_case(layout, ac) for layout in LAYOUTS for ac in AC}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("compile")
    spec = [{"name": name, "plan": p, "steps": STEPS, "compile_check": True} for name, p in CASES.items()]
    return collect([start_world(2, spec, tmp, "compile")], WORLD_TIMEOUT_S, tmp)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_block_runs_compiled(results, name):
    r = results[name]
    assert "error" not in r, r.get("error")
    assert r["dynamo_breaks"] == [], r["dynamo_breaks"]
    n = compiled_regions(CASES[name])
    assert (r["compiled_forward"], r["compiled_backward"]) == (n, n), r
    assert all(loss == loss for loss in r["losses"]) and len(r["losses"]) == STEPS


@pytest.mark.parametrize("ac", sorted(AC))
@pytest.mark.parametrize("degrees", [{"tp": 2}, {"tp": 2, "sequence_parallel": True}, {"cp": 2}])
def test_layouts_that_cannot_compile_on_gloo_are_refused(ac, degrees):
    mode, ops = AC[ac]
    p = plan("tiny-4l", memory={"activation_checkpointing": mode, "sac_ops": ops}, **degrees)
    p["compile"] = True
    with pytest.raises(InputError) as err:
        check_runnable(plan_from_dict(p), "cpu")
    assert str(err.value).startswith("compile:") and "\n" not in str(err.value)
    check_runnable(plan_from_dict(p), "cuda")  # not refused where it was not seen to fail
    check_runnable(plan_from_dict({**p, "compile": False}), "cpu")
