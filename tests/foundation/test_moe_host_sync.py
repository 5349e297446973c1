"""An MoE layer behind a host sync (Layout.moe_host_sync, timing._add_moe_host): on a stack that syncs host and
device in every MoE layer and runs its experts eager (Megatron-Core's dropless recipes), each pass of the layer
takes the longer of its kernels and its experts' host work, overheads.moe_expert_host_s per local expert
forward and 1.75x that backward. Checked by hand on tiny-moe's last block (8 experts)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models.estimate import group_spans
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.cost_models.published import full_iteration_graphs, moe_blackwell_rows
from meshplan.cost_models.timing import MOE_HOST_BACKWARD_RATIO, block_time
from meshplan.profiles import load_profile
from meshplan.specs.plan import plan_from_dict

GPU = "b200-180g-dgx"


def moe_layout(stack: str, ep: int = 1, **overrides):
    plan = plan_from_dict({
        "model": "tiny-moe", "cluster": GPU, "gpus": ep,
        "training": {"seq_len": 128, "global_batch": ep, "micro_batch": 1, "dtype": "bf16"},
        "parallel": {"dp_replicate": 1, "dp_shard": ep, "cp": 1, "tp": 1, "pp": 1, "ep": ep,
                     "sequence_parallel": False, "async_tp": False, "pp_schedule": "1F1B", "pp_virtual_stages": 1},
        "memory": {"activation_checkpointing": "none", "float8": False, "reshard_after_forward": False},
        "compile": True, "stack": stack})
    prof = load_profile(GPU)
    return replace(runtime_paths(layout_of(plan), prof), **overrides), prof


def block(lay, prof, host_s: float):
    prof = replace(prof, overheads=replace(prof.overheads, moe_expert_host_s=host_s))
    return block_time(lay, prof, group_spans(lay, prof), lay.spec.n_layers - 1)


def test_a_synced_moe_layer_takes_its_experts_host_work_where_it_outlasts_the_kernels():
    lay, prof = moe_layout("megatron-core", ep=2)
    assert lay.moe_host_sync  # the stack's default
    kernels = block(lay, prof, 0.0)
    # 1 ms per local expert: 8 experts over EP 2 leave 4, so 4 ms forward and 7 ms backward of host work,
    # far beyond tiny-moe's kernels at seq 128: the passes become the host work.
    slow = block(lay, prof, 1e-3)
    assert MOE_HOST_BACKWARD_RATIO == pytest.approx(2.1 / 1.2)
    assert slow.forward == pytest.approx(4e-3)
    assert slow.backward_input + slow.backward_weight == pytest.approx(4e-3 * 1.75)
    assert slow.host == pytest.approx(4e-3 - kernels.forward + 7e-3 - kernels.backward_input - kernels.backward_weight)
    # A host work shorter than the kernels hides under them.
    tiny = kernels.forward / 4 / 10
    assert block(lay, prof, tiny).forward == pytest.approx(kernels.forward)


def test_without_the_sync_or_on_meshplans_runtime_the_experts_host_work_is_not_this_term():
    synced, prof = moe_layout("megatron-core", ep=2)
    graphed, _ = moe_layout("megatron-core", ep=2, moe_host_sync=False)
    assert block(graphed, prof, 1e-3).forward == pytest.approx(block(graphed, prof, 0.0).forward)
    runtime, _ = moe_layout("meshplan", ep=2)
    assert not runtime.moe_host_sync  # host.py counts the runtime's own ops instead
    assert block(runtime, prof, 1e-3).forward == pytest.approx(block(runtime, prof, 0.0).forward)
    # a dense block is never touched
    dense, _ = moe_layout("megatron-core", ep=2)
    assert not dense.spec.is_moe_layer(0)  # tiny-moe's first block is dense
    zero = replace(prof, overheads=replace(prof.overheads, moe_expert_host_s=0.0))
    one = replace(prof, overheads=replace(prof.overheads, moe_expert_host_s=1e-3))
    assert block_time(dense, one, group_spans(dense, one), 0).forward == pytest.approx(
        block_time(dense, zero, group_spans(dense, zero), 0).forward)


def test_published_moe_rows_sync_unless_their_recipe_graphs_the_whole_iteration():
    """The 26.06+ GB200 MXFP8 recipes (sync-free HybridEP under full-iteration CUDA graphs) opt out; every
    other row syncs (docs/sources/megatron-bridge-moe-recipes.md)."""
    rows = [r for r in moe_blackwell_rows() if not r.skipped]
    graphed = {r.label for r in rows if not r.layout_overrides["moe_host_sync"]}
    assert len(graphed) == 11 and all(("26.06" in l or "26.08" in l) and "GB200" in l and "MXFP8" in l
                                       for l in graphed)
    assert full_iteration_graphs({"id": "mb-26.06-x", "gpu": "GB200", "precision": "MXFP8"})
    assert not full_iteration_graphs({"id": "mb-26.04.01-x", "gpu": "GB200", "precision": "MXFP8"})
    assert not full_iteration_graphs({"id": "mb-26.08-x", "gpu": "B200", "precision": "MXFP8"})
    assert not full_iteration_graphs({"id": "mlm-dsv3-x", "gpu": "GB200", "precision": "MXFP8"})
    # one table per publication and model: leaving a table out of the fit leaves that model of that page out
    assert {r.table for r in rows} == {f"Megatron-Bridge MoE: {m}" for m in
                                       ("DeepSeek-V3", "GPT-OSS-120B", "Qwen3-30B-A3B", "Qwen3-235B-A22B")} | {
        "Megatron-MoE-ModelZoo: Qwen3-235B-A22B", "Megatron-LM GB200 notes: DeepSeek-V3"}
    # the ids' prefixes name the publication (moe_training_blackwell.csv's source column)
    by_table = {}
    for r in rows:
        by_table.setdefault(r.table, []).append(r.label)
    assert all("(mz-" in l for l in by_table["Megatron-MoE-ModelZoo: Qwen3-235B-A22B"])
    assert len(by_table["Megatron-MoE-ModelZoo: Qwen3-235B-A22B"]) == 3
    assert [l.split("(")[-1] for l in by_table["Megatron-LM GB200 notes: DeepSeek-V3"]] == [
        "mlm-dsv3-gb200-256g-mxfp8-baseline)", "mlm-dsv3-gb200-256g-mxfp8-final)"]
