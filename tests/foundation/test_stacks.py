"""The plan field `stack`: the same layout priced as meshplan's runtime, TorchTitan or Megatron-Core runs
it (cost_models/stacks.py), checked against hand counts; `run` and the search take meshplan's own only."""

from __future__ import annotations

import pytest

from meshplan.cost_models.estimate import ComputeWindows, data_parallel_comm, estimate_plan, group_spans
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.cost_models.memory import head_input_bytes, loss_buffer_bytes
from meshplan.cost_models.published import all_training_rows
from meshplan.cost_models.stacks import STACKS
from meshplan.errors import InputError
from meshplan.planner.space import Space
from meshplan.profiles.registry import load_profile
from meshplan.runtime.options import check_runnable
from meshplan.specs.plan import plan_from_dict

RAW = {"version": 1, "model": "llama3-8b", "cluster": "h100-80g-dgx", "gpus": 32,
       "training": {"seq_len": 8192, "global_batch": 256, "micro_batch": 1, "dtype": "bf16"},
       "parallel": {"dp_replicate": 1, "dp_shard": 32, "tp": 1, "sequence_parallel": False, "async_tp": False,
                    "pp": 1, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "cp": 1},
       "memory": {"activation_checkpointing": "selective", "float8": False, "reshard_after_forward": True},
       "compile": True}
PROFILE = load_profile("h100-80g-dgx")
VOCAB = 128256  # Llama 3's tokenizer


def on(stack: str, **top):
    return plan_from_dict({**RAW, **top, "stack": stack})


def test_the_field_reads_writes_and_refuses_one_line():
    assert "stack" not in plan_from_dict(RAW).to_dict()  # a meshplan plan reads as before the field
    assert plan_from_dict(on("megatron-core").to_dict()).stack == "megatron-core"
    with pytest.raises(InputError) as err:
        on("deepspeed")
    assert str(err.value).startswith("stack: must be one of meshplan | torchtitan | megatron-core")


@pytest.mark.parametrize("stack", ["torchtitan", "megatron-core"])
def test_run_and_the_search_take_meshplans_runtime_only(stack):
    with pytest.raises(InputError) as err:
        check_runnable(on(stack), "cuda")
    assert str(err.value).startswith("stack: must be meshplan for `meshplan run`") and "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        Space.from_plan(on(stack), PROFILE)
    assert str(err.value).startswith("stack: must be meshplan for `meshplan plan`")
    check_runnable(on("meshplan"), "cuda")


def test_estimate_names_the_auto_fields_another_stack_leaves(tmp_path, capsys):
    """The search fills 'auto' only with meshplan-runtime layouts: `estimate` of a Megatron-Core plan with
    two fields left out says which, in one line, and exits 2; the same plan complete is priced."""
    import yaml

    from meshplan import cli

    raw = {**RAW, "stack": "megatron-core", "parallel": {k: v for k, v in RAW["parallel"].items() if k != "async_tp"},
           "memory": {k: v for k, v in RAW["memory"].items() if k != "reshard_after_forward"}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli.main(["estimate", "--plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "stack: megatron-core" in err
    assert "parallel.async_tp, memory.reshard_after_forward (still auto)" in err
    path.write_text(yaml.safe_dump({**RAW, "stack": "megatron-core"}))
    assert cli.main(["estimate", "--plan", str(path), "--json"]) == 0


@pytest.mark.parametrize("ac", ["none", "selective", "full"])
def test_megatron_core_prices_compile_as_moot_and_float8_without_it(ac):
    """Megatron-Core does not torch.compile its model: its plans price the same with compile true or false (full
    recompute replays each block whole either way, where a compiled PyTorch block's partitioner drops the last
    matmul), and its float8 (Transformer Engine's) is not refused uncompiled, as torchao's is."""
    from meshplan.cost_models.plan_checks import check_against_profile
    from meshplan.specs.rules import normalise_moot_fields

    def plan(stack: str, compile_: bool):
        return on(stack, compile=compile_, memory={**RAW["memory"], "activation_checkpointing": ac, "float8": True})

    eager, compiled = estimate_plan(plan("megatron-core", False), PROFILE), estimate_plan(plan("megatron-core", True), PROFILE)
    assert (eager.step_time_s, eager.peak_memory_gib) == (compiled.step_time_s, compiled.peak_memory_gib)
    check_against_profile(plan("megatron-core", False), PROFILE)
    with pytest.raises(InputError) as err:
        check_against_profile(plan("meshplan", False), PROFILE)
    assert err.value.field == "memory.float8"
    moot = plan("megatron-core", True)
    assert normalise_moot_fields(moot) and moot.compile is False
    if ac == "full":  # meshplan's compiled full AC does not replay ffn_out: it does cost less there
        assert estimate_plan(plan("meshplan", True), PROFILE).step_time_s < estimate_plan(
            plan("meshplan", False), PROFILE).step_time_s


def test_megatron_core_names_its_cross_entropy_and_only_it():
    """training.cross_entropy_fusion (Megatron-Core's cross_entropy_loss_fusion / cross_entropy_fusion_impl):
    written only when set; its own fused kernel priced as the unfused loss (it upcasts the logits as eager
    does), Transformer Engine's in place over the logits, which drops the fp32 copies from the peak: 4 x 8192
    logits of 128,256 at 4 bytes and more; another stack refuses the field in one line."""
    def plan(stack: str, fusion):
        training = {**RAW["training"], "micro_batch": 4, **({"cross_entropy_fusion": fusion} if fusion else {})}
        return on(stack, training=training)

    assert "cross_entropy_fusion" not in plan("megatron-core", None).to_dict()["training"]
    assert plan_from_dict(plan("megatron-core", "te").to_dict()).training.cross_entropy_fusion == "te"
    default, native, te = (estimate_plan(plan("megatron-core", f), PROFILE) for f in (None, "native", "te"))
    assert (native.step_time_s, native.peak_memory_gib) == (default.step_time_s, default.peak_memory_gib)
    assert te.step_time_s < default.step_time_s
    assert te.memory_gib["transient"] < default.memory_gib["transient"] - 4 * 8192 * VOCAB * 4 / 2**30
    for other in ("meshplan", "torchtitan"):
        with pytest.raises(InputError) as err:
            plan(other, "te")
        assert err.value.field == "training.cross_entropy_fusion" and "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        plan("megatron-core", "apex")
    assert err.value.field == "training.cross_entropy_fusion"


def test_megatron_cores_precision_aware_optimizer_keeps_bf16_moments_and_gradients():
    """memory.optimizer_state_dtype / main_grads_dtype (Megatron-Core's exp_avg(_sq)_dtype and main_grads_dtype):
    bf16 halves AdamW's two moments (8 -> 4 bytes a parameter) and the main gradients (4 -> 2), and the fused
    step moves 8 + 2 + 2 x 4 = 18 bytes a parameter instead of 28, plus the clip's read of the gradient (2 not
    4); another stack refuses either field in one line; neither is written unless set."""
    from meshplan.cost_models.estimate import optimizer_bytes_per_param
    from meshplan.cost_models.layout import layout_of

    def plan(stack: str, **memory):
        return on(stack, memory={**RAW["memory"], **memory})

    fp32, bf16 = plan("megatron-core"), plan("megatron-core", optimizer_state_dtype="bf16", main_grads_dtype="bf16")
    assert not {"optimizer_state_dtype", "main_grads_dtype"} & set(fp32.to_dict()["memory"])
    assert plan_from_dict(bf16.to_dict()).memory.main_grads_dtype == "bf16"
    a, b = estimate_plan(fp32, PROFILE), estimate_plan(bf16, PROFILE)
    assert b.memory_gib["optimizer"] == pytest.approx(a.memory_gib["optimizer"] / 2, rel=1e-12)
    # In the optimizer's step its shard of the bf16 gradient buffer (Megatron-Core's default reduce dtype) is cast
    # to fp32 main gradients, 4 bytes a parameter over the 32 ranks; bf16 main gradients view the buffer instead.
    from meshplan.cost_models.memory import optimizer_step_memory
    step_fp32, step_bf16 = (optimizer_step_memory(runtime_paths(layout_of(p), PROFILE), 0, PROFILE.overheads).parts
                            for p in (fp32, bf16))
    assert step_fp32["grads"] == pytest.approx(4 * fp32.model.num_params() / 32, rel=1e-9)
    assert step_bf16["grads"] == 0 and a.memory_gib["grads"] == 0  # and none during the passes
    assert b.memory_gib["params"] == a.memory_gib["params"]  # the fp32 main parameters stay
    assert optimizer_bytes_per_param(layout_of(fp32)) == 28 + 4
    assert optimizer_bytes_per_param(layout_of(bf16)) == 18 + 2
    assert b.time_s["optimizer"] < a.time_s["optimizer"]
    for other in ("meshplan", "torchtitan"):
        for field in ("optimizer_state_dtype", "main_grads_dtype"):
            with pytest.raises(InputError) as err:
                plan(other, **{field: "bf16"})
            assert err.value.field == f"memory.{field}" and "\n" not in str(err.value)


def test_megatron_core_reduces_gradients_once_per_step():
    """256 sequences over 32 data-parallel ranks at micro-batch 1: 8 micro-batches. FSDP2 (meshplan,
    TorchTitan) reduce-scatters at each, Megatron's DDP once: 8x the reduce-scatter time, by count. What
    each leaves exposed is its window's business (test_data_parallel_comm): FSDP2's 8 reductions hide under
    the whole step, Megatron-Core's one under one micro-batch's backward. Both reduce in fp32 here (Megatron-Core's
    own default is bf16: test_grad_reduce_dtype.py)."""
    comm = {}
    for stack in ("meshplan", "megatron-core"):
        lay = runtime_paths(layout_of(on(stack, memory={**RAW["memory"], "grad_reduce_dtype": "fp32"})), PROFILE)
        comm[stack] = data_parallel_comm(lay, PROFILE, group_spans(lay, PROFILE), 0, ComputeWindows(1.0))
    assert comm["meshplan"].reduce_scatter == pytest.approx(8 * comm["megatron-core"].reduce_scatter, rel=1e-12)
    assert comm["meshplan"].all_gather == pytest.approx(comm["megatron-core"].all_gather, rel=1e-12)
    issued = {s: comm[s].total + comm[s].tail for s in comm}
    assert issued["megatron-core"] < issued["meshplan"]


def test_megatron_core_prices_the_eager_loss():
    """Megatron's fp32 cross-entropy is not compiled: 14 bytes per bf16 logit against the compiled 4, so
    10 x 8192 tokens x 128,256 logits more at the loss's peak."""
    buffers = {s: loss_buffer_bytes(layout_of(on(s))) - head_input_bytes(layout_of(on(s)))
               for s in ("meshplan", "megatron-core", "torchtitan")}
    assert buffers["megatron-core"] - buffers["meshplan"] == pytest.approx(10 * 8192 * VOCAB)
    assert buffers["torchtitan"] == buffers["meshplan"]  # TorchTitan compiles its loss too


def test_selective_ac_saves_what_each_stack_saves():
    """With no sac_ops: meshplan's default op set, TorchTitan's op policy (every other matmul: it
    recomputes more, so it keeps less and its step is longer), Megatron's core-attention recompute
    (every matmul output kept: more memory than meshplan's default, which recomputes ffn_out)."""
    est = {s: estimate_plan(on(s), PROFILE) for s in ("meshplan", "torchtitan", "megatron-core")}
    act = {s: e.memory_gib["activations"] for s, e in est.items()}
    assert act["torchtitan"] < act["meshplan"] < act["megatron-core"]
    assert est["torchtitan"].time_s["recompute"] > est["meshplan"].time_s["recompute"]


def test_published_rows_are_priced_on_their_stack():
    stacks = {r.table.split(" (")[0]: r.plan.stack for r in all_training_rows() if r.plan is not None}
    assert stacks["TorchTitan H100"] == "torchtitan"
    assert {s for t, s in stacks.items() if t.startswith("Megatron-Bridge MoE: ")} == {"megatron-core"}


def test_megatron_core_runs_its_fused_elementwise_kernels_by_hand():
    """Llama 3 8B, seq 8192, mb 1, TP 1: Megatron-Core's fused kernels move, per token, 2 x 2 (RMSNorm)
    + 2 x 3 (residual adds) passes over 4096, 2 over q and k (4096 + 1024, RoPE), 3 over 14336 (SwiGLU)
    and 2 over 4096 (context permute) forward; 2 x 3 + 2 x 3, 2, 5 and 2 backward; in bf16."""
    from meshplan.cost_models.compute import memory_bound_time
    from meshplan.cost_models.timing import elementwise_times

    lay = runtime_paths(layout_of(on("megatron-core")), PROFILE)
    assert lay.elementwise_kernels == "megatron"
    fwd = (4 + 6) * 4096 + 2 * 5120 + 3 * 14336 + 2 * 4096
    bwd = (6 + 6) * 4096 + 2 * 5120 + 5 * 14336 + 2 * 4096
    got = elementwise_times(lay, PROFILE)
    assert got[0] == pytest.approx(memory_bound_time(PROFILE.device, 8192 * 2.0 * fwd), rel=1e-12)
    assert got[1] == pytest.approx(memory_bound_time(PROFILE.device, 8192 * 2.0 * bwd), rel=1e-12)
    # With or without torch.compile: the stack's kernels are its own.
    assert elementwise_times(lay.with_(compile=False), PROFILE) == got
    # meshplan's runtime runs eager PyTorch ops, fused by torch.compile into as many passes as these
    # (forms.py compiled_elementwise), eager far more.
    ours = runtime_paths(layout_of(on("meshplan")), PROFILE)
    assert ours.elementwise_kernels == "pytorch" and elementwise_times(ours, PROFILE) == got
    assert elementwise_times(ours.with_(compile=False), PROFILE)[0] > 3 * got[0]


def test_megatron_core_runs_yarns_rope_unfused_by_hand():
    """A GQA model whose RoPE carries YaRN's temperature (factor 32: mscale 0.1 ln 32 + 1): Megatron-Core
    runs rope_utils' unfused rotation, 12 passes over q and k forward and 13 backward, where its fused
    kernel makes 2 and 2. Llama 3 8B, seq 8192, mb 1, TP 1: q and k are 4096 + 1024 wide."""
    import math
    from dataclasses import replace as dc_replace

    from meshplan.cost_models.compute import memory_bound_time
    from meshplan.cost_models.timing import elementwise_times

    lay = runtime_paths(layout_of(on("megatron-core")), PROFILE)
    yarn = lay.with_(spec=dc_replace(lay.spec, rope_yarn_factor=32.0))
    assert yarn.spec.yarn_mscale == pytest.approx(0.1 * math.log(32) + 1.0, rel=1e-12)
    base, got = elementwise_times(lay, PROFILE), elementwise_times(yarn, PROFILE)
    assert got[0] - base[0] == pytest.approx(memory_bound_time(PROFILE.device, 8192 * 2.0 * 10 * 5120), rel=1e-9)
    assert got[1] - base[1] == pytest.approx(memory_bound_time(PROFILE.device, 8192 * 2.0 * 11 * 5120), rel=1e-9)
    # MLA puts YaRN's temperature into the softmax scale, not the rotation: no other kernel.
    from meshplan.specs.registry import resolve_model
    assert dc_replace(resolve_model("deepseek-v3"), rope_yarn_factor=40.0).yarn_mscale == 1.0


def test_each_stack_overlaps_data_parallel_traffic_its_way():
    """meshplan and TorchTitan run FSDP2's prefetch, Megatron-Core its buckets; the published Megatron-LM
    rows of 2021-22 their local DDP, which overlaps nothing."""
    from meshplan.cost_models.published import MEGATRON_OVERRIDES

    assert {s: STACKS[s].dp_overlap for s in STACKS} == {"meshplan": "prefetch", "torchtitan": "prefetch",
                                                        "megatron-core": "buckets"}
    assert MEGATRON_OVERRIDES["dp_overlap"] == "none"


def test_megatron_core_hides_sequence_parallel_tp_under_its_gemm_chunks_by_hand():
    """TP 4 with SP: Transformer Engine's userbuffers split each all-gather and reduce-scatter into 4 chunks,
    3 exchanged under GEMM chunks. Per pass, each of the 4 collectives is exposed by what exceeds 3/4 of its
    matmul; meshplan's runtime without async TP leaves them all exposed."""
    from dataclasses import replace as dc_replace

    from meshplan.cost_models.flops import sac_kind
    from meshplan.cost_models.timing import _tp_collectives, block_time

    raw = {**RAW, "parallel": {**RAW["parallel"], "dp_shard": 8, "tp": 4, "sequence_parallel": True}}
    lays = {s: runtime_paths(layout_of(plan_from_dict({**raw, "stack": s})), PROFILE) for s in ("meshplan",
                                                                                               "megatron-core")}
    assert lays["megatron-core"].tp_comm_overlap and not lays["meshplan"].tp_comm_overlap
    spans = group_spans(lays["meshplan"], PROFILE)
    plain = block_time(lays["meshplan"], PROFILE, spans)
    assert plain.tp_comm == pytest.approx(plain.tp_comm_issued)  # selective AC: 2 passes, all exposed
    te = block_time(lays["megatron-core"], PROFILE, spans)
    by_kind: dict[str, float] = {}
    for kind, t in te.kinds.matmul_by_kind.items():
        by_kind[sac_kind(kind)] = by_kind.get(sac_kind(kind), 0.0) + t
    colls = _tp_collectives(lays["megatron-core"], PROFILE, spans, lays["megatron-core"].spec.n_layers - 1)
    assert set(colls) == {"qkv", "attn_out", "ffn_in", "ffn_out"}
    want = 2 * sum(max(0.0, c - 0.75 * by_kind[k]) for k, c in colls.items())
    assert te.tp_comm == pytest.approx(want, rel=1e-9)
    assert te.tp_comm < plain.tp_comm
    # without SP there is nothing to chunk: all-reduces stay exposed
    no_sp = dc_replace(lays["megatron-core"], sp=False)
    bt = block_time(no_sp, PROFILE, spans)
    assert bt.tp_comm == pytest.approx(bt.tp_comm_issued)


def test_an_moe_layers_tp_collectives_are_the_stacks():
    """TP 2 with SP, EP 8 (folding TP) on one H100 node. TorchTitan all-gathers an MoE layer's sequence shard
    and reduce-scatters its output around the whole layer: attention's pair and the layer's, as a dense
    block. meshplan's runtime and Megatron-Core route each TP rank's own shard, so an MoE layer without
    shared experts (Qwen3-30B-A3B) has attention's pair alone, and one with them (deepseek-v3-16b's two)
    the shared experts' pair besides. Checked against the collectives' own times: one all-gather and
    one reduce-scatter of the micro-batch's hidden states, forward and backward, selective AC."""
    from meshplan.cost_models.comm import collective_time
    from meshplan.cost_models.timing import block_time

    def issued(model: str, stack: str) -> tuple[float, float]:
        raw = {**RAW, "model": model, "gpus": 8, "stack": stack, "compile": stack != "megatron-core",
               "parallel": {**RAW["parallel"], "dp_shard": 4, "tp": 2, "sequence_parallel": True, "ep": 8}}
        lay = runtime_paths(layout_of(plan_from_dict(raw)), PROFILE)
        spans = group_spans(lay, PROFILE)
        payload = lay.tokens_per_micro * lay.spec.dim * lay.act_bytes
        pair = (collective_time(PROFILE, "all_gather", payload, spans["tp"])
                + collective_time(PROFILE, "reduce_scatter", payload, spans["tp"]))
        layer = next(i for i in range(lay.spec.n_layers) if lay.spec.is_moe_layer(i))
        return block_time(lay, PROFILE, spans, layer).tp_comm_issued, 2 * pair  # forward and backward

    for stack, pairs in (("torchtitan", 2), ("meshplan", 1), ("megatron-core", 1)):
        got, both_passes = issued("qwen3-30b-a3b", stack)
        assert got == pytest.approx(pairs * both_passes, rel=1e-9), stack
    for stack in ("torchtitan", "meshplan", "megatron-core"):
        got, both_passes = issued("deepseek-v3-16b", stack)
        assert got == pytest.approx(2 * both_passes, rel=1e-9), stack


def test_each_stack_runs_its_attention_kernel_on_hopper_by_hand():
    """Transformer Engine, and PyTorch's SDPA as meshplan's runtime runs it (2.11), pick cuDNN's fused attention
    on Hopper: Llama 3 8B at seq 8192, mb 1, TP 1 runs 4 x 8192 x 8192 / 2 x 4096 (32 heads x 128) forward
    attention FLOPs a block, at what cuDNN's attention ran in a step on a lent H200, the same die (598 / 437 TFLOP/s
    forward / backward at 4k, carried to 8k by cuDNN's H200 benchmark, 644 / 591 forward and 541 / 474 backward);
    TorchTitan's published runs at FlashAttention-2's (333, FlashAttention-3 paper) times the sustained fraction,
    the backward at 2.5x the FLOPs over each kernel's backward rate."""
    from meshplan.cost_models.timing import block_compute

    flops = 4 * 8192 * 8192 / 2 * 4096
    sf = PROFILE.device.sustained_fraction
    mc = runtime_paths(layout_of(on("megatron-core")), PROFILE)
    ours = runtime_paths(layout_of(on("torchtitan")), PROFILE)
    assert (mc.attention_kernel, ours.attention_kernel) == ("cudnn", "flash")
    assert runtime_paths(layout_of(on("meshplan")), PROFILE).attention_kernel == "cudnn"
    c, o = block_compute(mc, PROFILE), block_compute(ours, PROFILE)
    assert c.attention_forward == pytest.approx(flops / (598e12 * 644 / 591), rel=2e-3)
    assert o.attention_forward == pytest.approx(flops / (sf * 333e12), rel=1e-9)
    assert c.attention_backward == pytest.approx(2.5 * flops / (437e12 * 541 / 474), rel=2e-3)
    assert o.attention_backward == pytest.approx(2.5 * flops / (sf * 0.86 * 333e12), rel=1e-9)
    # On the A100 Transformer Engine runs FlashAttention: no cuDNN points, the profile's own rate.
    a100 = load_profile("a100-80g-dgx")
    lay = runtime_paths(layout_of(on("megatron-core", cluster="a100-80g-dgx")), a100)
    assert block_compute(lay, a100).attention_forward == pytest.approx(
        block_compute(lay.with_(attention_kernel="flash"), a100).attention_forward)


def test_layout_defaults_are_meshplans_runtime():
    """The search and every hand-built Layout price meshplan's own runtime without applying a stack, so the
    MESHPLAN stack may set no Layout field to anything but its default; the other stacks differ somewhere."""
    from dataclasses import MISSING, fields

    from meshplan.cost_models.layout import Layout
    from meshplan.cost_models.stacks import stack_changes

    defaults = {f.name: f.default for f in fields(Layout) if f.default is not MISSING}
    ours = stack_changes("meshplan", "none", None)
    assert ours and set(ours) <= set(defaults)
    assert {k: v for k, v in ours.items() if defaults[k] != v} == {}
    for other in ("torchtitan", "megatron-core"):
        # A field the plan sets (compile, which Megatron-Core makes moot) has no default: a difference too.
        assert {k for k, v in stack_changes(other, "none", None).items() if k not in defaults or defaults[k] != v}


def test_mtp_modules_are_a_megatron_core_plans_and_refused_elsewhere_in_one_line():
    """training.mtp_layers: written only when set, priced on megatron-core (a block of the last layer's kind,
    a projection and a second head on the last stage), refused on the stacks that train none."""
    mc = on("megatron-core", training={**RAW["training"], "mtp_layers": 1})
    assert mc.to_dict()["training"]["mtp_layers"] == 1
    assert "mtp_layers" not in on("megatron-core").to_dict()["training"]  # a plan without MTP reads as before
    assert plan_from_dict(mc.to_dict()).training.mtp_layers == 1
    assert layout_of(mc).mtp_layers == 1
    assert estimate_plan(mc, PROFILE).step_time_s > estimate_plan(on("megatron-core"), PROFILE).step_time_s
    for stack in ("meshplan", "torchtitan"):
        with pytest.raises(InputError) as err:
            on(stack, training={**RAW["training"], "mtp_layers": 1})
        assert str(err.value).startswith(f"training.mtp_layers: must be 0 on stack {stack}")
        assert "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        on("megatron-core", training={**RAW["training"], "mtp_layers": -1})
    assert str(err.value).startswith("training.mtp_layers")


def test_deepep_dispatch_is_a_megatron_core_plans_and_refused_elsewhere_in_one_line():
    """parallel.ep_dispatch: written only when deepep, priced on megatron-core with EP, refused on the stacks
    that send NCCL all-to-alls and without EP. DeepSeek-V3 on 32 H100s, EP 32 over four nodes: DeepEP's
    once-per-node sends leave less of the all-to-all to hide."""
    moe = {**RAW, "model": "deepseek-v3-16b", "stack": "megatron-core",
           "parallel": {**RAW["parallel"], "ep": 32}, "memory": {**RAW["memory"], "activation_checkpointing": "full"}}
    plain = plan_from_dict(moe)
    deepep = plan_from_dict({**moe, "parallel": {**moe["parallel"], "ep_dispatch": "deepep"}})
    assert "ep_dispatch" not in plain.to_dict()["parallel"]
    assert deepep.to_dict()["parallel"]["ep_dispatch"] == "deepep"
    assert plan_from_dict(deepep.to_dict()).parallel.ep_dispatch == "deepep"
    assert layout_of(deepep).ep_dispatch == "deepep"
    a, b = estimate_plan(plain, PROFILE), estimate_plan(deepep, PROFILE)
    assert b.moe["ep_comm_issued_s"] < a.moe["ep_comm_issued_s"]
    for stack in ("meshplan", "torchtitan"):
        with pytest.raises(InputError) as err:
            plan_from_dict({**moe, "stack": stack, "parallel": {**moe["parallel"], "ep_dispatch": "deepep"}})
        assert str(err.value).startswith(f"parallel.ep_dispatch: must be all_to_all on stack {stack}")
        assert "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        plan_from_dict({**moe, "parallel": {**moe["parallel"], "ep": 1, "ep_dispatch": "deepep"}})
    assert str(err.value).startswith("parallel.ep_dispatch: deepep applies only with ep > 1")
    with pytest.raises(InputError) as err:
        plan_from_dict({**moe, "parallel": {**moe["parallel"], "ep_dispatch": "nccl"}})
    assert str(err.value).startswith("parallel.ep_dispatch")


def test_deepep_on_a_stack_without_it_is_refused_before_ep_is_chosen():
    """The stack decides deepep alone: a meshplan plan with ep still 'auto' is refused on load, not once
    the search has filled ep."""
    moe = {**RAW, "model": "deepseek-v3-16b", "parallel": {**RAW["parallel"], "ep": "auto", "ep_dispatch": "deepep"}}
    with pytest.raises(InputError) as err:
        plan_from_dict(moe)
    assert str(err.value).startswith("parallel.ep_dispatch: must be all_to_all on stack meshplan")


def _megatron_moe(model: str, ep: int) -> dict:
    """A megatron-core plan of `model` on one H100 node, 32 sequences of 4096 over 8 FSDP ranks, EP `ep`."""
    return {**RAW, "model": model, "gpus": 8, "stack": "megatron-core", "compile": False,
            "training": {**RAW["training"], "seq_len": 4096, "global_batch": 32},
            "parallel": {**RAW["parallel"], "dp_shard": 8, "ep": ep}}


def _inline_and_overlapped(raw: dict, flag: str):
    """The estimates of `raw` without and with parallel.`flag`, which a plan writes only when set."""
    inline = plan_from_dict(raw)
    overlap = plan_from_dict({**raw, "parallel": {**raw["parallel"], flag: True}})
    assert flag not in inline.to_dict()["parallel"]
    assert getattr(plan_from_dict(overlap.to_dict()).parallel, flag) is True
    return estimate_plan(inline, PROFILE), estimate_plan(overlap, PROFILE)


def test_ep_overlap_leaves_exposed_what_its_unpaired_passes_send_and_is_refused_where_megatron_refuses_it():
    """parallel.ep_overlap: Megatron-Core's combined 1F1B. Without a pipeline it runs the first forward and
    the last backward of n micro-batches unpaired (combined_1f1b_schedule_for_no_pipelining), so with the
    other passes' compute long enough to hide theirs, 1 / n of the all-to-all time stays exposed: Qwen3-30B
    on one H100 node, 32 sequences over 8 ranks, n = 4. Refused in one line on the stacks that issue the
    all-to-alls in line and where Megatron-Core asserts against it."""
    moe = _megatron_moe("qwen3-30b-a3b", 8)
    a, b = _inline_and_overlapped(moe, "ep_overlap")
    assert a.moe["ep_comm_exposed_s"] == pytest.approx(a.moe["ep_comm_issued_s"])
    assert b.moe["ep_comm_exposed_s"] == pytest.approx(b.moe["ep_comm_issued_s"] / 4)
    assert a.step_time_s - b.step_time_s == pytest.approx(0.75 * a.moe["ep_comm_issued_s"], rel=1e-6)
    bad = {"stack": ("meshplan", "parallel.ep_overlap: applies only on stack megatron-core"),
           "ep": (1, "parallel.ep_overlap: applies only with ep > 1"),
           "pp": (2, "parallel.ep_overlap: needs pp_virtual_stages > 1 with pp > 1"),
           "ac": ("full", "parallel.ep_overlap: does not run with activation_checkpointing: full"),
           "mtp": (2, "parallel.ep_overlap: runs with at most 1 MTP module")}
    for what, (value, line) in bad.items():
        raw = {**moe, "parallel": {**moe["parallel"], "ep_overlap": True}}
        if what == "stack":
            raw["stack"] = value
        elif what in ("ep", "pp"):
            raw["parallel"] = {**raw["parallel"], what: value, "dp_shard": 8 // (2 if what == "pp" else 1)}
            raw["gpus"] = 8
        elif what == "ac":
            raw["memory"] = {**raw["memory"], "activation_checkpointing": value}
        else:
            raw["training"] = {**raw["training"], "mtp_layers": value}
        with pytest.raises(InputError) as err:
            plan_from_dict(raw)
        assert str(err.value).startswith(line) and "\n" not in str(err.value)
    interleaved = {**moe, "parallel": {**moe["parallel"], "ep_overlap": True, "dp_shard": 4, "ep": 4, "pp": 2,
                                       "pp_schedule": "Interleaved1F1B", "pp_virtual_stages": 2}}
    assert plan_from_dict(interleaved).parallel.ep_overlap is True


def test_shared_expert_overlap_hides_the_all_to_alls_beside_the_shared_expert_and_is_refused_where_megatron_refuses_it():
    """parallel.shared_expert_overlap: Megatron-Core runs Qwen2-57B-A14B's shared expert (20480 wide) on its own
    stream beside the dispatch and combine. On one H100 node with EP 4 its matmuls outlast each all-to-all,
    so none stays exposed. Refused in one line on the stacks that run the shared experts in line, for a model
    without them, without EP, beside EP overlap and with the shared experts recomputed (Megatron-Core asserts
    the last two)."""
    moe = _megatron_moe("qwen2-57b-a14b", 4)
    a, b = _inline_and_overlapped(moe, "shared_expert_overlap")
    assert a.moe["ep_comm_exposed_s"] == pytest.approx(a.moe["ep_comm_issued_s"])
    assert a.moe["ep_comm_issued_s"] > 0
    assert b.moe["ep_comm_exposed_s"] == 0.0
    assert a.time_s["ep_comm"] == pytest.approx(a.moe["ep_comm_issued_s"]) and b.time_s["ep_comm"] == 0.0
    assert a.time_s["compute"] == b.time_s["compute"]  # the same kernels, moved beside the sends
    # Shorter by the all-to-alls, less what the distributed optimizer's buckets no longer hide beside them
    # (their windows are the first forward and the last backward, sends included: estimate.compute_windows).
    assert 0.0 < a.step_time_s - b.step_time_s <= a.moe["ep_comm_issued_s"]
    on = {**moe, "parallel": {**moe["parallel"], "shared_expert_overlap": True}}
    bad = {"stack": ({**on, "stack": "torchtitan"}, "applies only on stack megatron-core"),
           "model": ({**on, "model": "qwen3-30b-a3b"}, "applies only to a model with shared experts"),
           "ep": ({**on, "parallel": {**on["parallel"], "ep": 1}}, "applies only with ep > 1"),
           "ep_overlap": ({**on, "parallel": {**on["parallel"], "ep_overlap": True}},
                          "cannot run with parallel.ep_overlap"),
           "recompute": ({**on, "memory": {**on["memory"], "activation_checkpointing": "selective", "sac_ops": None,
                                           "recompute_modules": ["shared_experts"]}},
                         "cannot run with the shared_experts recompute module")}
    for what, (raw, line) in bad.items():
        with pytest.raises(InputError) as err:
            plan_from_dict(raw)
        assert str(err.value).startswith(f"parallel.shared_expert_overlap: {line}"), what
        assert "\n" not in str(err.value)


def test_pipeline_receive_buffers_are_allocated_up_front_by_pytorchs_pipelining_alone():
    """PP 4 over 32 GPUs (dp_shard 8), 256 sequences at micro-batch 1: 32 micro-batches a step. PyTorch's
    pipelining (meshplan, TorchTitan) allocates a receive buffer per micro-batch up front, the input in
    forward and its gradient in backward: a middle rank holds 2 x 32 hidden states of 8192 tokens x 4096
    x 2 bytes = 4 GiB, the first rank (no input) half that. Megatron-Core allocates each receive when it is
    posted (Layout.pp_recv_up_front), so none of that is its."""
    raw = {**RAW, "parallel": {**RAW["parallel"], "dp_shard": 8, "pp": 4}}
    hidden_state = 8192 * 4096 * 2 / 2**30
    buffers = {}
    for stack in ("meshplan", "torchtitan", "megatron-core"):
        est = estimate_plan(plan_from_dict({**raw, "stack": stack}), PROFILE)
        buffers[stack] = [r.get("pp_buffers", 0.0) for r in est.per_rank_memory_gib]
    for stack in ("meshplan", "torchtitan"):
        assert buffers[stack] == pytest.approx([32 * hidden_state, 64 * hidden_state, 64 * hidden_state,
                                                32 * hidden_state])
    assert buffers["megatron-core"] == [0.0] * 4


def test_a_compiled_block_moves_the_fused_passes_under_the_fused_form_by_hand():
    """forms.py compiled_elementwise "fused": a compiled Llama 3 8B block (seq 8192, mb 1, TP 1) moves what
    each fused kernel reads and writes once, the hand count above for Megatron-Core's kernels: forward
    (4 + 6) x 4096 + 2 x 5120 + 3 x 14336 + 2 x 4096, backward (6 + 6) x 4096 + 2 x 5120 + 5 x 14336 + 2 x
    4096 elements a token, in bf16, as shipped; the "speedup" alternative divides eager PyTorch's passes by
    compile_speedup instead, and an eager block is the same under both."""
    from meshplan.cost_models import forms
    from meshplan.cost_models.compute import memory_bound_time
    from meshplan.cost_models.timing import elementwise_times

    lay = runtime_paths(layout_of(on("meshplan")), PROFILE)
    assert lay.compile and lay.elementwise_kernels == "pytorch"
    fwd = (4 + 6) * 4096 + 2 * 5120 + 3 * 14336 + 2 * 4096
    bwd = (6 + 6) * 4096 + 2 * 5120 + 5 * 14336 + 2 * 4096
    shipped = elementwise_times(lay, PROFILE)
    with forms.forms(compiled_elementwise="fused"):
        got = elementwise_times(lay, PROFILE)
        eager = elementwise_times(lay.with_(compile=False), PROFILE)
    assert got[0] == pytest.approx(memory_bound_time(PROFILE.device, 8192 * 2.0 * fwd), rel=1e-12)
    assert got[1] == pytest.approx(memory_bound_time(PROFILE.device, 8192 * 2.0 * bwd), rel=1e-12)
    with forms.forms(compiled_elementwise="speedup"):
        speedup = elementwise_times(lay, PROFILE)
        assert eager == elementwise_times(lay.with_(compile=False), PROFILE)
    assert got == shipped and got[0] < speedup[0]
    # A CPU (gloo) profile keeps its own speed-up under either form: no CPU row chose the form.
    cpu = load_profile("cpu-gloo")
    with forms.forms(compiled_elementwise="fused"):
        fused_cpu = elementwise_times(lay, cpu)
    with forms.forms(compiled_elementwise="speedup"):
        assert elementwise_times(lay, cpu) == fused_cpu


def test_a_form_switched_in_a_with_block_reaches_a_memoised_estimate():
    """The block memo is keyed on the forms in force: an estimate made under one form and then under the
    other on the same profile object differs, and is the first again when the form comes back."""
    from meshplan.cost_models import forms

    plan = on("meshplan")
    before = estimate_plan(plan, PROFILE).step_time_s
    with forms.forms(compiled_elementwise="speedup"):
        other = estimate_plan(plan, PROFILE).step_time_s
    assert other > before and estimate_plan(plan, PROFILE).step_time_s == before


def test_torchtitans_complex_rope_stays_eager_under_compile_by_hand():
    """TorchTitan's RoPE is a complex multiply, which Inductor runs as an eager fallback kernel: its compiled
    Llama 3 8B block (seq 8192, mb 1, TP 1) moves the fused count but 10 passes over q and k (4096 + 1024)
    each way, where the fused rotation makes 2: 8 x 5120 elements a token more, forward and backward, in
    bf16. meshplan's runtime and OLMo-core rotate with real cos/sin."""
    from meshplan.cost_models.compute import memory_bound_time
    from meshplan.cost_models.published import OLMO_CORE_OVERRIDES
    from meshplan.cost_models.timing import elementwise_times

    titan = runtime_paths(layout_of(on("torchtitan")), PROFILE)
    ours = runtime_paths(layout_of(on("meshplan")), PROFILE)
    assert titan.rope_complex and not ours.rope_complex and OLMO_CORE_OVERRIDES["rope_complex"] is False
    extra = memory_bound_time(PROFILE.device, 8192 * 2.0 * 8 * 5120)
    got, base = elementwise_times(titan, PROFILE), elementwise_times(titan.with_(rope_complex=False), PROFILE)
    assert got[0] - base[0] == pytest.approx(extra, rel=1e-9) and got[1] - base[1] == pytest.approx(extra, rel=1e-9)
    # eager, both stacks price eager PyTorch's passes (constants.MODEL.rope_passes)
    assert elementwise_times(titan.with_(compile=False), PROFILE) == elementwise_times(
        titan.with_(compile=False, rope_complex=False), PROFILE)


def test_torchtitan_shards_the_embedding_as_a_unit_of_its_own():
    """TorchTitan's apply_fsdp since 2025-07-28 reshards the token embedding after its forward: at the backward's
    peak FSDP holds the root unit's final norm and head unsharded, not the embedding (meshplan's runtime keeps
    all three, as TorchTitan's root unit did before). By hand: Llama 3 8B's embedding, 128256 x 4096 in bf16."""
    from dataclasses import replace

    from meshplan.cost_models.memory import _fsdp_buffers, stage_params

    lay = runtime_paths(layout_of(on("torchtitan")), PROFILE)
    assert lay.fsdp_embedding_unit and not runtime_paths(layout_of(on("meshplan")), PROFILE).fsdp_embedding_unit
    sp = stage_params(lay, 0)
    before = replace(lay, fsdp_embedding_unit=False)
    assert _fsdp_buffers(before, sp) - _fsdp_buffers(lay, sp) == VOCAB * 4096 * 2
    gib = {k: estimate_plan(on("torchtitan"), PROFILE, fsdp_embedding_unit=v).memory_gib["fsdp_buffers"]
           for k, v in (("unit", True), ("root", False))}
    assert (gib["root"] - gib["unit"]) * 2**30 == pytest.approx(VOCAB * 4096 * 2, rel=1e-9)
