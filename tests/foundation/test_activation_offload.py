"""Megatron-Core's fine-grained activation offloading (memory.offload_modules): the named modules' inputs
leave the GPU between their forward and backward, two blocks' worth stay resident, and the copies hide under
the block's passes unless the host link is slower than them; by hand from the saved-tensor inventory."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models.activations import block_tensors, saved_names, tensor_bytes_per_token
from meshplan.cost_models.estimate import estimate_plan
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.cost_models.memory import _convention, offloaded_block_bytes
from meshplan.cost_models.published import moe_blackwell_rows
from meshplan.cost_models.timing import block_time
from meshplan.cost_models.estimate import group_spans
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import plan_from_dict

ZOO = next(r for r in moe_blackwell_rows() if "mz-qwen3-235b-gb200-256g-mxfp8" in r.label)


def _without_offload(plan):
    return replace(plan, memory=replace(plan.memory, offload_modules=None))


def test_the_zoo_run_offloads_its_experts_inputs_and_fits():
    """Its printed command offloads expert_fc1 and moe_act: the routed tokens (fc1's input) and fc1's two
    halves (the activation's input) of every MoE block, each in-flight micro-batch's, leave the GPU; priced
    without that, the run that completed was 45 % over its memory."""
    assert ZOO.plan.memory.offload_modules == ["expert_fc1", "moe_act"]
    prof = load_profile(ZOO.plan.cluster)
    lay = runtime_paths(layout_of(ZOO.plan), prof).with_(**ZOO.layout_overrides)
    layer = lay.spec.n_layers - 1
    kept = saved_names(lay.spec, lay.ac, lay.sac_ops, _convention(lay), lay.tp, layer)
    by_hand = sum(tensor_bytes_per_token(x, lay.tp, lay.sp, lay.act_bytes, _convention(lay))
                  for x in block_tensors(lay.spec, lay.seq_len, _convention(lay), layer, lay.ep, lay.moe_imbalance)
                  if x.name in {"routed_in", "expert_in_0", "expert_in_1"} and x.name in kept)
    assert by_hand > 0
    assert offloaded_block_bytes(lay, layer) == pytest.approx(by_hand * lay.tokens_per_micro, rel=1e-12)
    on = estimate_plan(ZOO.plan, prof, **ZOO.layout_overrides)
    off = estimate_plan(_without_offload(ZOO.plan), prof, **ZOO.layout_overrides)
    assert on.fits and not off.fits
    assert on.memory_gib["offload_buffers"] * 2**30 == pytest.approx(2 * by_hand * lay.tokens_per_micro, rel=1e-9)
    assert off.memory_gib["activations"] - on.memory_gib["activations"] > 0.4 * off.memory_gib["activations"]


def test_the_copies_hide_under_the_passes_unless_the_host_link_is_slower():
    """NVLink-C2C's 225 GB/s a GPU carries a block's offloaded 1-2 GB within its forward; at 1 GB/s the
    forward takes the copy's time instead, and the backward too (the reload)."""
    prof = load_profile(ZOO.plan.cluster)
    lay = runtime_paths(layout_of(ZOO.plan), prof).with_(**ZOO.layout_overrides)
    layer = lay.spec.n_layers - 1
    spans = group_spans(lay, prof)
    plain = block_time(lay.with_(offload_modules=()), prof, spans, layer)
    assert block_time(lay, prof, spans, layer).forward == plain.forward
    slow = replace(prof, device=replace(prof.device, host_link_gbs=1.0))
    copy = offloaded_block_bytes(lay, layer) / 1e9
    assert copy > plain.forward
    got = block_time(lay, slow, group_spans(lay, slow), layer)
    assert got.forward == pytest.approx(copy, rel=1e-12)
    assert got.backward_input + got.backward_weight == pytest.approx(copy, rel=1e-12)


RAW = {"version": 1, "model": "qwen3-30b-a3b", "cluster": "gb200-186g-nvl72", "gpus": 8, "stack": "megatron-core",
       "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "dtype": "bf16"},
       "parallel": {"dp_replicate": 1, "dp_shard": 8, "tp": 1, "sequence_parallel": False, "async_tp": False,
                    "pp": 1, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "cp": 1, "ep": 8},
       "memory": {"activation_checkpointing": "none", "float8": False, "reshard_after_forward": False},
       "compile": False}


def _plan(stack="megatron-core", modules=None, cluster="gb200-186g-nvl72"):
    memory = {**RAW["memory"], **({"offload_modules": modules} if modules is not None else {})}
    return plan_from_dict({**RAW, "stack": stack, "cluster": cluster, "memory": memory})


@pytest.mark.parametrize("stack, modules, words", [
    ("meshplan", ["expert_fc1"], "applies only on stack megatron-core"),
    ("torchtitan", ["moe_act"], "applies only on stack megatron-core"),
    ("megatron-core", ["attn_proj"], "attn_proj needs core_attn"),
    ("megatron-core", ["experts"], "must be one of"),
    ("megatron-core", ["moe_act", "moe_act"], "names a module twice"),
    ("megatron-core", [], "non-empty list"),
])
def test_what_cannot_offload_is_refused_in_one_line(stack, modules, words):
    with pytest.raises(InputError) as err:
        _plan(stack, modules)
    assert err.value.field.startswith("memory.offload_modules") and words in str(err.value)
    assert "\n" not in str(err.value)


def test_the_field_is_written_only_when_set_and_needs_a_host_link():
    from meshplan.cost_models.plan_checks import check_against_profile

    assert "offload_modules" not in _plan().to_dict()["memory"]
    plan = _plan(modules=["core_attn", "attn_proj", "moe_act"])
    assert plan_from_dict(plan.to_dict()).memory.offload_modules == ["core_attn", "attn_proj", "moe_act"]
    check_against_profile(plan, load_profile("gb200-186g-nvl72"))
    gloo = load_profile("cpu-gloo")
    assert gloo.device.host_link_gbs is None
    with pytest.raises(InputError) as err:
        check_against_profile(plan, gloo)
    assert err.value.field == "memory.offload_modules"
