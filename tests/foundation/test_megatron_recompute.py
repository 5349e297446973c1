"""Megatron-Core's selective recompute by module (the plan's memory.recompute_modules on stack megatron-core):
what each module leaves out of a block's saved tensors and what it runs again, by hand; the field's
one-line refusals; the published rows carrying their recipes' modules."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models.activations import PYTORCH, activation_bytes_per_token
from meshplan.cost_models.compute import attention_tflops, matmul_time, memory_bound_time
from meshplan.cost_models.estimate import estimate_plan, group_spans
from meshplan.cost_models.layout import Layout, layout_of
from meshplan.cost_models.published import moe_blackwell_rows
from meshplan.cost_models.stacks import MegatronRecompute
from meshplan.cost_models.timing import block_compute, megatron_recompute_time
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import plan_from_dict
from meshplan.specs.registry import resolve_model

from test_moe_costs import D, F, K, ONE_LAYER, PROF, SHARED  # one MoE block: GQA 4 heads / 2 KV of 16

TOKENS = 128  # seq 128, micro-batch 1, no CP

RAW = {"version": 1, "model": "llama3-8b", "cluster": "h100-80g-dgx", "gpus": 8, "stack": "megatron-core",
       "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "dtype": "bf16"},
       "parallel": {"dp_replicate": 1, "dp_shard": 8, "tp": 1, "sequence_parallel": False, "async_tp": False,
                    "pp": 1, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "cp": 1},
       "memory": {"activation_checkpointing": "selective", "float8": False, "reshard_after_forward": True},
       "compile": False}


def _plan(memory: dict | None = None, **top):
    return plan_from_dict({**RAW, **top, "memory": {**RAW["memory"], **(memory or {})}})


def _layout(spec: ModelSpec = ONE_LAYER, modules: tuple[str, ...] = (), **kw) -> Layout:
    base = dict(spec=spec, gpus=8, seq_len=TOKENS, global_batch=16, micro_batch=1, dtype="bf16", dp_replicate=1,
                dp_shard=8, tp=1, sp=False, async_tp=False, pp=1, schedule="1F1B", v=1,
                stage_layers=(spec.n_layers,), cp=1, ac="selective" if modules else "none",
                sac_ops=MegatronRecompute(modules) if modules else None, float8=False, reshard_after_forward=True,
                compile=False, elementwise_kernels="megatron")
    base.update(kw)
    return Layout(**base)


def _kept(modules: tuple[str, ...], spec: ModelSpec = ONE_LAYER, layer: int = 0) -> float:
    ac, sac = ("selective", MegatronRecompute(modules)) if modules else ("none", None)
    return activation_bytes_per_token(spec, TOKENS, 1, False, ac, sac, 2.0, PYTORCH, layer)


DENSE = ModelSpec.from_dict({**ONE_LAYER.to_dict(), "name": "one-dense-layer", "moe": None})


@pytest.mark.parametrize("spec, modules, dropped", [
    (ONE_LAYER, ("layernorm",), D),  # the pre-MLP norm's output; GQA's attention norm is fused into linear_qkv
    (ONE_LAYER, ("moe_act",), K * F),  # the routed experts' SwiGLU product, per pair
    (ONE_LAYER, ("shared_experts",), 3 * SHARED * F),  # the shared expert's gate, up and product
    (ONE_LAYER, ("core_attn",), D),  # the output SDPA keeps (the output projection keeps its own copy)
    (ONE_LAYER, ("layernorm", "moe_act"), D + K * F),
    (ONE_LAYER, ("mlp",), 0),  # an MoE layer's MLP is no dense MLP
    (DENSE, ("layernorm",), 0),  # both of a dense GQA block's norms are fused into the next GEMM
    (DENSE, ("mlp",), 4 * 128 + D),  # gate, up, SiLU and product (ffn 128), and fc1's fused norm's output
    (DENSE, ("moe_act",), 0),
])
def test_each_module_drops_its_outputs_by_hand(spec, modules, dropped):
    """bf16, tp 1, one block: what a module's recompute leaves out of what the block keeps without AC,
    elements per token by hand (the ONE_LAYER tensors of test_moe_costs)."""
    assert _kept((), spec) - _kept(modules, spec) == pytest.approx(2.0 * dropped, rel=1e-12)


def test_layernorm_recomputes_mlas_own_attention_norm_and_an_moe_layers_mlp_norm():
    """DeepSeek-V3: MLA's input norm is a module of its own (its spec does not fuse it), so layernorm drops
    it in every block; the pre-MLP norm only before an MoE layer (the first three blocks are dense)."""
    spec = resolve_model("deepseek-v3")
    dense, moe = 0, 3
    assert _kept((), spec, dense) - _kept(("layernorm",), spec, dense) == pytest.approx(2.0 * spec.dim, rel=1e-12)
    assert _kept((), spec, moe) - _kept(("layernorm",), spec, moe) == pytest.approx(2.0 * 2 * spec.dim, rel=1e-12)


def test_mla_up_proj_drops_the_heads_and_keeps_the_latents():
    """DeepSeek-V3's MLA: what the attention reads of the up-projections (q and k roped, v; AC none keeps
    those, not the projections' own outputs, which RoPE consumes) is dropped, at the heads' width; the
    latents they are projected from stay."""
    spec = resolve_model("deepseek-v3")
    a, h = spec.mla, spec.n_heads
    heads = h * a.qk_head_dim + h * a.qk_head_dim + h * a.v_head_dim
    dense = 0  # the first block is dense: the same attention
    assert _kept((), spec, dense) - _kept(("mla_up_proj",), spec, dense) == pytest.approx(2.0 * heads, rel=1e-12)
    assert _kept(("mla_up_proj",), spec, dense) > 2.0 * (a.q_lora_rank + a.kv_lora_rank)  # the latents stay


def test_recompute_time_by_hand():
    """What each module runs again for one micro-batch of 128 tokens, bf16 at the profile's rates: the norms'
    two fused passes over 2 x dim; the routed activation's 3 passes over each pair's expert width, and a
    clamped expert's 8 eager clamp passes before it (not under the op fuser); the shared expert's three
    matmuls and its activation; the attention core's forward."""
    dev = PROF.device
    spans = group_spans(_layout(), PROF)

    def recompute(modules: tuple[str, ...], spec: ModelSpec = ONE_LAYER, **kw) -> float:
        lay = _layout(spec, modules, **kw)
        c = block_compute(lay, PROF, 0)
        return megatron_recompute_time(lay, PROF, spans, 0, c.matmul_by_kind, c.attention_forward)

    def passes(elems: float) -> float:
        return memory_bound_time(dev, elems * TOKENS * 2.0)

    assert recompute(("layernorm",)) == pytest.approx(passes(2 * D), rel=1e-12)  # the pre-MLP norm alone
    assert recompute(("moe_act",)) == pytest.approx(passes(3 * K * F), rel=1e-12)
    clamped = replace(ONE_LAYER, moe=replace(ONE_LAYER.moe, activation_clamp=7.0))
    assert recompute(("moe_act",), clamped) == pytest.approx(passes((3 + 8) * K * F), rel=1e-12)
    assert recompute(("moe_act",), clamped, moe_fused_mlp=True) == pytest.approx(passes(3 * K * F), rel=1e-12)
    shared = 2 * matmul_time(dev, TOKENS, F, D, "bf16") + matmul_time(dev, TOKENS, D, F, "bf16")
    assert recompute(("shared_experts",)) == pytest.approx(shared + passes(3 * SHARED * F), rel=1e-12)
    # The attention core: causal, 4 heads of 16 over 128 tokens, 2 x 128 x 4 x 32 / 2 FLOPs a token forward,
    # at cuDNN's rate for that length and head (the layout's kernel).
    flops = TOKENS * 2 * TOKENS * 4 * 32 / 2
    rate = attention_tflops(dev, TOKENS, "bf16", 16, kernel="cudnn")
    assert recompute(("core_attn",)) == pytest.approx(flops / (rate * 1e12), rel=1e-12)
    # A dense layer's MLP is no MoE layer's: mlp runs nothing again here, as moe_act would in a dense block.
    assert recompute(("mlp",)) == 0.0
    # In a dense block: its three matmuls, SwiGLU's 3 passes over 128 and fc1's fused norm's 2 over dim.
    mlp = 2 * matmul_time(dev, TOKENS, 128, D, "bf16") + matmul_time(dev, TOKENS, D, 128, "bf16")
    assert recompute(("mlp",), DENSE) == pytest.approx(mlp + passes(3 * 128 + 2 * D), rel=1e-12)
    assert recompute(("layernorm", "moe_act"), DENSE) == 0.0


def test_mla_up_proj_reruns_the_up_projections_and_rope_by_hand():
    spec = resolve_model("deepseek-v3")
    a, h, dev = spec.mla, spec.n_heads, PROF.device
    lay = _layout(spec, ("mla_up_proj",), stage_layers=(spec.n_layers,))
    c = block_compute(lay, PROF, 0)
    got = megatron_recompute_time(lay, PROF, group_spans(lay, PROF), 0, c.matmul_by_kind, c.attention_forward)
    ups = (matmul_time(dev, TOKENS, h * a.qk_head_dim, a.q_lora_rank, "bf16")
           + matmul_time(dev, TOKENS, h * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, "bf16"))
    rope = memory_bound_time(dev, 2 * (spec.q_dim + spec.kv_dim) * TOKENS * 2.0)
    assert got == pytest.approx(ups + rope, rel=1e-12)


def test_a_dense_mlps_recompute_runs_its_tp_all_reduce_again():
    """TP 2 without SP: the dense MLP's row-parallel output is all-reduced in its forward, so its recompute
    pays that all-reduce again (nothing hides it without async TP or userbuffers)."""
    from meshplan.cost_models.comm import collective_time

    lay = _layout(DENSE, ("mlp",), tp=2, gpus=2, dp_shard=1, global_batch=2)
    spans = group_spans(lay, PROF)
    c = block_compute(lay, PROF, 0)
    got = megatron_recompute_time(lay, PROF, spans, 0, c.matmul_by_kind, c.attention_forward)
    dev = PROF.device
    mlp = 2 * matmul_time(dev, TOKENS, 64, D, "bf16") + matmul_time(dev, TOKENS, D, 64, "bf16")
    all_reduce = collective_time(PROF, "all_reduce", TOKENS * D * 2.0, spans["tp"])
    assert got == pytest.approx(mlp + memory_bound_time(dev, (3 * 64 + 2 * D) * TOKENS * 2.0) + all_reduce,
                                rel=1e-12)


def test_shared_experts_recompute_runs_their_tp_all_reduce_again():
    """TP 2 without SP: the shared experts are TP-sharded like a dense MLP (SharedExpertMLP's column- and
    row-parallel linears), so their recompute pays their all-reduce again; the routed experts' tokens need
    none (each TP rank routes its own)."""
    from meshplan.cost_models.comm import collective_time

    lay = _layout(ONE_LAYER, ("shared_experts",), tp=2, gpus=2, dp_shard=1, global_batch=2, ep=2)
    spans = group_spans(lay, PROF)
    c = block_compute(lay, PROF, 0)
    got = megatron_recompute_time(lay, PROF, spans, 0, c.matmul_by_kind, c.attention_forward)
    dev = PROF.device
    shared = SHARED * (2 * matmul_time(dev, TOKENS, F // 2, D, "bf16") + matmul_time(dev, TOKENS, D, F // 2, "bf16"))
    all_reduce = collective_time(PROF, "all_reduce", TOKENS * D * 2.0, spans["tp"])
    assert got == pytest.approx(shared + memory_bound_time(dev, 3 * SHARED * F // 2 * TOKENS * 2.0) + all_reduce,
                                rel=1e-12)


def test_every_module_moves_memory_or_time_somewhere():
    """Each accepted module changes what DeepSeek-V3 (MLA, dense and MoE blocks, a shared expert) keeps or
    recomputes in some block: none is accepted and priced as nothing."""
    from meshplan.specs.rules import RECOMPUTE_MODULES

    spec = resolve_model("deepseek-v3")
    for module in RECOMPUTE_MODULES:
        moved = False
        for layer in (0, 3):
            lay = _layout(spec, (module,), stage_layers=(spec.n_layers,))
            c = block_compute(lay, PROF, layer)
            secs = megatron_recompute_time(lay, PROF, group_spans(lay, PROF), layer, c.matmul_by_kind,
                                           c.attention_forward)
            moved |= secs > 0 and _kept((), spec, layer) > _kept((module,), spec, layer)
        assert moved, module


def test_the_recompute_adds_its_matmuls_to_the_model_flops_and_holds_what_it_dropped():
    """mla_up_proj on DeepSeek-V3: the HFU count adds its two up-projections in all 61 blocks, 2 FLOPs a
    multiply-add; while a block recomputes, it holds again what it dropped, not its whole backward set."""
    from meshplan.cost_models.estimate import _recompute_flops_per_token
    from meshplan.cost_models.memory import _recomputed_bytes_per_token

    spec = resolve_model("deepseek-v3")
    a, h = spec.mla, spec.n_heads
    lay = _layout(spec, ("mla_up_proj",), stage_layers=(spec.n_layers,))
    up = 2 * (a.q_lora_rank * h * a.qk_head_dim + a.kv_lora_rank * h * (a.qk_nope_head_dim + a.v_head_dim))
    assert _recompute_flops_per_token(lay, True) == pytest.approx(spec.n_layers * up, rel=1e-12)
    assert _recomputed_bytes_per_token(lay, 0) == pytest.approx(_kept((), spec, 0) - _kept(("mla_up_proj",), spec, 0),
                                                               rel=1e-12)


def test_megatron_cores_selective_default_is_core_attn():
    """recompute_modules unset: Megatron-Core's default, ['core_attn'] (TransformerConfig)."""
    assert layout_of(_plan()).sac_ops == MegatronRecompute(("core_attn",))
    named = layout_of(_plan({"recompute_modules": ["mlp", "layernorm"]}))
    assert named.sac_ops == MegatronRecompute(("layernorm", "mlp"))  # one order, that of RECOMPUTE_MODULES
    assert layout_of(_plan({"activation_checkpointing": "none"})).sac_ops is None


def test_the_layout_label_names_the_modules():
    from meshplan.specs.plan_label import legend, plan_label

    label = plan_label(_plan({"recompute_modules": ["layernorm", "moe_act"]}))
    assert "RC(layernorm,moe_act)" in label and "SAC(" not in label
    assert "RC(core_attn)" in plan_label(_plan())  # Megatron-Core's default
    assert "RC(Megatron-Core's recomputed modules)" in legend([label])


def test_the_field_reads_writes_and_is_written_only_when_set():
    plan = _plan({"recompute_modules": ["layernorm", "moe_act"]})
    assert plan.to_dict()["memory"]["recompute_modules"] == ["layernorm", "moe_act"]
    assert plan_from_dict(plan.to_dict()).memory.recompute_modules == ["layernorm", "moe_act"]
    assert "recompute_modules" not in _plan().to_dict()["memory"]  # a plan without it reads as before


@pytest.mark.parametrize("memory, top, starts", [
    ({"recompute_modules": ["layernorm"]}, {"stack": "meshplan"},
     "memory.recompute_modules: applies only on stack megatron-core, got stack meshplan"),
    ({"recompute_modules": ["layernorm"], "activation_checkpointing": "none"}, {},
     "memory.recompute_modules: applies only with activation_checkpointing: selective"),
    ({"recompute_modules": ["moe"]}, {}, "memory.recompute_modules[0]: must be one of core_attn"),
    ({"recompute_modules": []}, {}, "memory.recompute_modules: must be a non-empty list"),
    ({"recompute_modules": "layernorm"}, {}, "memory.recompute_modules: must be a non-empty list"),
    ({"recompute_modules": ["mlp", "mlp"]}, {}, "memory.recompute_modules: names a module twice"),
    ({"sac_ops": ["qkv"]}, {}, "memory.sac_ops: does not apply on stack megatron-core"),
])
def test_refused_in_one_line(memory, top, starts):
    with pytest.raises(InputError) as err:
        _plan(memory, **top)
    assert str(err.value).startswith(starts) and "\n" not in str(err.value)


def _rows() -> dict[str, object]:
    return {r.label.split("(")[-1].rstrip(")"): r for r in moe_blackwell_rows()}


def test_published_rows_recompute_what_their_recipes_did():
    rows = _rows()

    def modules(rid: str):
        return rows[rid].plan.memory.recompute_modules

    assert modules("mb-26.04.01-gptoss120b-gb200-64g-bf16-gbs1280") == ["layernorm", "moe_act"]
    assert modules("mb-26.06-gptoss120b-gb200-64g-mxfp8-gbs1280") is None  # the full-iteration recipe: none
    assert rows["mb-26.06-gptoss120b-gb200-64g-mxfp8-gbs1280"].plan.memory.activation_checkpointing == "none"
    assert modules("mb-26.04-dsv3-gb200-256g-mxfp8-gbs4096") == ["mlp"]
    assert modules("mb-26.04.01-dsv3-b200-256g-mxfp8-gbs4096") == ["mla_up_proj", "mlp"]
    assert modules("mb-26.02-dsv3-gb200-256g-mxfp8-gbs4096") == ["mla_up_proj"]
    assert modules("mb-26.04-qwen3-30b-gb200-8g-mxfp8-gbs512") is None
    assert modules("mz-qwen3-235b-gb200-256g-mxfp8") == ["moe_act"]  # its router graphed: no norm recompute
    assert modules("mz-qwen3-235b-gb200-128g-mxfp8-seq128k") == ["moe_act", "layernorm"]
    assert modules("mlm-dsv3-gb200-256g-mxfp8-final") == ["mlp", "moe_act"]


def test_a_rows_recompute_costs_time_and_saves_memory():
    """The same GPT-OSS row with and without its recipe's modules: the recompute is priced, and the
    activations it drops are not held."""
    row = _rows()["mb-26.04.01-gptoss120b-gb200-64g-bf16-gbs1280"]
    with_modules = estimate_plan(row.plan, load_profile(row.plan.cluster), **row.layout_overrides)
    bare = row.plan.copy()
    bare.memory = replace(bare.memory, activation_checkpointing="none", recompute_modules=None)
    without = estimate_plan(bare, load_profile(bare.cluster), **row.layout_overrides)
    assert with_modules.time_s["recompute"] > 0.0 == without.time_s["recompute"]
    assert with_modules.step_time_s > without.step_time_s
    assert with_modules.memory_gib["activations"] < without.memory_gib["activations"]
