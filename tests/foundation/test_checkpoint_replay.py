"""Full AC's eager replay as each stack's checkpoint runs it (forms.py checkpoint_replay): PyTorch's
non-reentrant checkpoint stops once every tensor the forward saved is recomputed, so a dense block's last
matmul (ffn_out) is not run again (tests/runtime/test_activation_checkpoint.py counts it on the runtime's
block); Megatron's CheckpointFunction replays the whole forward; an MoE layer's replay runs to its end."""

from __future__ import annotations

import pytest

from meshplan.cost_models import forms
from meshplan.cost_models.estimate import _recompute_flops_per_token, group_spans
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.timing import block_compute, block_time
from meshplan.profiles.registry import load_profile
from layout_base import fsdp8_layout

PROF = load_profile("h100-80g-dgx")


_layout = fsdp8_layout


def _recompute(lay: Layout, replay: str, layer: int | None = None) -> float:
    with forms.forms(checkpoint_replay=replay):
        return block_time(lay, PROF, group_spans(lay, PROF), layer).recompute


def test_eager_full_replay_leaves_out_the_dense_blocks_last_matmul():
    lay = _layout()
    ffn_out = block_compute(lay, PROF).matmul_by_kind["ffn_out"]
    assert ffn_out > 0
    assert _recompute(lay, "whole") - _recompute(lay, "early_stop") == pytest.approx(ffn_out, rel=1e-12)
    # The model FLOPs recompute adds per token (HFU) follow: 2 x dim x ffn_dim a layer less (SwiGLU's w2).
    spec = lay.spec
    with forms.forms(checkpoint_replay="whole"):
        whole = _recompute_flops_per_token(lay, True)
    with forms.forms(checkpoint_replay="early_stop"):
        stopped = _recompute_flops_per_token(lay, True)
    assert whole - stopped == pytest.approx(spec.n_layers * 2 * spec.dim * spec.ffn_dim, rel=1e-12)


def test_megatron_replay_and_compiled_blocks_are_unchanged():
    megatron = _layout(checkpoint_early_stop=False)
    assert _recompute(megatron, "early_stop") == pytest.approx(_recompute(megatron, "whole"), rel=1e-12)
    # Compiled, the partitioner never ran ffn_out again: the form changes nothing there.
    compiled = _layout(compile=True)
    assert _recompute(compiled, "early_stop") == pytest.approx(_recompute(compiled, "whole"), rel=1e-12)


def test_an_moe_layers_replay_runs_to_its_end():
    lay = _layout("qwen3-30b-a3b")
    moe_layer = next(i for i in range(lay.spec.n_layers) if lay.spec.is_moe_layer(i))
    assert _recompute(lay, "early_stop", moe_layer) == pytest.approx(_recompute(lay, "whole", moe_layer), rel=1e-12)


def test_a_cpu_profile_keeps_the_whole_replay():
    """The form was chosen on GPU rows; the CPU profile keeps what its terms were calibrated under."""
    cpu = load_profile("cpu-gloo")
    lay = _layout("tiny", gpus=2, dp_shard=2, global_batch=4, micro_batch=1, seq_len=128)
    with forms.forms(checkpoint_replay="whole"):
        whole = block_time(lay, cpu, group_spans(lay, cpu)).recompute
    with forms.forms(checkpoint_replay="early_stop"):
        assert block_time(lay, cpu, group_spans(lay, cpu)).recompute == pytest.approx(whole, rel=1e-12)
