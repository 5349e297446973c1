"""Data-parallel gradient reductions per step, priced by hand: FSDP2 and DDP reduce after every
backward while micro-batches accumulate; a pipeline schedule, or Megatron's DDP, once per step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models import forms
from meshplan.cost_models.comm import collective_time
from meshplan.cost_models.estimate import ComputeWindows, _data_parallel_comm, _fsdp_span, group_spans
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import stage_params
from meshplan.profiles.registry import load_profile
from meshplan.specs.registry import resolve_model

PROF = load_profile("h100-80g-dgx")
NO_OVERLAP = replace(PROF, overheads=replace(PROF.overheads, fsdp_overlap=0.0))


def _layout(**kw) -> Layout:
    """Llama 3 8B over 64 ranks; FSDP2's copies left out, so that the collectives are priced alone (the last
    test prices the copies)."""
    base = dict(spec=resolve_model("llama3-8b"), gpus=64, seq_len=8192, global_batch=256, micro_batch=1,
                dtype="bf16", dp_replicate=1, dp_shard=64, tp=1, sp=False, async_tp=False, pp=1,
                schedule="1F1B", v=1, stage_layers=(32,), cp=1, ac="full", sac_ops=None, float8=False,
                reshard_after_forward=True, compile=True, fsdp_copies=False)
    base.update(kw)
    return Layout(**base)


def _exposed(lay: Layout) -> float:
    return _data_parallel_comm(lay, NO_OVERLAP, group_spans(lay, NO_OVERLAP), 0, ComputeWindows(1.0))[0]


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


def _priced(lay: Layout, share: float, windows: ComputeWindows, slowdown: float = 0.0):
    from meshplan.cost_models.estimate import data_parallel_comm

    prof = replace(PROF, overheads=replace(PROF.overheads, fsdp_overlap=share, comm_compute_slowdown=slowdown))
    return data_parallel_comm(lay, prof, group_spans(lay, prof), 0, windows)


def test_each_stack_hides_data_parallel_traffic_under_its_own_window():
    """By hand from the issued collectives (the same with nothing hidden), 4 micro-batches (256 sequences
    over 64 ranks), FSDP resharding after forward: each micro-batch's forward hides its eighth of the
    gathers under share x one forward, its backward the other eighth and a quarter of the reductions under
    share x one backward. Megatron-Core's buckets hide the gathers under share x one micro-batch's forward
    and the reductions under share x its backward; Megatron-LM's local DDP hides nothing. The first gather
    and the last reduction stay exposed."""
    lay = _layout()
    assert lay.n_micro == 4 and lay.grad_reductions == 4
    w = ComputeWindows(busy=8.0, forward=0.5, backward=1.2)
    c = _priced(lay, 0.0, w)
    ag, rs, tail = c.all_gather, c.reduce_scatter, c.tail
    assert ag > 0 and rs > 0 and tail > 0
    prefetch = _priced(lay, 0.3, w)
    by_hand = 4 * max(0.0, ag / 8 - 0.3 * 0.5) + 4 * max(0.0, ag / 8 + rs / 4 - 0.3 * 1.2)
    assert prefetch.exposed == pytest.approx(by_hand + tail)
    assert prefetch.hidden == pytest.approx(ag + rs - by_hand)
    buckets = _priced(replace(lay, dp_overlap="buckets"), 0.3, w)
    assert buckets.exposed == pytest.approx(max(0.0, ag - 0.3 * 0.5) + max(0.0, rs - 0.3 * 1.2) + tail)
    assert buckets.hidden == pytest.approx(ag + rs - buckets.exposed + tail)
    none = _priced(replace(lay, dp_overlap="none"), 0.3, w)
    assert none.exposed == pytest.approx(ag + rs) and none.hidden == 0.0


def test_collectives_past_their_window_are_exposed_and_what_hides_slows_the_compute():
    """The 8B over 64 H100s, one micro-batch's windows set by hand. Windows longer than every collective:
    only the tails and the contention, 18.9 % of the hidden time, are paid. Windows of zero: everything
    issued is exposed and nothing slows the compute. Held parameters (no reshard) gather once, under the
    first micro-batch's forward alone; a once-per-step reduction (Megatron-style accumulation) runs under
    the last micro-batch's backward alone."""
    lay = _layout()
    c0 = _priced(lay, 1.0, ComputeWindows(0.0), 0.189)
    ag, rs, tail = c0.all_gather, c0.reduce_scatter, c0.tail
    assert c0.exposed == pytest.approx(ag + rs + tail) and c0.contention == 0.0
    with forms.forms(contention="hidden_time"):  # the kernel_work form: the test below
        wide = _priced(lay, 1.0, ComputeWindows(busy=100.0, forward=10.0, backward=15.0), 0.189)
    assert wide.exposed == pytest.approx(tail + 0.189 * (ag + rs))
    held = replace(lay, reshard_after_forward=False)
    g1 = _priced(held, 1.0, ComputeWindows(0.0)).all_gather
    assert g1 == pytest.approx(ag / 8)  # one gather a step against 2 x 4
    w = ComputeWindows(busy=4.0, forward=g1 / 2, backward=0.9)
    got = _priced(held, 1.0, w)
    assert got.beyond_windows == pytest.approx(g1 / 2 + 4 * max(0.0, rs / 4 - 0.9))
    once = replace(lay, grad_sync="last_microbatch")
    rs1 = _priced(once, 1.0, ComputeWindows(0.0)).reduce_scatter
    assert rs1 == pytest.approx(rs / 4)
    w = ComputeWindows(busy=4.0, forward=1.0, backward=rs1 / 2)
    got = _priced(once, 1.0, w)
    # backward of each micro-batch: its eighth of the gathers; the last one also the whole reduction
    by_hand = 4 * max(0.0, ag / 8 - 1.0) + 3 * max(0.0, ag / 8 - rs1 / 2) + max(0.0, ag / 8 + rs1 - rs1 / 2)
    assert got.beyond_windows == pytest.approx(by_hand)


def test_buckets_windows_are_one_micro_batch_of_the_critical_rank():
    """compute_windows: one micro-batch's forward and backward (input and weight) on the critical rank,
    from the stage durations by hand: 2 pipeline ranks, 1F1B, 8 micro-batches."""
    from meshplan.cost_models.estimate import compute_windows, step_parts

    lay = _layout(pp=2, dp_shard=32, stage_layers=(16, 16), dp_overlap="buckets")
    parts = step_parts(lay, PROF)
    d = parts.durations
    for rank in (0, 1):
        w = compute_windows(lay, parts, rank)
        assert w.forward == pytest.approx(d.forward[rank])
        assert w.backward == pytest.approx(d.backward[rank] + d.weight[rank])
        assert w.busy == pytest.approx(lay.n_micro * (w.forward + w.backward))


def test_the_pooled_alternative_hides_against_a_share_of_the_step_without_contention():
    """forms.py's pooled form (shipped until 2026-11-27, kept for nested cross-validation): every collective
    of FSDP's prefetch against share x the critical rank's work over the step, by hand; nothing slows the
    compute. Megatron-Core's buckets keep their one-micro-batch windows at that share."""

    lay = _layout()
    w = ComputeWindows(busy=8.0, forward=0.5, backward=1.2)
    c = _priced(lay, 0.0, w)
    ag, rs, tail = c.all_gather, c.reduce_scatter, c.tail
    with forms.forms(dp_overlap="pooled"):
        pooled = _priced(lay, 0.3, w, slowdown=0.189)
        buckets = _priced(replace(lay, dp_overlap="buckets"), 0.3, w, slowdown=0.189)
    assert pooled.exposed == pytest.approx(max(0.0, ag + rs - 0.3 * 8.0) + tail)
    assert pooled.contention == 0.0
    assert buckets.exposed == pytest.approx(max(0.0, ag - 0.3 * 0.5) + max(0.0, rs - 0.3 * 1.2) + tail)


def test_fsdp_overlap_is_fitted_under_the_pooled_form_only():
    """The windows form fits nothing about the overlap; the pooled one fits its share, on the spread of
    TorchTitan's and MosaicML's rows, as it was fitted when it shipped."""
    from meshplan.cost_models import constants
    from meshplan.cost_models.crossval import fit_targets

    name = "overheads.fsdp_overlap"
    assert name not in {t.constant.name for t in fit_targets()}
    assert constants.profile_constant(name).fitted_on == {}
    with forms.forms(dp_overlap="pooled"):
        targets = [t for t in fit_targets() if t.constant.name == name]
        assert [t.profile for t in targets] == [constants.EVERY_GPU]
        assert set(targets[0].tables) == set(constants.TORCHTITAN) | {constants.LLMFOUNDRY}
        assert targets[0].constant.objective == "spread"


def test_kernel_work_contention_prices_the_collectives_at_the_node_rate():
    """forms.py's kernel_work form (shipped; hidden_time the alternative): the compute slows by 18.9 % of
    the hidden collectives timed as if their group shared one node (the rate Lee et al. measured at). On
    one node that is the hidden time itself. With TP 8 filling each node, FSDP's group of 8 has one rank
    a node, and its collectives run at one NIC's 46 GB/s against NVLink's 360: the slower link stretches
    the collectives, not their kernels' work, so the contention is what the same gathers (8 a step) and
    reductions (4) cost on the node level."""
    from meshplan.cost_models.comm import GroupSpan

    wide = ComputeWindows(busy=100.0, forward=10.0, backward=15.0)
    one_node = _layout(gpus=8, dp_shard=8, global_batch=32)
    across = _layout(dp_shard=8, tp=8, sp=True, global_batch=32)
    with forms.forms(contention="kernel_work"):
        node_kernel = _priced(one_node, 1.0, wide, 0.189)
        cross_kernel = _priced(across, 1.0, wide, 0.189)
    with forms.forms(contention="hidden_time"):
        node_time = _priced(one_node, 1.0, wide, 0.189)
        cross_time = _priced(across, 1.0, wide, 0.189)
    assert node_kernel.contention == pytest.approx(node_time.contention) and node_time.contention > 0
    assert cross_time.contention == pytest.approx(0.189 * (cross_time.all_gather + cross_time.reduce_scatter))
    sp = stage_params(across, 0)
    on_node, units = GroupSpan(8, 8), sp.layers + 1
    assert across.n_micro == 4 and _fsdp_span(group_spans(across, PROF)).ranks_per_node == 1
    by_hand = (8 * collective_time(PROF, "all_gather", sp.total * 2.0, on_node, calls=units)
               + 4 * collective_time(PROF, "reduce_scatter", sp.total * 4.0, on_node, calls=units))
    assert cross_kernel.contention == pytest.approx(0.189 * by_hand)
    assert cross_kernel.contention < cross_time.contention * 46 / 360 * 1.1  # bandwidths, latency apart
    assert cross_kernel.exposed - cross_kernel.contention == pytest.approx(cross_time.exposed - cross_time.contention)


def test_fsdp2_copies_priced_by_hand_on_the_compute_stream():
    """FSDP2's copies (forms.py fsdp_copies counted): per micro-batch two gathers (forward, and backward after
    resharding), each copying the gathered bf16 buffer out into the unsharded parameters (read 2 + write 2
    bytes a parameter), and one reduction whose copy-in reads the bf16 gradients and writes the fp32
    reduce-scatter input (2 + 4). 4 micro-batches: 4 x (2 x 4 + 6) = 56 bytes a local parameter, at the
    memory-bound rate, exposed whatever the windows hide."""
    lay = _layout(fsdp_copies=True)
    params = stage_params(lay, 0).total
    dev = PROF.device
    by_hand = params * 56 / (dev.memory_bandwidth_gbs * 1e9 * dev.memory_bound_efficiency)
    with forms.forms(fsdp_copies="none"):
        none = _exposed(lay)
    with forms.forms(fsdp_copies="counted"):
        counted = _exposed(lay)
        # FSDP1's flat parameter (Composer, fms-fsdp) gathers into the buffer its parameters view: no copies.
        flat = _exposed(replace(lay, fsdp_copies=False))
        # Held parameters are gathered once a step: 1 x (2 x 2) + 4 x 6 = 28 bytes a parameter.
        held = _exposed(replace(lay, reshard_after_forward=False)) - _exposed(
            replace(lay, reshard_after_forward=False, fsdp_copies=False))
        # float8 all-gather: one byte a parameter gathered and copied out.
        f8 = _exposed(replace(lay, float8=True)) - _exposed(replace(lay, float8=True, fsdp_copies=False))
    assert counted - none == pytest.approx(by_hand)
    assert flat == pytest.approx(none)
    assert held == pytest.approx(by_hand * 28 / 56)
    assert f8 == pytest.approx(by_hand * (4 * (2 * 2 * 1) + 4 * 6) / 56)


def test_fsdp2_copies_left_to_a_cpu_profiles_calibrated_terms():
    """The form was chosen on GPU rows; a CPU (gloo) profile keeps what it was calibrated under."""
    cpu = load_profile("cpu-gloo")
    lay = _layout(fsdp_copies=True, gpus=4, dp_shard=4, global_batch=16)

    def exposed() -> float:
        return _data_parallel_comm(lay, cpu, group_spans(lay, cpu), 0, ComputeWindows(1.0))[0]

    with forms.forms(fsdp_copies="none"):
        none = exposed()
    with forms.forms(fsdp_copies="counted"):
        assert exposed() == pytest.approx(none)


def test_fsdp2_copies_only_what_fsdp_gathers_under_expert_parallelism():
    """Under EP the routed experts are FSDP-sharded only where their own group (ep_fsdp) has more than one
    rank: EP over all 8 ranks leaves it at one, so only the dense parameters are gathered, reduced and copied;
    EP 2 of 8 shards the experts over 4 and copies them too."""
    def copies(ep: int) -> tuple[float, float]:
        lay = _layout(spec=resolve_model("qwen3-30b-a3b"), gpus=8, dp_shard=8, global_batch=16, ep=ep,
                      stage_layers=(48,), fsdp_copies=True)
        sp = stage_params(lay, 0)
        with forms.forms(fsdp_copies="counted"):
            c = _priced(lay, 0.0, ComputeWindows(1.0))
        assert lay.routed_fsdp_shard == 8 // ep
        return c.copies, sp.routed

    per_byte = 1 / (PROF.device.memory_bandwidth_gbs * 1e9 * PROF.device.memory_bound_efficiency)
    lay = _layout(spec=resolve_model("qwen3-30b-a3b"), gpus=8, dp_shard=8, global_batch=16, stage_layers=(48,))
    per_param = 2 * lay.n_micro * 2 * 2.0 + lay.n_micro * (2.0 + 4.0)  # bf16 gathers, fp32 reductions
    full_ep, routed8 = copies(8)
    half_ep, routed2 = copies(2)
    total = stage_params(replace(lay, ep=8), 0).total
    assert full_ep == pytest.approx((total - routed8) * per_param * per_byte)
    assert half_ep == pytest.approx(stage_params(replace(lay, ep=2), 0).total * per_param * per_byte)
    assert routed8 > 0


def test_one_rank_fully_shard_copies_by_hand():
    """A bf16 plan without FSDP on meshplan's runtime still runs fully_shard on one rank for its mixed
    precision (Layout.fsdp_one_rank): no collective, but each unshard casts the fp32 parameters to bf16
    (read 4 + write 2 bytes) and copies them into the unsharded ones (2 + 2), and each reduction copies the
    bf16 gradients into the fp32 reduce input (2 + 4). One GPU, 4 micro-batches resharded after forward:
    8 x 10 + 4 x 6 = 104 bytes a parameter, exposed whole (nothing to hide behind); with float8's one-byte
    cast and copy 8 x 7 + 24 = 80. TorchTitan's stack (autocast on one device) and fp32 plans copy nothing."""
    lay = _layout(gpus=1, dp_shard=1, global_batch=4, fsdp_copies=True, fsdp_one_rank=True)
    params = stage_params(lay, 0).total
    per_byte = 1 / (PROF.device.memory_bandwidth_gbs * 1e9 * PROF.device.memory_bound_efficiency)
    with forms.forms(fsdp_copies="counted"):
        c = _priced(lay, 0.0, ComputeWindows(1.0))
        assert c.total == 0.0 and c.copies == pytest.approx(params * 104 * per_byte, rel=1e-12)
        assert c.exposed == c.copies and c.fsdp_share == 1.0
        f8 = _priced(replace(lay, float8=True), 0.0, ComputeWindows(1.0)).copies
        assert f8 == pytest.approx(params * 80 * per_byte, rel=1e-12)
        assert _priced(replace(lay, fsdp_one_rank=False), 0.0, ComputeWindows(1.0)).copies == 0.0
        assert _priced(replace(lay, dtype="fp32"), 0.0, ComputeWindows(1.0)).copies == 0.0
        # DDP replicas use replicate, not fully_shard: their all-reduce, no copies.
        ddp = _priced(replace(lay, gpus=2, dp_replicate=2, global_batch=8), 0.0, ComputeWindows(1.0))
        assert ddp.copies == 0.0 and ddp.all_reduce > 0
    with forms.forms(fsdp_copies="none"):
        assert _priced(lay, 0.0, ComputeWindows(1.0)).copies == 0.0


def test_megatron_cores_interleaved_schedule_syncs_a_chunk_at_a_time():
    """Megatron-Core's interleaved schedule gathers and reduces one model chunk at a time, each queued beside
    the passes of the chunks after it (estimate.chunked_exposure). By hand: 7 chunks, groups of 4 passes,
    0.1 s of reductions against a 0.028 s backward: the chunk reduced last waits 0.1/7 - 0.028/7 = 0.0103 s,
    the others hide, where one window would leave 0.1 - 0.028 = 0.072 s. A backlog builds where each
    chunk's share outlasts the passes between: 0.1 against 0.007 leaves 7 x 0.1/7 - 25 x 0.007/7 = 0.075.
    One chunk, or no pipeline, keeps the one window. Then the layout: PP 4 x VP 2 over 64 ranks, 8
    micro-batches, gathers under groups of 4 forwards."""
    from meshplan.cost_models.estimate import chunked_exposure

    assert chunked_exposure(0.1, 0.028, 7, 4) == pytest.approx(0.1 / 7 - 0.028 / 7)
    assert chunked_exposure(0.1, 0.007, 7, 4) == pytest.approx(0.1 - 25 * 0.007 / 7)
    assert chunked_exposure(0.1, 0.028, 1, 4) == pytest.approx(0.1 - 0.028)
    assert chunked_exposure(0.01, 0.028, 7, 4) == 0.0
    lay = _layout(pp=4, dp_shard=16, v=2, schedule="Interleaved1F1B", stage_layers=(4,) * 8, dp_overlap="buckets")
    assert lay.n_micro == 16
    w = ComputeWindows(busy=8.0, forward=0.002, backward=0.004)
    got = _priced(lay, 1.0, w)
    ag, rs = got.all_gather, got.reduce_scatter
    by_hand = (max(0.0, ag / 2 - 0.002 / 2, 2 * ag / 2 - 5 * 0.002 / 2)
               + max(0.0, rs / 2 - 0.004 / 2, 2 * rs / 2 - 5 * 0.004 / 2))
    assert got.beyond_windows == pytest.approx(by_hand)
    flat = _priced(replace(lay, v=1, schedule="1F1B", stage_layers=(8,) * 4), 1.0, w)
    one_window = max(0.0, flat.all_gather - 0.002) + max(0.0, flat.reduce_scatter - 0.004)
    assert flat.beyond_windows == pytest.approx(one_window)
