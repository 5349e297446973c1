"""The cross-entropy each stack runs, priced by the bytes its kernels move (timing.loss_times): eager
PyTorch's upcast and log-softmax (about loss_passes x 4 bytes a logit each way), Inductor's compiled loss
(4 and 4, forms.py compiled_loss "fused"; tests/runtime/test_compiled_loss_bytes.py counts them on Inductor),
Transformer Engine's fused Triton loss in place over the bf16 logits (6 forward: two reads and the
gradient written; 4 backward: the gradient scaled in place), and flash-attn's CUDA cross-entropy (4 forward:
two reads; 4 backward: one read, the gradient written to a new buffer). A trainer's metric losses (Composer's)
add an eager forward each after the backward. Checked by hand against the memory-bound rate."""

from __future__ import annotations

import pytest

from meshplan.cost_models import constants, forms
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import (ONE_RANK_PHASES, head_input_bytes, loss_buffer_bytes, loss_saved_bytes,
                                         peak_rank_memory, training_metric_memory)
from meshplan.cost_models.timing import head_time, loss_times
from meshplan.profiles.registry import load_profile
from layout_base import fsdp8_layout

GPU = load_profile("h100-80g-dgx")
CPU = load_profile("cpu-gloo")


def _layout(**kw) -> Layout:
    return fsdp8_layout(**{"ac": "none", **kw})


def _seconds_per_byte(prof) -> float:
    dev = prof.device
    return 1.0 / (dev.memory_bandwidth_gbs * 1e9 * dev.memory_bound_efficiency)


LOGITS = 2 * 4096 * 128256  # one micro-batch of two 4k sequences over Llama 3's vocabulary


def test_eager_loss_moves_the_fp32_passes_each_way():
    per = constants.MODEL.loss_passes * 4 * _seconds_per_byte(GPU)
    fwd, bwd = loss_times(_layout(), GPU, LOGITS)
    assert (fwd, bwd) == pytest.approx((LOGITS * per, LOGITS * per), rel=1e-12)


def test_compiled_loss_fused_moves_four_bytes_a_logit_each_way():
    lay = _layout(compile=True)
    assert lay.loss_compiled
    with forms.forms(compiled_loss="fused"):
        fwd, bwd = loss_times(lay, GPU, LOGITS)
    assert (fwd, bwd) == pytest.approx((4 * LOGITS * _seconds_per_byte(GPU),) * 2, rel=1e-12)
    # Four times less than the eager passes: the head's forward and backward lose the difference.
    eager = loss_times(_layout(), GPU, LOGITS)[0]
    assert eager / fwd == pytest.approx(constants.MODEL.loss_passes, rel=1e-12)
    with forms.forms(compiled_loss="speedup"):
        slow = head_time(lay, GPU)
    with forms.forms(compiled_loss="fused"):
        fast = head_time(lay, GPU)
    assert slow.forward - fast.forward == pytest.approx(eager / GPU.overheads.compile_speedup - fwd, rel=1e-9)


def test_compiled_loss_under_tp_or_on_a_cpu_keeps_its_speedup():
    with forms.forms(compiled_loss="fused"):
        # Under TP loss parallel runs eager (specs/rules.py loss_compiled): the eager passes.
        tp = _layout(compile=True, tp=2, dp_shard=4)
        assert loss_times(tp, GPU, LOGITS) == loss_times(_layout(tp=2, dp_shard=4), GPU, LOGITS)
        # A CPU profile's calibrated terms carry its compiled loss: eager bytes over compile_speedup.
        fwd, _ = loss_times(_layout(compile=True), CPU, LOGITS)
    expected = LOGITS * constants.MODEL.loss_passes * 4 / CPU.overheads.compile_speedup * _seconds_per_byte(CPU)
    assert fwd == pytest.approx(expected, rel=1e-12)


def test_transformer_engine_loss_reads_twice_and_writes_once_forward_scales_in_place_backward():
    lay = _layout(loss_kernel="te")
    fwd, bwd = loss_times(lay, GPU, LOGITS)
    assert fwd == pytest.approx((2 + 2 + 2) * LOGITS * _seconds_per_byte(GPU), rel=1e-12)
    assert bwd == pytest.approx((2 + 2) * LOGITS * _seconds_per_byte(GPU), rel=1e-12)
    # In place: the logits' storage holds the gradient, nothing else a logit.
    logits = 2 * 4096 * lay.spec.vocab_size
    assert loss_buffer_bytes(lay) == pytest.approx(2 * logits + head_input_bytes(lay), rel=1e-12)
    assert loss_saved_bytes(lay) == pytest.approx(2 * logits + head_input_bytes(lay), rel=1e-12)
    assert loss_buffer_bytes(_layout()) > 7 * logits  # eager: fp32 log-softmax and gradients besides


def test_flash_attn_loss_reads_twice_forward_reads_and_writes_once_backward():
    lay = _layout(loss_kernel="xentropy")
    fwd, bwd = loss_times(lay, GPU, LOGITS)
    assert fwd == pytest.approx((2 + 2) * LOGITS * _seconds_per_byte(GPU), rel=1e-12)
    assert bwd == pytest.approx((2 + 2) * LOGITS * _seconds_per_byte(GPU), rel=1e-12)
    # Not in place: the bf16 logits and their bf16 gradient at the backward's peak; the logits alone saved.
    logits = 2 * 4096 * lay.spec.vocab_size
    assert loss_buffer_bytes(lay) == pytest.approx(4 * logits + head_input_bytes(lay), rel=1e-12)
    assert loss_saved_bytes(lay) == pytest.approx(2 * logits + head_input_bytes(lay), rel=1e-12)


def test_metric_losses_add_an_eager_forward_each_after_the_backward():
    """Two metric losses: the head's backward grows by two eager forward passes over the logits
    (loss_passes x 4 bytes each), its forward not at all."""
    base, metered = _layout(loss_kernel="xentropy"), _layout(loss_kernel="xentropy", metric_losses=2)
    logits = 2 * 4096 * base.spec.vocab_size
    one = logits * constants.MODEL.loss_passes * 4 * _seconds_per_byte(GPU)
    a, b = head_time(base, GPU), head_time(metered, GPU)
    assert b.forward == a.forward
    assert b.backward - a.backward == pytest.approx(2 * one, rel=1e-9)


def test_metric_losses_phase_holds_states_and_one_metrics_fp32_buffers():
    """After the backward: no activations, the model states, and over the bf16 logits one metric's fp32
    upcast and log-softmax (2 + 4 + 4 bytes a logit); with a vocabulary this much wider than the model's
    few layers' activations, that phase is the step's peak."""
    lay = _layout(model="llama3-8b", loss_kernel="xentropy", metric_losses=2, ac="full")
    mem = training_metric_memory(lay, 0, GPU.overheads)
    logits = 2 * 4096 * lay.spec.vocab_size
    assert mem.parts["transient"] == pytest.approx(10 * logits, rel=1e-12)
    assert "activations" not in mem.parts
    assert training_metric_memory(_layout(loss_kernel="xentropy"), 0, GPU.overheads) is None
    # Full AC keeps one block input a layer: the metrics' 10 bytes a logit outweigh the step's other phases.
    peak = peak_rank_memory(lay, 0, ONE_RANK_PHASES[0], GPU.overheads)
    assert peak.total == pytest.approx(mem.total, rel=1e-12)
