"""What a float8 block casts per micro-batch (timing.float8_cast_elems), by hand on tiny-moe (dim 64, 4 heads of
16, 2 KV heads, dense MLP 128 in its first layer, 8 experts of width 32, top 2, one shared expert): every matmul's
input and output gradient per token (per routed pair for the routed experts), and the weights the rank holds,
its local experts' and not the top-k a token visits. torchao's Float8Linear (meshplan's runtime) casts them at
every forward; Transformer Engine under Megatron-Core keeps its float8 weights across a step's micro-batches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.cost_models.timing import float8_cast_elems
from meshplan.profiles import load_profile
from meshplan.specs.plan import plan_from_dict

GPU = "b200-180g-dgx"
SEQ = 128

# Per token: q 64+64, k and v 64+32 each, output 64+64 (448); the router 64+8 (72); one expert or the shared
# one, gate and up 64+32 each and down 32+64 (288); the dense MLP, gate and up 64+128 each and down 128+64 (576).
ATTENTION_TOKEN, ROUTER_TOKEN, EXPERT_TOKEN, DENSE_TOKEN = 448, 72, 288, 576
# Weights: attention 64x64 + 2 x 64x32 + 64x64; router 64x8; an expert 3 x 64x32; the dense MLP 3 x 64x128.
ATTENTION_W, ROUTER_W, EXPERT_W, DENSE_W = 12288, 512, 6144, 24576


def layout(stack: str, ep: int, global_batch: int):
    plan = plan_from_dict({
        "model": "tiny-moe", "cluster": GPU, "gpus": ep,
        "training": {"seq_len": SEQ, "global_batch": global_batch, "micro_batch": 1, "dtype": "bf16"},
        "parallel": {"dp_replicate": 1, "dp_shard": ep, "cp": 1, "tp": 1, "pp": 1, "ep": ep,
                     "sequence_parallel": False, "async_tp": False, "pp_schedule": "1F1B", "pp_virtual_stages": 1},
        "memory": {"activation_checkpointing": "none", "float8": True, "reshard_after_forward": False},
        "compile": False, "stack": stack})
    return runtime_paths(layout_of(plan), load_profile(GPU))


def test_an_moe_block_casts_its_local_experts_weights_each_forward_on_the_runtime():
    lay = layout("meshplan", ep=2, global_batch=8)
    assert not lay.float8_weight_cache
    per_token = ATTENTION_TOKEN + ROUTER_TOKEN + 2 * EXPERT_TOKEN + EXPERT_TOKEN  # top 2, then the shared expert
    # EP 2 leaves 4 of the 8 experts on the rank: 4 experts' weights, where a token visits 2
    weights = ATTENTION_W + ROUTER_W + EXPERT_W + 4 * EXPERT_W
    assert float8_cast_elems(lay, 3) == pytest.approx(SEQ * per_token + weights)
    # EP 8 leaves one: fewer weights than the two experts a token visits
    assert float8_cast_elems(replace(lay, ep=8), 3) == pytest.approx(SEQ * per_token + weights - 3 * EXPERT_W)


def test_megatron_core_casts_its_weights_once_a_step():
    lay = layout("megatron-core", ep=2, global_batch=8)
    assert lay.float8_weight_cache and lay.n_micro == 4  # 8 sequences over 2 data-parallel ranks, 1 at a time
    moe_token = ATTENTION_TOKEN + ROUTER_TOKEN + 3 * EXPERT_TOKEN
    assert float8_cast_elems(lay, 3) == pytest.approx(SEQ * moe_token + (ATTENTION_W + ROUTER_W + 5 * EXPERT_W) / 4)
    # the dense first layer: its own weights, a quarter of them a micro-batch
    assert float8_cast_elems(lay, 0) == pytest.approx(SEQ * (ATTENTION_TOKEN + DENSE_TOKEN) + (ATTENTION_W + DENSE_W) / 4)
    per_forward = replace(lay, float8_weight_cache=False)
    assert float8_cast_elems(per_forward, 0) == pytest.approx(SEQ * (ATTENTION_TOKEN + DENSE_TOKEN) + ATTENTION_W + DENSE_W)
