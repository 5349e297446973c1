"""When a pipelined rank's memory peaks: FSDP2's fp32 gradient accumulators of a stage exist only from
its first weight gradient on, and the last stage's loss buffers only until its last backward. The
schedule simulation records each rank's load per such phase; the peak is the heaviest phase."""

from __future__ import annotations

import pytest

from meshplan.cost_models.estimate import estimate_layout
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import GIB, activation_unit_bytes, rank_memory, stage_params
from meshplan.cost_models.pipeline import build_schedule, simulate
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import PP_SCHEDULES, SINGLE_STAGE_SCHEDULES
from meshplan.specs.registry import resolve_model

PROF = load_profile("h100-80g-dgx")
SPEC = resolve_model("llama3.2-1b")
D, F, KV, V = SPEC.dim, SPEC.ffn_dim, SPEC.kv_dim, SPEC.vocab_size
BLOCK = D * D * 2 + 2 * D * KV + 3 * D * F + 2 * D  # wq, wo, wk, wv, w1-w3, two RMSNorm weights


def test_phases_of_1f1b_by_hand():
    res = simulate("1F1B", 2, 1, 2, [1.0, 1.0], [2.0, 2.0])
    # (held, kept, live losses). Rank 0: F0 F1 (two held, nothing accumulated), B0 (accumulators
    # begin, one held), B1.
    assert res.phases[0] == [(2.0, 0.0, 0.0), None, (1.0, 0.0, 0.0), None]
    # Rank 1, the last stage: F0 (its loss computed), B0 (accumulators), F1 (one held again, its loss
    # alive), B1 (losses done).
    assert res.phases[1] == [(1.0, 0.0, 1.0), None, (1.0, 0.0, 1.0), (0.0, 0.0, 0.0)]


def test_phases_of_gpipe_by_hand():
    res = simulate("GPipe", 2, 1, 2, [1.0, 1.0], [2.0, 2.0])
    assert res.phases[0] == [(2.0, 0.0, 0.0), None, (1.0, 0.0, 0.0), None]
    # Both losses computed before either backward: both graphs alive at once.
    assert res.phases[1] == [(2.0, 0.0, 2.0), None, (1.0, 0.0, 1.0), (0.0, 0.0, 0.0)]


@pytest.mark.parametrize("schedule", PP_SCHEDULES)
def test_every_rank_ends_with_every_accumulator_and_no_loss_left(schedule):
    v = 1 if schedule in SINGLE_STAGE_SCHEDULES else 2
    pp, m = 4, 8
    sched = build_schedule(schedule, pp, v, m)
    res = simulate(schedule, pp, v, m, [1.0] * (pp * v), [2.0] * (pp * v), [1.0] * (pp * v))
    last = sched.rank_of[pp * v - 1]
    for r, phases in enumerate(res.phases):
        visited = [i for i, p in enumerate(phases) if p is not None]
        assert visited[0] == 0  # a rank starts with a forward, before any gradient
        assert visited[-1] == 2 * v + (1 if r == last else 0)
        # A phase's peak is never above the rank's overall peak of activations held.
        assert max(phases[i][0] for i in visited) == res.peak_in_flight[r]


def _layout(**kw) -> Layout:
    base = dict(spec=SPEC, gpus=4, seq_len=4096, global_batch=8, micro_batch=1, dtype="bf16", dp_replicate=1,
                dp_shard=2, tp=1, sp=False, async_tp=False, pp=2, schedule="GPipe", v=1, stage_layers=(8, 8),
                cp=1, ac="full", sac_ops=None, float8=False, reshard_after_forward=False, compile=False)
    base.update(kw)
    return Layout(**base)


def test_gpipe_rank_peaks_before_its_accumulators_or_after_by_hand():
    lay = _layout()
    assert lay.n_micro == 4
    est = estimate_layout(lay, PROF)
    first = est.per_rank_memory_gib[0]
    # fp32 accumulators of rank 0's 8 blocks and the embedding (tied, so the root's matrix is here).
    accumulators = 4.0 * (8 * BLOCK + V * D) / GIB
    assert stage_params(lay, 0).total == pytest.approx(8 * BLOCK + V * D)
    unit = activation_unit_bytes(lay, stage_params(lay, 0)) / GIB
    # GPipe runs all four forwards first: 4 sets and no accumulator, or after B0 3 sets and all of them.
    assert accumulators > unit  # so the second state is the heavier
    assert first["grad_accumulators"] == pytest.approx(accumulators, rel=1e-12)
    assert first["activations"] == pytest.approx(3 * unit, rel=1e-12)
    assert est.pipeline["in_flight"][0] == 4.0


def test_the_last_stage_sheds_its_loss_buffers_after_its_last_backward():
    lay = _layout()
    o = PROF.overheads
    tokens = 4096
    # bf16 logits, the saved fp32 log-softmax and its incoming and outgoing fp32 gradients (2 + 12 bytes a logit),
    # and the final norm's bf16 output the head matmul saved.
    loss = tokens * V * 14 + tokens * D * 2
    # Of it, a micro-batch keeps from its forward to its backward its bf16 logits (the cached stage
    # output), the fp32 log-softmax and the norm output: the rest is the backward's own.
    saved = tokens * V * 6 + tokens * D * 2
    live = rank_memory(lay, 1, 1.0, o, accumulating=1, loss_live=True, losses=1.0)
    with_loss = live.parts["transient"]
    without = rank_memory(lay, 1, 1.0, o, accumulating=1, loss_live=False, losses=0.0).parts["transient"]
    assert live.parts["losses"] == pytest.approx(saved, rel=1e-12)
    assert with_loss + live.parts["losses"] == pytest.approx(loss, rel=1e-12)
    # Without it only the recompute of one block remains, as on a rank without the head.
    assert without == rank_memory(lay, 0, 1.0, o, accumulating=1).parts["transient"] < with_loss
    # In the simulation the last rank enters its final phase (losses done) only after its last backward.
    res = simulate("GPipe", 2, 1, lay.n_micro, [1.0, 1.0], [2.0, 2.0])
    assert res.phases[1][3] == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("schedule", PP_SCHEDULES)
@pytest.mark.parametrize("n_micro", [1, 2, 8])
def test_the_planners_memory_bound_stays_below_the_simulated_peak(schedule, n_micro):
    from meshplan.planner.bounds import Bounds  # the planner's bound, checked against the cost model
    from meshplan.specs.rules import SPLIT_BACKWARD_SCHEDULES

    v = 1 if schedule in SINGLE_STAGE_SCHEDULES else 2
    if n_micro < 2 and schedule not in SINGLE_STAGE_SCHEDULES:
        pytest.skip("multi-stage schedules need a micro-batch per rank")
    lay = _layout(schedule=schedule, v=v, stage_layers=(16 // (2 * v),) * (2 * v), global_batch=2 * n_micro,
                  ac="none" if schedule in SPLIT_BACKWARD_SCHEDULES else "full")
    assert lay.n_micro == n_micro
    est = estimate_layout(lay, PROF)
    bound = Bounds(SPEC, PROF, usable_gib=0.0).rank_memory_bound_gib(lay)
    assert bound <= est.peak_memory_gib * (1 + 1e-12)


def test_only_phases_no_other_outweighs_are_priced():
    from meshplan.cost_models.memory import heaviest_phases

    phases = [(3.0, 0.0, 0.0), None, (2.0, 0.0, 0.0), (2.0, 0.0, 0.0), (1.0, 0.0, 0.0), (1.0, 1.0, 0.0)]
    # Phase 3 (one accumulator set, loss done) is matched by phase 2 (same held, loss live); phase 4
    # (two sets, loss live) and 5 (two sets, loss done, but an output kept) each beat the others somewhere.
    assert heaviest_phases(enumerate(phases)) == [(0, (3.0, 0.0, 0.0)), (2, (2.0, 0.0, 0.0)), (4, (1.0, 0.0, 0.0)),
                                                  (5, (1.0, 1.0, 0.0))]
    # Pricing only those gives the same peak as pricing all of them.
    lay = _layout(schedule="Interleaved1F1B", v=2, stage_layers=(4, 4, 4, 4))
    from meshplan.cost_models.memory import peak_rank_memory, phase_memory
    every = max(phase_memory(lay, 1, i, p, PROF.overheads).total for i, p in enumerate(phases) if p is not None)
    assert peak_rank_memory(lay, 1, phases, PROF.overheads).total == every


def test_gpipe_last_rank_holds_every_micro_batchs_loss_graph_by_hand():
    lay = _layout()  # GPipe, 4 micro-batches of 4096 tokens: the last stage computes 4 losses before any backward
    est = estimate_layout(lay, PROF)
    last = est.per_rank_memory_gib[1]
    tokens = 4096
    assert last["losses"] == pytest.approx(4 * (tokens * V * 6 + tokens * D * 2) / GIB, rel=1e-12)


def test_zero_bubble_holds_the_weight_pass_inputs_from_b_to_w_by_hand():
    from meshplan.cost_models.activations import activation_bytes_per_token
    from meshplan.cost_models.memory import weight_pass_share

    assert weight_pass_share(_layout()) == 1.0  # GPipe runs B and W together
    lay = _layout(schedule="InterleavedZeroBubble", v=2, stage_layers=(4, 4, 4, 4), ac="none")
    # Per token, on one rank without TP: the outputs of wq, wk, wv, wo, w1, w3, w2 and the two norms.
    outputs = D + 2 * KV + D + 2 * F + D + 2 * D
    held = activation_bytes_per_token(SPEC, 4096, 1, False, "none", None, 2.0)
    assert weight_pass_share(lay) == pytest.approx(1 + outputs * 2.0 / held, rel=1e-12)
    # The simulation holds 1 + that share of a set after a stage's B, until its W.
    res = simulate("InterleavedZeroBubble", 2, 2, 2, [1.0] * 4, [1.0] * 4, [1.0] * 4, w_memory_share=1.5)
    plain = simulate("InterleavedZeroBubble", 2, 2, 2, [1.0] * 4, [1.0] * 4, [1.0] * 4)
    assert max(res.peak_in_flight) > max(plain.peak_in_flight)
