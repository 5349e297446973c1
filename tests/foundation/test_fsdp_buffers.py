"""The unsharded copies FSDP2 materialises, by hand from the model's shapes: a bf16 plan without data
parallelism runs fully_shard on one rank for its mixed precision (runtime/data_parallel.py), so it
holds the same bf16 copies as FSDP; an fp32 plan without data parallelism holds none."""

from __future__ import annotations

import pytest

from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import rank_memory
from meshplan.profiles.registry import load_profile
from meshplan.specs.registry import resolve_model

SPEC = resolve_model("llama3.2-1b")
D, F, KV, V = SPEC.dim, SPEC.ffn_dim, SPEC.kv_dim, SPEC.vocab_size
BLOCK = D * D * 2 + 2 * D * KV + 3 * D * F + 2 * D  # wq, wo, wk, wv, w1-w3, two RMSNorm weights
ROOT = V * D + D  # the embedding (tied with the head) and the final norm: one matrix on one device


def _fsdp_buffers(**kw) -> float:
    base = dict(spec=SPEC, gpus=1, seq_len=4096, global_batch=8, micro_batch=1, dtype="bf16", dp_replicate=1,
                dp_shard=1, tp=1, sp=False, async_tp=False, pp=1, schedule="1F1B", v=1, stage_layers=(16,), cp=1,
                ac="full", sac_ops=None, float8=False, reshard_after_forward=True, compile=False)
    base.update(kw)
    return rank_memory(Layout(**base), 0, 1.0, load_profile("h100-80g-dgx").overheads).parts["fsdp_buffers"]


def test_shapes_are_llama_3_2_1b():
    assert (D, F, KV, V, SPEC.n_layers) == (2048, 8192, 512, 128256, 16) and SPEC.tied_embeddings


def test_bf16_without_data_parallelism_holds_fully_shard_copies():
    # two blocks gathered in bf16 (the current and the prefetched one), one block's bf16 gradients, the root in bf16
    assert _fsdp_buffers() == pytest.approx(2 * BLOCK * 2 + BLOCK * 2 + ROOT * 2, rel=1e-12)


def test_float8_gathers_bf16_when_there_is_no_group():
    # the runtime enables float8 all-gather only for a shard group of 2 or more
    assert _fsdp_buffers(float8=True) == pytest.approx(_fsdp_buffers(), rel=1e-12)


def test_fp32_without_data_parallelism_holds_no_copy():
    assert _fsdp_buffers(dtype="fp32") == 0.0
