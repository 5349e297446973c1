"""profile-cluster's per-call collective sync time (bench/in_step.py) and pipeline steps (bench/pipeline.py)
on two gloo ranks, with a hard timeout."""

import json
from pathlib import Path

import pytest
from two_ranks import run_two_ranks

from meshplan.bench.in_step import fsdp_calls, sync_per_call
from meshplan.profiles import load_profile

WORKER = Path(__file__).with_name("in_step_worker.py")


@pytest.mark.distributed
def test_fsdp_model_issues_the_calls_it_divides_by_and_the_sync_time_is_physical(tmp_path):
    out = tmp_path / "in_step.json"
    run_two_ranks(WORKER, out, 120, "in-step measurement")
    got = json.loads(out.read_text())
    # Counted by torch.profiler in FSDP2 itself: the calls the per-call figure is divided by.
    assert (got["gathers"], got["scatters"]) == fsdp_calls() == (2 * got["units"] - 1, got["units"])
    fsdp = got["fsdp"]
    assert (fsdp["gathers"], fsdp["scatters"], fsdp["group"]) == (got["gathers"], got["scatters"], 2)
    # One unit: three 128 x 128 linears with biases, gathered whole in fp32.
    assert fsdp["unit_bytes"] == 4 * 3 * (128 * 128 + 128)
    assert fsdp["sharded_s"] > fsdp["plain_s"] > 0 and fsdp["extra_s"] > 0
    # Per call: more than nothing cannot be promised on every host, but a 128-wide block's call
    # taking 50 ms would be a broken measurement (it is ~1 ms on a 2-core VM).
    assert 0.0 <= sync_per_call(fsdp, 3e-6, load_profile("cpu-gloo")) < 0.05
    # The world as one pipeline, on both of PyTorch's runtimes: the looped one runs twice the actions.
    single, multi = got["pipeline"]
    assert (single["schedule"], single["v"], multi["schedule"], multi["v"]) == ("1F1B", 1, "Interleaved1F1B", 2)
    assert single["m"] == multi["m"] == 8 and single["pp"] == multi["pp"] == 2
    assert 0.0 < single["step_s"] < multi["step_s"] < 1.0


def test_the_per_call_figure_is_what_the_estimates_prices_leave_of_the_step():
    """A sharded step built from the hook ops, the profile's transfer prices and 1 ms per call gives 1 ms."""
    from meshplan.bench.in_step import TENSORS_PER_UNIT, UNITS
    from meshplan.cost_models.comm import GroupSpan, collective_time
    from meshplan.cost_models.host import UNIT_OPS, UNIT_OPS_PER_TENSOR

    prof, op_s, nbytes = load_profile("cpu-gloo"), 3e-6, 4.0 * 49536
    span = GroupSpan(2, 2)
    transfers = (7 * collective_time(prof, "all_gather", nbytes, span)
                 + 4 * collective_time(prof, "reduce_scatter", nbytes, span))
    hooks = UNITS * (UNIT_OPS + TENSORS_PER_UNIT * UNIT_OPS_PER_TENSOR) * op_s
    record = {"extra_s": hooks + transfers + 11 * 1e-3, "unit_bytes": nbytes,
              "gathers": 7, "scatters": 4, "group": 2, "group_per_node": 2}
    assert sync_per_call(record, op_s, prof) == pytest.approx(1e-3, rel=1e-9)
    # A step faster than the priced parts leaves nothing per call, not a negative cost.
    assert sync_per_call(dict(record, extra_s=0.0), op_s, prof) == 0.0
