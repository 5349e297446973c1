"""Data-parallel gradient reductions per step, priced by hand: FSDP2 and DDP reduce after every
backward while micro-batches accumulate; a pipeline schedule, or Megatron's DDP, once per step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models.comm import collective_time
from meshplan.cost_models.estimate import _data_parallel_comm, _fsdp_span, group_spans
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import stage_params
from meshplan.profiles.registry import load_profile
from meshplan.specs.registry import resolve_model

PROF = load_profile("h100-80g-dgx")
NO_OVERLAP = replace(PROF, overheads=replace(PROF.overheads, fsdp_overlap=0.0))


def _layout(**kw) -> Layout:
    base = dict(spec=resolve_model("llama3-8b"), gpus=64, seq_len=8192, global_batch=256, micro_batch=1,
                dtype="bf16", dp_replicate=1, dp_shard=64, tp=1, sp=False, async_tp=False, pp=1,
                schedule="1F1B", v=1, stage_layers=(32,), cp=1, ac="full", sac_ops=None, float8=False,
                reshard_after_forward=True, compile=True)
    base.update(kw)
    return Layout(**base)


def _exposed(lay: Layout) -> float:
    return _data_parallel_comm(lay, NO_OVERLAP, group_spans(lay, NO_OVERLAP), 0, 1.0)[0]


def test_fsdp_reduce_scatters_every_micro_batch_by_hand():
    lay = _layout()
    assert lay.n_micro == 4 and lay.grad_reductions == 4
    sp = stage_params(lay, 0)
    span = _fsdp_span(group_spans(lay, PROF))
    units = sp.layers + 1
    gather = collective_time(PROF, "all_gather", sp.total * 2.0, span, calls=units)
    scatter = collective_time(PROF, "reduce_scatter", sp.total * 4.0, span, calls=units)
    tail = (collective_time(PROF, "all_gather", sp.block * 2.0, span)
            + collective_time(PROF, "reduce_scatter", sp.block * 4.0, span))
    # Resharded after forward: gathered in forward and again in backward, for each of 4 micro-batches.
    assert _exposed(lay) == pytest.approx(2 * 4 * gather + 4 * scatter + tail)
    # Megatron-style accumulation into local gradients: one reduce-scatter per step.
    assert _exposed(replace(lay, grad_sync="last_microbatch")) == pytest.approx(2 * 4 * gather + scatter + tail)


def test_pipeline_reduces_once_per_step():
    lay = _layout(pp=2, dp_shard=32, stage_layers=(16, 16))
    assert lay.n_micro == 8 and lay.grad_reductions == 1


def test_ddp_and_hsdp_all_reduce_every_micro_batch():
    ddp = _layout(dp_shard=1, dp_replicate=64)
    once = _exposed(replace(ddp, grad_sync="last_microbatch"))
    assert once > 0
    tail = collective_time(PROF, "all_reduce", stage_params(ddp, 0).block * 4.0, group_spans(ddp, PROF)["dp_replicate"])
    assert _exposed(ddp) == pytest.approx(4 * (once - tail) + tail)
    hsdp = _layout(dp_shard=8, dp_replicate=8)
    assert _exposed(hsdp) > _exposed(replace(hsdp, grad_sync="last_microbatch"))
