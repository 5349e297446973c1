"""Mixture-of-experts model specs: parameter counts by hand and against the publishers' totals, the
Hugging Face config import, and the refusals (a bad MoE field; an EP degree that cannot shard the experts;
what the runtime does not build yet)."""

from __future__ import annotations

import pytest

from meshplan.errors import InputError
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_file import from_hf_config
from meshplan.specs.plan import plan_from_dict
from meshplan.specs.registry import BUILTIN_MODELS, resolve_model
from meshplan.specs.rules import ep_fsdp, ep_reason, unsupported_fields


def test_mixtral_8x7b_by_hand_and_mistrals_totals():
    d, f, v, layers = 4096, 14336, 32000, 32
    attention = d * d + 2 * d * 1024 + d * d  # q, k, v (8 KV heads of 128), o
    expert = 3 * d * f
    layer = attention + d * 8 + 8 * expert + 2 * d  # router, 8 experts, two RMSNorms
    total = 2 * v * d + layers * layer + d  # untied embedding and output, final norm
    active = total - layers * 6 * expert  # 2 of 8 experts run
    m = BUILTIN_MODELS["mixtral-8x7b"]
    assert (m.num_params(), m.active_params()) == (total, active)
    # Mistral AI, "Mixtral of experts" (2024): 46.7B parameters, 12.9B active per token.
    assert round(total / 1e9, 1) == 46.7 and round(active / 1e9, 1) == 12.9


def test_deepseek_v3_by_hand_and_deepseeks_totals():
    d, heads, v = 7168, 128, 129280
    q = d * 1536 + 1536 + 1536 * heads * 192  # q down, its norm, q up to 128 heads of 128 nope + 64 rope
    kv = d * (512 + 64) + 512 + 512 * heads * (128 + 128)  # kv down + shared rope key, norm, k nope and v up
    o = heads * 128 * d
    attention = q + kv + o
    expert = 3 * d * 2048
    dense_layer = attention + 3 * d * 18432 + 2 * d
    moe_layer = attention + d * 256 + (256 + 1) * expert + 2 * d  # sigmoid router (bias is a buffer), 1 shared
    total = 2 * v * d + 3 * dense_layer + 58 * moe_layer + d
    active = total - 58 * (256 - 8) * expert
    m = BUILTIN_MODELS["deepseek-v3"]
    assert (m.num_params(), m.active_params()) == (total, active)
    # DeepSeek-V3 technical report: 671B total, 37B activated per token (without the 14B MTP module).
    # DeepSeek counts activated parameters without the embedding lookup (V2-Lite's 2.4B below says so).
    assert round(total / 1e9) == 671 and round((active - m.embedding_params()) / 1e9) == 37


@pytest.mark.parametrize("name, total_b, active_b, active_without_embedding, digits", [
    ("mixtral-8x22b", 141, 39, False, 0),      # Mistral AI: 141B, 39B active
    ("qwen3-30b-a3b", 30.5, 3.3, False, 1),    # Qwen3 technical report: 30B-A3B (30.5B, 3.3B on the model card)
    ("qwen3-235b-a22b", 235, 22, False, 0),    # Qwen3 technical report: 235B-A22B
    ("deepseek-v3-16b", 15.7, 2.4, True, 1),   # DeepSeek-V2-Lite's shape: 15.7B, 2.4B activated
    ("gpt-oss-120b", 116.8, 5.1, True, 1),     # OpenAI model card: 116.83B total, 5.13B active (no embedding)
])
def test_published_totals(name, total_b, active_b, active_without_embedding, digits):
    """Within the published figure's last digit: publishers round (Mistral) or truncate (Qwen's 3.35B
    reads 3.3B, DeepSeek's 2.45B reads 2.4B)."""
    m = BUILTIN_MODELS[name]
    active = m.active_params() - (m.embedding_params() if active_without_embedding else 0)
    unit = 10.0 ** -digits
    assert abs(m.num_params() / 1e9 - total_b) < unit
    assert abs(active / 1e9 - active_b) < unit


def test_tiny_moe_against_its_tensors():
    """Every tensor of tiny-moe listed as the runtime would hold it, summed."""
    shapes = [(256, 64), (256, 64), (64,)]  # embedding, output, final norm
    for layer in range(4):
        shapes += [(64, 64), (64, 32), (64, 32), (64, 64), (64,), (64,)]  # wq, wk, wv, wo, two norms
        if layer == 0:
            shapes += [(128, 64)] * 3  # the dense first layer's SwiGLU
        else:
            shapes += [(8, 64)] + [(8, 32, 64)] * 3 + [(32, 64)] * 3  # router, 8 experts' w1 w2 w3, shared expert
    count = sum(_numel(s) for s in shapes)
    m = BUILTIN_MODELS["tiny-moe"]
    assert m.num_params() == count
    assert m.num_params() - m.active_params() == 3 * (6 * 3 * 32 * 64)  # 6 of 8 experts idle in 3 MoE layers


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# config.json values as published on the Hugging Face hub.
HF_CONFIGS = {
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                     "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
                     "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                     "tie_word_embeddings": False, "rope_theta": 1e6, "max_position_embeddings": 32768},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                      "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
                      "head_dim": 128, "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
                      "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
                      "tie_word_embeddings": False, "rope_theta": 1e6, "max_position_embeddings": 40960,
                      "rms_norm_eps": 1e-6},
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
                    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
                    "vocab_size": 129280,
                    "tie_word_embeddings": False, "rope_theta": 10000, "max_position_embeddings": 163840,
                    "rms_norm_eps": 1e-6},
    "gpt-oss-120b": {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
                     "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 36,
                     "num_local_experts": 128, "num_experts_per_tok": 4, "vocab_size": 201088,
                     "attention_bias": True, "tie_word_embeddings": False, "rope_theta": 150000,
                     "max_position_embeddings": 131072, "sliding_window": 128, "swiglu_limit": 7.0,
                     "layer_types": ["sliding_attention", "full_attention"] * 18,
                     "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "original_max_position_embeddings": 4096}},
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_config_import_reads_moe_and_attention_fields(name):
    got, want = from_hf_config(HF_CONFIGS[name], name), BUILTIN_MODELS[name]
    fields = ("moe", "mla", "head_dim", "qk_norm", "attention_bias", "attention_sinks", "sliding_window",
              "full_attention_every", "rope_yarn_factor")
    assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields]
    assert (got.num_params(), got.active_params()) == (want.num_params(), want.active_params())


def test_yarn_is_read_from_rope_scaling_and_refused_in_one_line():
    """GPT-OSS's rope_scaling {rope_type: yarn, factor: 32}; the older key `type` alike; Llama 3's own
    scaling changes no kernel and is not kept; a factor that scales nothing is refused, as is running it."""
    from meshplan.errors import InputError
    from meshplan.specs.rules import model_runs_reason

    base = dict(HF_CONFIGS["qwen3-30b-a3b"])
    assert from_hf_config({**base, "rope_scaling": {"type": "yarn", "factor": 4}}, "m").rope_yarn_factor == 4.0
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    assert from_hf_config({**base, "rope_scaling": llama3}, "m").rope_yarn_factor is None
    with pytest.raises(InputError) as err:
        from_hf_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 1.0}}, "m")
    assert str(err.value).startswith("model.rope_scaling.factor: must be > 1.0") and "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        ModelSpec.from_dict({**BUILTIN_MODELS["qwen3-30b-a3b"].to_dict(), "rope_yarn_factor": "x"})
    assert str(err.value).startswith("model.rope_yarn_factor: must be a number")
    # Under MLA YaRN goes into the softmax scale: DeepSeek-V3's import reads as the registry's model.
    dsv3 = {**HF_CONFIGS["deepseek-v3"], "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0,
                                                          "mscale_all_dim": 1.0}}
    assert from_hf_config(dsv3, "deepseek-v3") == from_hf_config(HF_CONFIGS["deepseek-v3"], "deepseek-v3")
    assert from_hf_config(dsv3, "deepseek-v3").rope_yarn_factor is None
    yarn = from_hf_config({**base, "rope_scaling": {"type": "yarn", "factor": 4}}, "m")
    assert "YaRN" in model_runs_reason(yarn) and model_runs_reason(from_hf_config(base, "m")) is None


def test_specs_round_trip_and_dense_dicts_are_unchanged():
    for m in BUILTIN_MODELS.values():
        assert ModelSpec.from_dict(m.to_dict()) == m
    # GPT-OSS's SwiGLU is clamped at its swiglu_limit; an unclamped model's MoE dict carries no such key.
    assert BUILTIN_MODELS["gpt-oss-120b"].to_dict()["moe"]["activation_clamp"] == 7.0
    assert "activation_clamp" not in BUILTIN_MODELS["qwen3-30b-a3b"].to_dict()["moe"]
    # DeepSeek-V3's group-limited routing is written; an ungrouped model's MoE dict carries no such keys.
    assert BUILTIN_MODELS["deepseek-v3"].to_dict()["moe"]["expert_groups"] == 8
    assert "expert_groups" not in BUILTIN_MODELS["qwen3-30b-a3b"].to_dict()["moe"]
    assert sorted(BUILTIN_MODELS["llama3-8b"].to_dict()) == sorted(
        ["name", "arch", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "tied_embeddings",
         "max_seq_len", "norm_eps", "rope_theta"])


@pytest.mark.parametrize("edit, field", [
    ({"top_k": 9}, "model.moe.top_k"),
    ({"dense_layers_first": 4}, "model.moe.dense_layers_first"),
    ({"router": "argmax"}, "model.moe.router"),
    ({"experts": 0}, "model.moe.experts"),
    ({"activation_clamp": 0}, "model.moe.activation_clamp"),
    ({"activation_clamp": "seven"}, "model.moe.activation_clamp"),
    ({"expert_groups": 3}, "model.moe.expert_groups"),  # 8 experts in 3 groups
    ({"expert_groups": 16}, "model.moe.expert_groups"),
    ({"expert_groups": 4, "groups_per_token": 3}, "model.moe.groups_per_token"),  # more groups than top_k 2
    ({"expert_groups": 8, "groups_per_token": 1}, "model.moe.groups_per_token"),  # 1 expert, top_k 2
    ({"groups_per_token": 2}, "model.moe.groups_per_token"),  # more than its 1 group
])
def test_bad_moe_fields_name_themselves(edit, field):
    data = BUILTIN_MODELS["tiny-moe"].to_dict()
    data["moe"] = {**data["moe"], **edit}
    with pytest.raises(InputError) as err:
        resolve_model(data)
    assert err.value.field == field


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b"])
def test_a_moe_plan_loads_and_run_refuses_its_attention_in_one_line(name):
    """The runtime builds MoE layers (runtime/moe.py), MLA (runtime/mla.py) and Qwen3's wide heads with their
    q/k norms, but not GPT-OSS's windowed attention with biases and sinks."""
    partial = plan_from_dict({"model": name, "cluster": "h100-80g-dgx", "gpus": 8})
    assert partial.parallel.ep == 1  # a plan file that omits ep means 1
    plan = plan_from_dict({**_mesh(1, model=name), "compile": False,
                           "training": {"seq_len": 4096, "global_batch": 8, "micro_batch": 1},
                           "memory": {"activation_checkpointing": "none", "float8": False, "reshard_after_forward": True},
                           "parallel": {**_mesh(1)["parallel"], "sequence_parallel": False, "async_tp": False,
                                        "pp_schedule": "1F1B", "pp_virtual_stages": 1}})
    (field, why), *_ = unsupported_fields(plan, "nccl")
    assert field == "model" and name in why and "\n" not in why


@pytest.mark.parametrize("edits, field, words", [
    ({"compile": True}, "compile", "mixture-of-experts"),
    ({"tp": 2, "dp_shard": 4, "sequence_parallel": True}, "parallel.ep", "expert parallelism folding tp"),  # ep 1
    ({"tp": 2, "dp_shard": 4, "ep": 2}, "parallel.ep", "sequence_parallel: true"),
    ({"pp": 2, "dp_shard": 4, "pp_schedule": "InterleavedZeroBubble", "pp_virtual_stages": 2}, "parallel.pp_schedule",
     "splits backward"),
])
def test_what_the_moe_runtime_does_not_build_is_refused_in_one_line(edits, field, words):
    """tiny-moe runs (tests/runtime/test_moe_layouts.py), except compiled (the dispatch does not trace), TP
    other than TorchTitan's expert-TP 1 with SP (specs/rules.moe_tp_reason) and the split-backward schedules."""
    parallel = {**_mesh(1)["parallel"], "sequence_parallel": False, "async_tp": False, "pp_schedule": "1F1B",
                "pp_virtual_stages": 1}
    good = plan_from_dict(_moe_plan({**parallel, "dp_shard": 8, "ep": 2}))
    assert unsupported_fields(good, "nccl") == []
    parallel.update({k: v for k, v in edits.items() if k != "compile"})
    found = dict(unsupported_fields(plan_from_dict(_moe_plan(parallel, edits.get("compile", False))), "nccl"))
    assert words in found[field] and "\n" not in found[field]


def _moe_plan(parallel: dict, compile_: bool = False) -> dict:
    return {**_mesh(1), "compile": compile_, "parallel": parallel,
            "training": {"seq_len": 64, "global_batch": 8, "micro_batch": 1},
            "memory": {"activation_checkpointing": "none", "float8": False, "reshard_after_forward": True}}


def _mesh(ep, dp_shard=8, cp=1, tp=1, model="tiny-moe", gpus=8):
    return {"model": model, "cluster": "h100-80g-dgx", "gpus": gpus,
            "parallel": {"dp_replicate": 1, "dp_shard": dp_shard, "cp": cp, "tp": tp, "pp": 1, "ep": ep}}


@pytest.mark.parametrize("ep, dp_shard, cp, tp, words", [
    (3, 6, 1, 1, "must divide the routed experts (8)"),        # 8 experts: 3 does not divide them
    (16, 8, 1, 2, "must divide the routed experts (8)"),
    (2, 2, 4, 1, "multiple of cp*tp (4)"),                       # EP must take all of CP and TP ...
    (2, 2, 2, 2, "multiple of cp*tp (4)"),
    (2, 1, 1, 1, "dividing dp_shard*cp*tp (1)"),              # ... and fit inside dp_shard*cp*tp
])
def test_an_ep_that_cannot_shard_the_experts_is_refused(ep, dp_shard, cp, tp, words):
    with pytest.raises(InputError) as err:
        plan_from_dict(_mesh(ep, dp_shard, cp, tp, gpus=dp_shard * cp * tp))
    assert err.value.field == "parallel.ep" and words in str(err.value)


def test_ep_folds_into_dp_shard_cp_tp_by_hand():
    # 8 experts: ep 8 over dp_shard 4 x tp 2 (TorchTitan: ep % (cp*tp) == 0, (dp_shard*cp*tp) % ep == 0).
    assert ep_reason(BUILTIN_MODELS["tiny-moe"], 8, 4, 1, 2) is None
    assert ep_reason(BUILTIN_MODELS["tiny-moe"], 4, 4, 1, 2) is None
    assert ep_fsdp(4, 4, 1, 2) == 2 and ep_fsdp(8, 4, 1, 2) == 1 and ep_fsdp(1, 4, 1, 2) == 4
    assert "dense model" in ep_reason(BUILTIN_MODELS["llama3-8b"], 2, 2, 1, 1)
    with pytest.raises(InputError) as err:
        plan_from_dict({**_mesh(2, dp_shard=2), "model": "llama3-8b", "gpus": 2})
    assert err.value.field == "parallel.ep"


def test_top_k_above_the_experts_is_refused_in_a_plan():
    model = {**BUILTIN_MODELS["tiny-moe"].to_dict(), "name": "bad"}
    model["moe"] = {**model["moe"], "top_k": 9}
    with pytest.raises(InputError) as err:
        plan_from_dict({**_mesh(1), "model": model})
    assert err.value.field == "model.moe.top_k" and "at most experts (8)" in str(err.value)


def test_dense_plan_files_do_not_gain_an_ep_field():
    dense = plan_from_dict({"model": "llama3-8b", "cluster": "h100-80g-dgx", "gpus": 8})
    assert "ep" not in dense.to_dict()["parallel"]
    assert plan_from_dict(_mesh(8)).to_dict()["parallel"]["ep"] == 8


def test_sliding_window_layers_from_config():
    base = {**HF_CONFIGS["gpt-oss-120b"]}
    assert [from_hf_config(base, "g").attention_window(i) for i in range(4)] == [128, None, 128, None]
    everywhere = {k: v for k, v in base.items() if k != "layer_types"}  # Mistral-7B-v0.1's form
    assert from_hf_config(everywhere, "g").attention_window(1) == 128
    with pytest.raises(InputError) as err:
        from_hf_config({**base, "layer_types": ["full_attention", "sliding_attention"] + ["sliding_attention"] * 34}, "g")
    assert err.value.field == "model.layer_types"


@pytest.mark.parametrize("edit", [
    {"head_dim": {"a": 1}},
    {"sliding_window": 128, "layer_types": 5},
    {"sliding_window": "wide"},
    {"kv_lora_rank": 512, "qk_nope_head_dim": "x", "qk_rope_head_dim": 64, "v_head_dim": 128},
    {"num_local_experts": "many", "num_experts_per_tok": 2},
    {"num_local_experts": 8, "num_experts_per_tok": 9},
    {"num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0]},
])
def test_malformed_moe_configs_are_one_line_errors(edit):
    with pytest.raises(InputError):
        from_hf_config({**HF_CONFIGS["mixtral-8x7b"], **edit}, "m")
