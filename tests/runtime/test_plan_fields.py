"""Every plan field has an effect on what the runtime builds, or is refused before launch.

The field list is derived from the Plan dataclasses, so a new field without a decision here fails
`test_every_field_has_a_decision`. Checks are construction-only: Trainers are built in one process
on PyTorch's fake process group (any world size, collectives are no-ops), nothing is trained.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from meshplan.errors import InputError
from meshplan.runtime.data import local_rows
from meshplan.runtime.metrics import predicted
from meshplan.runtime.options import RunOptions, check_runnable
from meshplan.runtime.train import Trainer
from meshplan.specs.plan import Plan, plan_from_dict
from kept import kept_after_forward
from plan_base import base_plan

SECTIONS = ("training", "parallel", "memory")


def plan_fields() -> set[str]:
    """Every field of the plan schema: top-level Plan fields, and each field of its sections."""
    out = set()
    for f in dataclasses.fields(Plan):
        if f.name in SECTIONS:
            section = type(getattr(Plan(model=None, cluster="", gpus=1), f.name))
            out |= {f"{f.name}.{g.name}" for g in dataclasses.fields(section)}
        else:
            out.add(f.name)
    return out


def raw(**edits) -> dict:
    """base_plan("tiny", "cpu-gloo") with dotted-path edits; gpus = product of the degrees."""
    out = base_plan("tiny", "cpu-gloo")
    for path, value in edits.items():
        *head, leaf = path.split("__")
        node = out
        for key in head:
            node = node[key]
        node[leaf] = value
    p = out["parallel"]
    out["gpus"] = p["dp_replicate"] * p["dp_shard"] * p["tp"] * p["pp"] * p["cp"]
    return out


@contextlib.contextmanager
def fake_world(size: int):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def no_world_left():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def build(**edits) -> Trainer:
    """A Trainer for the edited plan, its fake world left up (meshes stay sliceable) until the
    next build or the end of the test."""
    plan = plan_from_dict(raw(**edits))
    if dist.is_initialized():
        dist.destroy_process_group()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.gpus)
    return Trainer(plan, RunOptions(steps=2, quiet=True), torch.device("cpu"))


def blocks(t: Trainer) -> list:
    return [b for m in t.model.parts for b in m.layers.values()]


# --- what each field does ------------------------------------------------------------------------

def effect_model():
    n = lambda t: sum(p.numel() for p in t.params)  # noqa: E731
    assert n(build(model="tiny")) != n(build(model="tiny-gpt"))


def effect_cluster():
    # The cluster is the profile the run's summary.json predicts with (and MFU is measured against).
    a, _ = predicted(plan_from_dict(raw()))
    b, _ = predicted(plan_from_dict(raw(cluster="h100-80g-dgx")))
    assert a["step_time_s"] != b["step_time_s"]


def effect_gpus():
    plan = plan_from_dict(raw(parallel__dp_shard=2))
    if dist.is_initialized():
        dist.destroy_process_group()
    with fake_world(4), pytest.raises(InputError, match="gpus"):
        Trainer(plan, RunOptions(steps=1, quiet=True), torch.device("cpu"))


def effect_seq_len():
    t = build(training__seq_len=64)
    assert local_rows(t.source, 0, 0, 1)[0].shape == (8, 64)


def effect_global_batch():
    t = build(training__global_batch=4)
    assert local_rows(t.source, 0, 0, 1)[0].shape == (4, 32)


def effect_micro_batch():
    assert (build().n_micro, build(training__micro_batch=4).n_micro) == (4, 2)


def effect_dtype():
    # bf16 compute with fp32 master weights (issue 15 item 1, another helper's part of the work).
    t = build(training__dtype="bf16")
    policies = [getattr(getattr(m, "_get_fsdp_state", lambda: None)(), "_mp_policy", None) for m in t.model.parts]
    assert any(p is not None and p.param_dtype == torch.bfloat16 for p in policies) or \
        any(getattr(m, "compute_dtype", None) == torch.bfloat16 for m in t.model.parts)


def effect_grad_reduce_dtype():
    """bf16: every fully_shard unit reduces in bf16 (what it sends is measured in test_layouts.py:
    test_bf16_gradient_reduction_sends_half_the_bytes); an fp32 plan refuses it on load."""
    def reduce_dtypes(t):
        return {b._get_fsdp_state()._mp_policy.reduce_dtype for b in blocks(t)}
    assert reduce_dtypes(build(training__dtype="bf16", parallel__dp_shard=2)) == {torch.float32}
    assert reduce_dtypes(build(training__dtype="bf16", parallel__dp_shard=2,
                               memory__grad_reduce_dtype="bf16")) == {torch.bfloat16}
    refused_on_load(raw(memory__grad_reduce_dtype="bf16"), "memory.grad_reduce_dtype")


def effect_dp_replicate():
    assert build(parallel__dp_replicate=2).model.data_parallel == "ddp"


def effect_dp_shard():
    t = build(parallel__dp_shard=2)
    assert t.model.data_parallel == "fsdp" and all(isinstance(p, DTensor) for p in t.params)


def effect_tp():
    t = build(parallel__tp=2)
    wq = t.model.parts[0].layers["0"].attention.wq.weight
    assert isinstance(wq, DTensor) and wq.to_local().shape[0] == wq.shape[0] // 2


def effect_sequence_parallel():
    norm = lambda t: t.model.parts[0].layers["0"].attention_norm.weight  # noqa: E731
    assert isinstance(norm(build(parallel__tp=2, parallel__sequence_parallel=True)), DTensor)
    assert not isinstance(norm(build(parallel__tp=2)), DTensor)
    refused_on_load(raw(parallel__sequence_parallel=True), "parallel.sequence_parallel")  # no TP to shard over


def refused_async_tp():
    plan = plan_from_dict(raw(parallel__tp=2, parallel__async_tp=True, compile=True))
    refused(plan, "parallel.async_tp")
    refused_on_load(raw(parallel__async_tp=True, compile=True), "parallel.async_tp")  # tp 1


def effect_ep():
    """Expert parallelism: each MoE layer's routed experts are Shard(0) DTensors over an ep mesh dimension of
    2 ranks (4 of the 8 experts here) and tokens reach them through the all-to-all dispatcher; a dense model
    refuses ep > 1 on load, and a fold the runtime does not build (TP without EP) is refused before launch."""
    from meshplan.runtime.expert_parallel import AllToAllDispatch

    t = build(model="tiny-moe", parallel__dp_shard=2, parallel__ep=2)
    layers = [b.moe for b in blocks(t) if b.moe is not None]
    assert len(layers) == 3 and all(isinstance(m.dispatch, AllToAllDispatch) for m in layers)
    w1 = layers[0].experts.w1
    assert isinstance(w1, DTensor) and tuple(w1.shape) == (8, 32, 64) and "ep" in w1.device_mesh.mesh_dim_names
    assert w1.device_mesh["ep"].size() == 2
    refused_on_load(raw(parallel__dp_shard=2, parallel__ep=2), "parallel.ep")
    refused(plan_from_dict(raw(model="tiny-moe", parallel__tp=2, parallel__sequence_parallel=True)), "parallel.ep")


def refused_stack():
    """`stack` prices a layout as another stack runs it (tests/foundation/test_stacks.py); `run` executes
    meshplan's runtime, so it refuses any other stack before launch, and an unknown stack on load."""
    refused(plan_from_dict(raw(stack="megatron-core")), "stack")
    refused_on_load(raw(stack="jax"), "stack")


def refused_mtp_layers():
    """`training.mtp_layers` prices Megatron-Core's multi-token-prediction modules (tests/foundation/
    test_stacks.py); meshplan's runtime trains none, so a plan of its stack refuses any on load."""
    refused_on_load(raw(training__mtp_layers=1), "training.mtp_layers")


def refused_cross_entropy_fusion():
    """`training.cross_entropy_fusion` names Megatron-Core's loss kernel (tests/foundation/test_stacks.py);
    meshplan's runtime runs its own loss, so a plan of its stack refuses the field on load."""
    refused_on_load(raw(training__cross_entropy_fusion="te"), "training.cross_entropy_fusion")


def refused_optimizer_precision():
    """`memory.optimizer_state_dtype` and `memory.main_grads_dtype` price Megatron-Core's precision-aware optimizer
    (tests/foundation/test_stacks.py); meshplan's runtime runs torch.optim's fp32 AdamW, so a plan of its stack
    refuses either on load."""
    refused_on_load(raw(memory__optimizer_state_dtype="bf16"), "memory.optimizer_state_dtype")
    refused_on_load(raw(memory__main_grads_dtype="bf16"), "memory.main_grads_dtype")


def refused_offload_modules():
    """`memory.offload_modules` prices Megatron-Core's fine-grained activation offloading
    (tests/foundation/test_activation_offload.py); meshplan's runtime keeps its activations on the GPU, so a
    plan of its stack refuses the field on load."""
    refused_on_load(raw(memory__offload_modules=["moe_act"]), "memory.offload_modules")


def refused_ep_dispatch():
    """`parallel.ep_dispatch: deepep` prices Megatron-Core's DeepEP dispatch (tests/foundation/test_stacks.py);
    meshplan's runtime sends NCCL all-to-alls, so a plan of its stack refuses deepep on load."""
    refused_on_load(raw(model="tiny-moe", parallel__dp_shard=2, parallel__ep=2, parallel__ep_dispatch="deepep"),
                    "parallel.ep_dispatch")


def refused_ep_overlap():
    """`parallel.ep_overlap` prices Megatron-Core's EP overlap (tests/foundation/test_stacks.py); meshplan's
    runtime issues its all-to-alls in line, so a plan of its stack refuses the overlap on load."""
    refused_on_load(raw(model="tiny-moe", parallel__dp_shard=2, parallel__ep=2, parallel__ep_overlap=True),
                    "parallel.ep_overlap")


def refused_shared_expert_overlap():
    """`parallel.shared_expert_overlap` prices Megatron-Core's shared-expert overlap (tests/foundation/
    test_stacks.py); meshplan's runtime runs the shared experts in line, so a plan of its stack refuses it on
    load."""
    refused_on_load(raw(model="tiny-moe", parallel__dp_shard=2, parallel__ep=2, parallel__shared_expert_overlap=True),
                    "parallel.shared_expert_overlap")


def refused_recompute_modules():
    """`memory.recompute_modules` prices Megatron-Core's selective recompute by module (tests/foundation/
    test_megatron_recompute.py); meshplan's runtime saves op kinds (sac_ops), so a plan of its stack refuses
    the field on load."""
    refused_on_load(raw(memory__activation_checkpointing="selective", memory__recompute_modules=["layernorm"]),
                    "memory.recompute_modules")


def effect_pp():
    t = build(model="tiny-4l", parallel__pp=2)
    assert list(t.model.parts[0].layers.keys()) == ["0", "1"] and t.schedule is not None


def effect_pp_schedule():
    refused_on_load(raw(parallel__pp_schedule="DualPipeV"), "parallel.pp_schedule")  # pp 1 runs no schedule
    a = build(model="tiny-4l", parallel__pp=2, parallel__pp_schedule="GPipe")
    b = build(model="tiny-4l", parallel__pp=2, parallel__pp_schedule="1F1B")
    assert type(a.schedule).__name__ == "ScheduleGPipe" and type(b.schedule).__name__ == "Schedule1F1B"


def effect_pp_virtual_stages():
    t = build(model="tiny-4l", parallel__pp=2, parallel__pp_schedule="Interleaved1F1B", parallel__pp_virtual_stages=2)
    assert t.model.stage_ids == [0, 2]


def effect_pp_layers():
    t = build(model="tiny-4l", parallel__pp=2, parallel__pp_layers=[1, 3])
    assert list(t.model.parts[0].layers.keys()) == ["0"]
    refused_on_load(raw(model="tiny-4l", parallel__pp_layers=[3, 1]), "parallel.pp_layers")  # pp 1: no stages


def effect_cp():
    t = build(parallel__cp=2)
    assert t.model.seq_layout.cp_size == 2
    assert all(b.attention.cp_attention is not None and b.attention.cp_kind == "gather" for b in blocks(t))


def effect_activation_checkpointing():
    # tiny (dim 64, ffn 128) keeps far less for backward under full AC: the block's input only.
    kept = {ac: kept_after_forward(blocks(build(memory__activation_checkpointing=ac))[0], 2, 32, 64)
            for ac in ("none", "full")}
    assert kept["full"] < kept["none"] / 4, kept


def effect_sac_ops():
    # Adding ffn_in to the saved op kinds keeps w1's and w3's outputs: 2 x (2 x 32 tokens) x 128 x 4 bytes.
    a = kept_after_forward(blocks(build(memory__activation_checkpointing="selective", memory__sac_ops=["qkv"]))[0],
                           2, 32, 64)
    b = kept_after_forward(blocks(build(memory__activation_checkpointing="selective",
                                        memory__sac_ops=["qkv", "ffn_in"]))[0], 2, 32, 64)
    assert b - a == 2 * (2 * 32) * 128 * 4


def effect_float8():
    from torchao.float8.float8_linear import Float8Linear

    from meshplan.cost_models.plan_checks import check_against_profile
    from meshplan.profiles import load_profile

    with pytest.raises(InputError, match="fp8 tensor cores"):  # an A100 has none
        check_against_profile(plan_from_dict(raw(memory__float8=True, training__dtype="bf16", cluster="a100-80g-dgx")),
                              load_profile("a100-80g-dgx"))

    t = build(parallel__dp_shard=2, memory__float8=True)
    linears = [m for b in blocks(t) for m in b.modules() if isinstance(m, Float8Linear)]
    assert linears and all(m.config.enable_fsdp_float8_all_gather for m in linears)
    assert t.optimizers[-1]._optimizer_step_post_hooks, "scales precomputed after each step"


def effect_reshard_after_forward():
    def flags(t):
        return [b._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None for b in blocks(t)]
    on = flags(build(parallel__dp_shard=2, memory__reshard_after_forward=True))
    off = flags(build(parallel__dp_shard=2, memory__reshard_after_forward=False))
    assert on == [True, False] and off == [False, False]  # the last block never reshards (backward next)
    # Without fully_shard (DDP, or fp32 on one rank) it is moot: normalised to false, and said.
    from meshplan.specs.rules import normalise_moot_fields

    ddp = plan_from_dict(raw(parallel__dp_replicate=2, memory__reshard_after_forward=True))
    assert normalise_moot_fields(ddp) == ["memory.reshard_after_forward: true has no effect without FSDP "
                                          "(dp_shard*cp = 1 and DDP or fp32): run and estimated as false"]
    assert ddp.memory.reshard_after_forward is False
    bf16 = plan_from_dict(raw(training__dtype="bf16", memory__reshard_after_forward=True))  # one-rank fully_shard
    assert normalise_moot_fields(bf16) == [] and bf16.memory.reshard_after_forward is True


def compiled_regions_run(block, batch: int = 2, seq: int = 32) -> int:
    """Compiled regions (graphs) a forward and backward of `block` ran, counted by the profiler."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(batch, seq, 64, requires_grad=True)
    block(x).sum().backward()  # compiles outside the count
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        block(x).sum().backward()
    return sum(e.name in ("CompiledFunction", "CompiledFunctionBackward") for e in prof.events())


def effect_compile():
    # A compiled block runs one graph forward and one backward, under AC too; an uncompiled one none.
    torch._dynamo.reset()
    assert compiled_regions_run(blocks(build(compile=True, memory__activation_checkpointing="selective"))[0]) == 2
    assert compiled_regions_run(blocks(build())[0]) == 0


def effect_mesh_order():
    order = ["pp", "dp_replicate", "cp", "dp_shard", "tp"]
    t = build(parallel__dp_shard=2, parallel__cp=2, mesh_order=order)
    assert t.mesh.root.mesh_dim_names == tuple(order)
    # dp_shard is now inside cp: neighbouring ranks shard, CP pairs ranks 2 apart (default: [0, 1]).
    assert t.mesh["dp_shard"].mesh.tolist() == [0, 1] and t.mesh["cp"].mesh.tolist() == [0, 2]
    refused(plan_from_dict(raw(mesh_order=["pp", "dp_shard", "dp_replicate", "cp", "tp"])), "mesh_order")


def checked_placement():
    # Where mesh_order puts each group on the profile's links: a plan's placement must agree, name
    # one of the profile's link levels, and place a group that exists.
    from meshplan.cost_models.plan_checks import check_against_profile
    from meshplan.profiles import load_profile

    gloo = load_profile("cpu-gloo")
    check_against_profile(plan_from_dict(raw(parallel__tp=2, placement={"tp": "loopback"})), gloo)
    for placement, why in (({"tp": "nonsense-level"}, "link levels"), ({"dp_shard": "loopback"}, "size 1")):
        with pytest.raises(InputError, match=why) as err:
            check_against_profile(plan_from_dict(raw(parallel__tp=2, placement=placement)), gloo)
        assert str(err.value).startswith("placement.")
    h100 = load_profile("h100-80g-dgx")  # 8 a node: dp_shard 16 spans two nodes
    big = raw(parallel__dp_shard=16, training__global_batch=32, cluster="h100-80g-dgx", placement={"dp_shard": "nvlink"})
    with pytest.raises(InputError, match="puts the dp_shard group on"):
        check_against_profile(plan_from_dict(big), h100)


def format_model_ref():
    assert plan_from_dict(raw()).to_dict()["model"] == "tiny"  # the name written back, not the spec


def format_version():
    with pytest.raises(InputError, match="version"):
        plan_from_dict({**raw(), "version": 2})


def refused_on_load(mapping: dict, field_name: str) -> None:
    with pytest.raises(InputError) as err:
        plan_from_dict(mapping)
    assert str(err.value).startswith(field_name) and "\n" not in str(err.value)


def refused(plan, field_name: str) -> None:
    with pytest.raises(InputError) as err:
        check_runnable(plan, "cpu")
    line = str(err.value)
    assert field_name in line and "\n" not in line


DECISIONS = {
    "model": effect_model, "cluster": effect_cluster, "gpus": effect_gpus, "compile": effect_compile,
    "placement": checked_placement, "mesh_order": effect_mesh_order, "model_ref": format_model_ref,
    "version": format_version, "stack": refused_stack,
    "training.seq_len": effect_seq_len, "training.global_batch": effect_global_batch,
    "training.micro_batch": effect_micro_batch, "training.dtype": effect_dtype,
    "training.mtp_layers": refused_mtp_layers, "parallel.ep_dispatch": refused_ep_dispatch,
    "training.cross_entropy_fusion": refused_cross_entropy_fusion,
    "parallel.ep_overlap": refused_ep_overlap, "parallel.shared_expert_overlap": refused_shared_expert_overlap,
    "parallel.dp_replicate": effect_dp_replicate, "parallel.dp_shard": effect_dp_shard, "parallel.tp": effect_tp,
    "parallel.sequence_parallel": effect_sequence_parallel, "parallel.async_tp": refused_async_tp,
    "parallel.pp": effect_pp, "parallel.pp_schedule": effect_pp_schedule,
    "parallel.pp_virtual_stages": effect_pp_virtual_stages, "parallel.pp_layers": effect_pp_layers,
    "parallel.cp": effect_cp, "parallel.ep": effect_ep,
    "memory.activation_checkpointing": effect_activation_checkpointing, "memory.sac_ops": effect_sac_ops,
    "memory.float8": effect_float8, "memory.reshard_after_forward": effect_reshard_after_forward,
    "memory.recompute_modules": refused_recompute_modules,
    "memory.optimizer_state_dtype": refused_optimizer_precision, "memory.main_grads_dtype": refused_optimizer_precision,
    "memory.offload_modules": refused_offload_modules, "memory.grad_reduce_dtype": effect_grad_reduce_dtype,
}


def test_every_field_has_a_decision():
    assert set(DECISIONS) == plan_fields()


@pytest.mark.parametrize("field_name", sorted(DECISIONS))
def test_field_has_an_effect_or_is_refused(field_name):
    DECISIONS[field_name]()


def test_async_tp_runs_where_it_can_and_is_refused_without_compile():
    plan = plan_from_dict(raw(parallel__tp=2, parallel__async_tp=True, compile=True))
    check_runnable(plan, "cuda")  # accepted on CUDA with compile
    refused(plan_from_dict(raw(parallel__tp=2, parallel__async_tp=True)), "parallel.async_tp")
    with pytest.raises(InputError, match="compile"):
        check_runnable(plan_from_dict(raw(parallel__tp=2, parallel__async_tp=True)), "cuda")


def test_float8_with_tp_is_refused_on_gloo_only():
    """gloo has no float8 dtype: a float8 TP plan crashed and then hung there (knob matrix)."""
    plan = plan_from_dict(raw(parallel__tp=2, memory__float8=True))
    refused(plan, "memory.float8")
    check_runnable(plan, "cuda")
    check_runnable(plan_from_dict(raw(memory__float8=True)), "cpu")  # float8 without TP runs on gloo


@pytest.mark.parametrize("ac", ["none", "full", "selective"])
def test_compiled_tp_blocks_are_refused_on_gloo_only(ac):
    """Compiled TP blocks fail on gloo under every AC mode (test_compile.py); they used to "train"
    under full or selective AC only because those blocks silently ran eager."""
    plan = plan_from_dict(raw(parallel__tp=2, compile=True, memory__activation_checkpointing=ac))
    refused(plan, "compile")
    check_runnable(plan, "cuda")
    check_runnable(plan_from_dict(raw(parallel__tp=2, memory__activation_checkpointing=ac)), "cpu")


@pytest.mark.parametrize("schedule, accepted", [("Interleaved1F1B", True), ("InterleavedZeroBubble", True),
                                                ("LoopedBFS", True), ("ZBVZeroBubble", False)])
def test_micro_batch_rule_is_pytorchs(schedule, accepted):
    """pp 2 x 2 virtual stages with 2 micro-batches per rank: the interleaved schedules train (run on
    gloo, torch 2.13: both steps, same losses as each other), which the runtime used to refuse
    while the planner picked it; V-shaped ZBV needs a micro-batch per stage (4)."""
    plan = plan_from_dict({**raw(model="tiny-4l", parallel__pp=2, parallel__pp_virtual_stages=2,
                                 parallel__pp_schedule=schedule, training__global_batch=2, training__micro_batch=1)})
    if accepted:
        check_runnable(plan, "cpu")
    else:
        refused(plan, "training.global_batch")


ISSUE_EXAMPLES = {
    # pp 1 with a stage split and a V-shaped schedule: there are no stages to split.
    "pp_layers without pp": ({"model": "small", "parallel__pp_layers": [7, 1, 0], "parallel__pp_schedule": "DualPipeV"},
                             "parallel.pp_layers"),
    "placement on no link": ({"parallel__dp_shard": 2, "placement": {"dp_shard": "nonsense-level"}},
                             "placement.dp_shard"),
    "float8 on an A100": ({"model": "llama3-8b", "cluster": "a100-80g-dgx", "parallel__dp_shard": 8,
                           "training__dtype": "bf16", "training__global_batch": 16, "memory__float8": True}, "memory.float8"),
    # Uncompiled float8 on an H100: slower than bf16 there (specs/rules.float8_compile_reason).
    "float8 uncompiled on an H100": ({"model": "llama3-8b", "cluster": "h100-80g-dgx", "parallel__dp_shard": 8,
                                      "training__dtype": "bf16", "training__global_batch": 16, "memory__float8": True,
                                      "compile": False}, "memory.float8"),
}


@pytest.mark.parametrize("command", ["estimate", "run"])
@pytest.mark.parametrize("example", sorted(ISSUE_EXAMPLES))
def test_fields_once_accepted_and_ignored_are_refused_by_estimate_and_run(tmp_path, capsys, command, example):
    import yaml

    from meshplan import cli

    edits, field_name = ISSUE_EXAMPLES[example]
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw(**edits)))
    assert cli.main([command, "--plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"error: {field_name}" in err, err
