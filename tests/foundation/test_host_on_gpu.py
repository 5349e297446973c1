"""Host work on a GPU (cost_models/host.py host_beyond): the host runs ahead of the kernels, so a pass
takes the longer of the two. A model whose kernels are nothing is priced its counted host work; compiled
blocks, long kernels and stacks whose modules are not counted are priced as before."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models.estimate import estimate_plan, group_spans
from meshplan.cost_models.host import BLOCK_OPS, EMBEDDING_OPS, HEAD_OPS, MOE_OP_COST_RATIO, block_host
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.cost_models.timing import block_time, head_time
from meshplan.profiles import load_profile
from meshplan.specs.plan import plan_from_dict

GPU = "h200-141g-dgx"


def gpu_plan(model: str = "tiny-4l", seq: int = 128, batch: int = 4, mb: int = 1, ac: str = "none",
             sac_ops=None, compile_: bool = False, stack: str | None = None, cluster: str = GPU,
             dtype: str = "bf16") -> object:
    raw = {"model": model, "cluster": cluster, "gpus": 1,
           "training": {"seq_len": seq, "global_batch": batch, "micro_batch": mb, "dtype": dtype},
           "parallel": {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "pp": 1, "sequence_parallel": False,
                        "async_tp": False, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "pp_layers": None},
           "memory": {"activation_checkpointing": ac, "sac_ops": sac_ops, "float8": False,
                      "reshard_after_forward": True},
           "compile": compile_}
    if stack:
        raw["stack"] = stack
    return plan_from_dict(raw)


def with_op_cost(op_s: float):
    prof = load_profile(GPU)
    return replace(prof, overheads=replace(prof.overheads, op_dispatch_s=op_s, python_dispatch_s=0.0,
                                           checkpoint_op_s=0.0, sac_op_s=0.0))


def test_a_host_bound_step_is_priced_its_counted_ops():
    """At 1 ms an op every pass of tiny-4l is host-bound at either cost, so doubling the cost adds the
    step's host work once: per micro-batch, 4 blocks of 109 forward and 145 backward ops, the head's
    14 + 28 and the embedding's 2 + 3 (the counts tests/calibrate/test_host_costs.py checks)."""
    plan = gpu_plan(batch=4, mb=1)
    one, two = (estimate_plan(plan, with_op_cost(c)).step_time_s for c in (1e-3, 2e-3))
    per_micro = 4 * (109 + 145) + (14 + 28) + (2 + 3)
    assert (BLOCK_OPS["llama"].forward, BLOCK_OPS["llama"].backward) == (109, 145)
    assert (HEAD_OPS.forward, HEAD_OPS.backward, EMBEDDING_OPS.forward, EMBEDDING_OPS.backward) == (14, 28, 2, 3)
    assert two - one == pytest.approx(4 * per_micro * 1e-3, rel=1e-9)


@pytest.mark.parametrize("ac, passes", [("none", 56 + 78), ("full", 56 + 78 + 56)])
def test_an_moe_layers_own_ops_cost_moe_op_s(ac, passes):
    """tiny-moe, host-bound at 1 ms an op: raising overheads.moe_op_s by 1 ms over op_dispatch_s adds 1 ms for
    each op its 3 MoE layers (the first is dense) add per micro-batch, by hand from moe.py's counts: routed
    25 + 30, shared experts 15 + 32, aux loss 16 + 16, forward + backward; under full AC the replay runs the
    forward's 56 again."""
    plan = gpu_plan(model="tiny-moe", batch=4, mb=1, ac=ac)
    base = with_op_cost(1e-3)
    steps = [estimate_plan(plan, replace(base, overheads=replace(base.overheads, moe_op_s=s))).step_time_s
             for s in (1e-3, 2e-3)]
    assert steps[1] - steps[0] == pytest.approx(4 * 3 * passes * 1e-3, rel=1e-9)


def test_an_unmeasured_moe_op_costs_the_measured_ratio_of_a_plain_op():
    """Without overheads.moe_op_s an MoE op costs MOE_OP_COST_RATIO plain ones: the same step as the
    explicit value."""
    plan = gpu_plan(model="tiny-moe", batch=4, mb=1)
    base = with_op_cost(1e-3)
    explicit = replace(base, overheads=replace(base.overheads, moe_op_s=MOE_OP_COST_RATIO * 1e-3))
    assert estimate_plan(plan, base).step_time_s == pytest.approx(estimate_plan(plan, explicit).step_time_s, rel=1e-12)
    assert 1.78 <= MOE_OP_COST_RATIO <= 2.18  # the two H200 hosts measured 1.78 and 2.18


def test_host_work_shorter_than_the_kernels_adds_nothing():
    """llama3-8b at seq 8192: each pass's kernels take milliseconds; 15 us an op hides under them."""
    plan = gpu_plan(model="llama3-8b", seq=8192, batch=1, mb=1)
    lay = runtime_paths(layout_of(plan), load_profile(GPU))
    blocks = [block_time(lay, p, group_spans(lay, p)).total for p in (with_op_cost(15e-6), with_op_cost(0.0))]
    assert blocks[0] == blocks[1]
    heads = [head_time(lay, p) for p in (with_op_cost(15e-6), with_op_cost(0.0))]
    assert heads[0] == heads[1]


@pytest.mark.parametrize("change", [{"compile_": True}, {"stack": "megatron-core"}])
def test_compiled_blocks_and_uncounted_stacks_carry_no_block_host_work(change):
    """Compiled blocks launch Inductor's fused kernels; Megatron's modules are not the ones counted."""
    plan = gpu_plan(batch=4, mb=1, **change)
    lay = runtime_paths(layout_of(plan), load_profile(GPU))
    times = [block_time(lay, p, group_spans(lay, p)).total for p in (with_op_cost(1e-3), with_op_cost(0.0))]
    assert times[0] == times[1]


def test_the_cpu_adds_host_work_in_line():
    """gloo's CPU ranks: the host is the device, so host work adds to the kernels, it does not hide."""
    plan = gpu_plan(cluster="cpu-gloo", dtype="fp32")
    prof = load_profile("cpu-gloo")
    priced = replace(prof, overheads=replace(prof.overheads, op_dispatch_s=1e-3))
    grown = estimate_plan(plan, priced).step_time_s - estimate_plan(plan, prof).step_time_s
    assert grown >= 4 * (4 * (109 + 145)) * 1e-3


SAVE_ALL = ["qkv", "attention", "attn_out", "ffn_in"]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_policy_saving_every_matmul_still_replays_the_memory_bound_ops_eager(compiled):
    """The wrapper recomputes what the policy does not save: eager, the norms, RoPE and activations run
    again as their own kernels; compiled, Inductor fuses them into the backward's kernels (the H200 runs of
    llama3.2-3b: that policy took 1 % longer than AC none)."""
    plan = gpu_plan(model="llama3.2-3b", seq=4096, batch=1, mb=1, ac="selective", sac_ops=SAVE_ALL,
                    compile_=compiled)
    prof = with_op_cost(0.0)
    lay = runtime_paths(layout_of(plan), prof)
    bt = block_time(lay, prof, group_spans(lay, prof))
    assert bt.recompute == (0.0 if compiled else pytest.approx(bt.kinds.elementwise_forward, rel=1e-12))
    assert bt.kinds.elementwise_forward > 0


def test_ring_attention_carries_no_gather_tiles():
    """On NCCL, CP runs PyTorch's ring attention, not the gather path whose Python tiles host.py counts:
    an eager CP 2 block on a GPU prices the same host work as without CP."""
    plan = gpu_plan(model="llama3.2-3b", seq=4096, batch=1, mb=1)
    lay = runtime_paths(layout_of(plan), load_profile(GPU))
    cp2 = lay.with_(cp=2, gpus=2)
    assert cp2.cp_attention == "ring"
    assert block_host(cp2) == block_host(lay)
    assert block_host(cp2.with_(cp_attention="gather"))[0].ops > block_host(lay)[0].ops
