"""Layouts under test: tiny models, seq 32, global batch 8, fp32, and each again in bf16 (see
test_layouts.py)."""

from __future__ import annotations

import copy
from typing import Any

from plan_base import base_plan

BASE: dict[str, Any] = base_plan("tiny", "cpu-gloo")


def plan(model: str = "tiny", *, memory: dict | None = None, **parallel: Any) -> dict[str, Any]:
    """A complete plan mapping; gpus = product of the degrees given."""
    out = copy.deepcopy(BASE)
    out["model"] = model
    out["parallel"].update(parallel)
    out["memory"].update(memory or {})
    p = out["parallel"]
    out["gpus"] = p["dp_replicate"] * p["dp_shard"] * p["tp"] * p["pp"] * p["cp"]
    return out


def longer(case: dict[str, Any], seq_len: int) -> dict[str, Any]:
    """The same case on longer sequences (more activation memory per step, same buffers)."""
    out = copy.deepcopy(case)
    out["training"]["seq_len"] = seq_len
    return out


def pp(schedule: str, virtual: int, **kw: Any) -> dict[str, Any]:
    return plan("tiny-4l", pp=2, pp_schedule=schedule, pp_virtual_stages=virtual, **kw)


AC_SEQ_LEN = 128
TWO_RANK: dict[str, dict[str, Any]] = {
    "ddp": plan(dp_replicate=2),
    "fsdp2": plan(dp_shard=2),
    "fsdp2_no_reshard": plan(dp_shard=2, memory={"reshard_after_forward": False}),
    "tp_sp": plan(tp=2, sequence_parallel=True),
    "tp_nosp": plan(tp=2),
    "tp_sp_gpt": plan("tiny-gpt", tp=2, sequence_parallel=True),
    "fsdp2_gpt": plan("tiny-gpt", dp_shard=2),
    "pp_GPipe": pp("GPipe", 1),
    "pp_1F1B": pp("1F1B", 1),
    "pp_Interleaved1F1B": pp("Interleaved1F1B", 2),
    "pp_LoopedBFS": pp("LoopedBFS", 2),
    "pp_InterleavedZeroBubble": pp("InterleavedZeroBubble", 2),
    "pp_ZBVZeroBubble": pp("ZBVZeroBubble", 2),
    "pp_DualPipeV": pp("DualPipeV", 2),
    "pp_uneven_layers": plan("tiny-4l", pp=2, pp_schedule="1F1B", pp_layers=[1, 3]),
    "cp": plan(cp=2),
    "cp_gpt": plan("tiny-gpt", cp=2),
    # The activation-checkpointing trio runs seq 128 (see test_activation_checkpointing_lowers_peak_memory).
    "fsdp2_ac_none": longer(plan(dp_shard=2), AC_SEQ_LEN),
    "fsdp2_ac_full": longer(plan(dp_shard=2, memory={"activation_checkpointing": "full"}), AC_SEQ_LEN),
    "fsdp2_ac_selective": longer(plan(dp_shard=2, memory={"activation_checkpointing": "selective"}), AC_SEQ_LEN),
    "tp_sp_ac_selective_ops": plan(tp=2, sequence_parallel=True,
                                   memory={"activation_checkpointing": "selective", "sac_ops": ["attention", "ffn_out"]}),
}

FOUR_RANK: dict[str, dict[str, Any]] = {
    "fsdp2_4": plan(dp_shard=4),
    "hsdp_2x2": plan(dp_replicate=2, dp_shard=2),
    "fsdp_tp_2x2": plan(dp_shard=2, tp=2, sequence_parallel=True),
    "pp_fsdp_2x2": plan("tiny-4l", pp=2, dp_shard=2, pp_schedule="1F1B"),
    "cp_tp_2x2": plan(cp=2, tp=2, sequence_parallel=True),
}

FLOAT8: dict[str, dict[str, Any]] = {
    "fsdp2_float8": plan(dp_shard=2, memory={"float8": True}),
}


def in_bf16(case: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(case)
    out["training"]["dtype"] = "bf16"
    return out


# Every fp32 layout again in bf16 (FSDP2 mixed precision everywhere; float8 has its own test).
BF16: dict[str, dict[str, Any]] = {f"bf16_{k}": in_bf16(v) for k, v in TWO_RANK.items()}
BF16_FOUR_RANK: dict[str, dict[str, Any]] = {f"bf16_{k}": in_bf16(v) for k, v in FOUR_RANK.items()}


def reduced_in_bf16(case: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(case)
    out["memory"]["grad_reduce_dtype"] = "bf16"
    return out


# bf16 layouts whose gradients are reduced in bf16 (memory.grad_reduce_dtype), each beside its fp32-reduced twin
# in BF16 / BF16_FOUR_RANK: replicate's all-reduce, fully_shard's reduce-scatter, both (HSDP), and FSDP2's
# accumulation across a pipeline's micro-batches.
BF16_REDUCE: dict[str, dict[str, Any]] = {f"bf16_reduce_{k}": reduced_in_bf16(BF16[f"bf16_{k}"])
                                          for k in ("ddp", "fsdp2")}
BF16_REDUCE_FOUR_RANK: dict[str, dict[str, Any]] = {f"bf16_reduce_{k}": reduced_in_bf16(BF16_FOUR_RANK[f"bf16_{k}"])
                                                    for k in ("hsdp_2x2", "pp_fsdp_2x2")}


# Mixture-of-experts layouts (tiny-moe: 8 experts, top-2, a shared expert, one dense first layer), run with
# balanced routing (runtime/moe.py) so that every layout routes each token alike; test_moe_layouts.py.
def moe(**kw: Any) -> dict[str, Any]:
    return plan("tiny-moe", **kw)


# Qwen3-MoE's block at toy size: heads of 32 on a hidden size of 64 (4 heads: a query twice as wide as the
# hidden state) with per-head q/k RMSNorms, 8 experts top-2, no shared expert.
TINY_QWEN3_MOE = {"name": "tiny-qwen3-moe", "arch": "llama", "dim": 64, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2,
                  "attention_head_dim": 32, "qk_norm": True, "ffn_dim": 128, "vocab_size": 256, "max_seq_len": 256,
                  "rope_theta": 10000.0, "moe": {"experts": 8, "top_k": 2, "expert_ffn_dim": 32}}


def qwen3_moe(**parallel: Any) -> dict[str, Any]:
    out = plan(**parallel)
    out["model"] = copy.deepcopy(TINY_QWEN3_MOE)
    return out


MOE_TWO_RANK: dict[str, dict[str, Any]] = {
    "qwen3_ep2_fsdp2": qwen3_moe(dp_shard=2, ep=2),
    # DeepSeek's block at toy size: MLA, sigmoid router with the expert bias (runtime/mla.py, moe.py).
    "deepseek_ep2_fsdp2": plan("tiny-deepseek", dp_shard=2, ep=2),
    "moe_ep2_fsdp2": moe(dp_shard=2, ep=2),
    "moe_ep2_sac": moe(dp_shard=2, ep=2, memory={"activation_checkpointing": "selective"}),
    "moe_ep2_full_ac": moe(dp_shard=2, ep=2, memory={"activation_checkpointing": "full"}),
    "moe_ep2_cp2": moe(cp=2, ep=2),
    "moe_fsdp2_ep1": moe(dp_shard=2),
}
MOE_FOUR_RANK: dict[str, dict[str, Any]] = {
    "moe_ep4": moe(dp_shard=4, ep=4),
    "moe_ep2_fsdp4": moe(dp_shard=4, ep=2),
    "moe_ep2_tp2": moe(dp_shard=2, tp=2, sequence_parallel=True, ep=2),
    "moe_ep2_pp2_1F1B": moe(dp_shard=2, ep=2, pp=2, pp_schedule="1F1B"),
    "moe_ep2_pp2_Interleaved1F1B": moe(dp_shard=2, ep=2, pp=2, pp_schedule="Interleaved1F1B", pp_virtual_stages=2),
    "moe_ep2_pp2_GPipe": moe(dp_shard=2, ep=2, pp=2, pp_schedule="GPipe"),
    "moe_ep2_pp2_LoopedBFS": moe(dp_shard=2, ep=2, pp=2, pp_schedule="LoopedBFS", pp_virtual_stages=2),
    "moe_ep2_hsdp": moe(dp_replicate=2, dp_shard=2, ep=2),
    "deepseek_ep2_pp2_1F1B": plan("tiny-deepseek", dp_shard=2, ep=2, pp=2, pp_schedule="1F1B"),
    "qwen3_ep2_tp2": qwen3_moe(dp_shard=2, tp=2, sequence_parallel=True, ep=2),
}
