"""A schedule that returns every micro-batch's output (PyTorch pipelining before return_outputs, as
TorchTitan ran it in 2024) holds those outputs to the step's end: the logits on the last stage, in the
compute dtype (TorchTitan's model returns them so since Oct 2024; the fp32 upcast is inside the loss)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models.estimate import estimate_layout
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import GIB, kept_output_units, logits_bytes
from meshplan.cost_models.pipeline import simulate
from meshplan.profiles.registry import load_profile
from meshplan.specs.registry import resolve_model

PROF = load_profile("h100-80g-dgx")


def test_simulation_peaks_activations_plus_kept_outputs():
    # 1F1B on 2 ranks, 2 micro-batches; only the last stage keeps its outputs (1 unit each).
    res = simulate("1F1B", 2, 1, 2, [1.0, 1.0], [2.0, 2.0], kept=[0.0, 1.0])
    assert res.peak_in_flight == [2.0, 1.0]
    # Rank 1 runs F B F B: its second forward holds one activation set and two kept outputs (phase 2:
    # accumulating, a loss still live); after its last backward the two outputs stay.
    assert res.phases[1] == [(1.0, 1.0, 1.0), None, (1.0, 2.0, 1.0), (0.0, 2.0, 0.0)]
    assert all(p is None or p[1] == 0.0 for p in res.phases[0])
    plain = simulate("1F1B", 2, 1, 2, [1.0, 1.0], [2.0, 2.0])
    assert all(p is None or p[1] == 0.0 for ph in plain.phases for p in ph)
    assert plain.peak_in_flight == res.peak_in_flight


def _layout(**kw) -> Layout:
    base = dict(spec=resolve_model("llama3-8b"), gpus=16, seq_len=4096, global_batch=16, micro_batch=2,
                dtype="bf16", dp_replicate=1, dp_shard=2, tp=4, sp=True, async_tp=False, pp=2,
                schedule="1F1B", v=1, stage_layers=(16, 16), cp=1, ac="full", sac_ops=None, float8=False,
                reshard_after_forward=False, compile=True, pp_keeps_outputs=True)
    base.update(kw)
    return Layout(**base)


def test_kept_outputs_by_hand():
    lay = _layout()
    assert lay.n_micro == 4
    tokens = 2 * 4096
    hidden = tokens * 4096 * 2 / 4  # SP-sharded bf16 hidden state per micro-batch
    logits = tokens * 128256 / 4 * 2  # bf16, vocab sharded by loss parallel
    assert logits_bytes(lay) == logits
    est = estimate_layout(lay, PROF)
    first, last = est.per_rank_memory_gib
    # Rank 0 peaks at its last forward: 2 activation sets in flight, all 4 hidden outputs kept.
    assert est.pipeline["in_flight"][0] == 2.0
    assert first["pp_outputs"] == pytest.approx(4 * hidden / GIB)
    # The last stage keeps 4 micro-batches of logits; the current one is the loss transient's.
    assert last["pp_outputs"] == pytest.approx(3 * logits / GIB)
    units = kept_output_units(lay)
    assert units[1] * est.per_rank_memory_gib[1]["activations"] == pytest.approx(logits / GIB)
    without = estimate_layout(replace(lay, pp_keeps_outputs=False), PROF)
    assert "pp_outputs" not in without.per_rank_memory_gib[1]
    assert est.peak_memory_gib > without.peak_memory_gib
    assert est.step_time_s == without.step_time_s


def test_simulation_stops_when_a_rank_holds_more_than_its_limit():
    full = simulate("1F1B", 4, 1, 8, [1.0] * 4, [2.0] * 4)
    assert full.peak_in_flight == [4.0, 3.0, 2.0, 1.0] and not full.exceeded
    # Limits at the peaks: the run completes and is the same run.
    same = simulate("1F1B", 4, 1, 8, [1.0] * 4, [2.0] * 4, held_limit=[4.0, 3.0, 2.0, 1.0])
    assert not same.exceeded and same.makespan == full.makespan and same.peak_in_flight == full.peak_in_flight
    # Rank 1 may hold only 2: its third forward stops the simulation long before the end.
    stopped = simulate("1F1B", 4, 1, 8, [1.0] * 4, [2.0] * 4, held_limit=[9.0, 2.0, 9.0, 9.0])
    assert stopped.exceeded and stopped.makespan < full.makespan
