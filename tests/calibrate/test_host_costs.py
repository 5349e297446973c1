"""Host-side costs (cost_models/host.py): the op and call counts match the runtime, only GPU profiles
price them (beside the kernels), and calibration recovers them from a tiny model's runs without trading them for bandwidth."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from synthetic import MESHES, write_runs  # noqa: E402

from meshplan.cost_models.calibrate import calibrate, load_run, with_overhead  # noqa: E402
from meshplan.cost_models.host import (BLOCK_OPS, OPTIMIZER_OPS_PER_TENSOR, HostOps, block_host,  # noqa: E402
                                       block_tensors, embedding_host, head_host, priced, root_tensors, step_host)
from meshplan.cost_models.layout import layout_of  # noqa: E402
from meshplan.profiles import load_profile  # noqa: E402
from meshplan.profiles.registry import builtin_names  # noqa: E402
from meshplan.profiles.schema import ClusterProfile  # noqa: E402
from meshplan.specs.plan import Plan, plan_from_dict  # noqa: E402
from meshplan.specs.registry import resolve_model  # noqa: E402

HOST = {"op_dispatch_s": 4e-5, "python_dispatch_s": 1.5e-4, "collective_sync_s": 4e-3}


def tiny_plan(gpus: int, seq: int = 128, batch: int = 8, mb: int = 1, ac: str = "none", r: int = 1, s: int = 1,
              c: int = 1, t: int = 1, pp: int = 1, schedule: str = "1F1B", v: int = 1) -> Plan:
    """tiny-4l on cpu-gloo, fp32, no float8 or compile: the layouts these tests count and price."""
    return plan_from_dict({
        "model": "tiny-4l", "cluster": "cpu-gloo", "gpus": gpus,
        "training": {"seq_len": seq, "global_batch": batch, "micro_batch": mb, "dtype": "fp32"},
        "parallel": {"dp_replicate": r, "dp_shard": s, "cp": c, "tp": t, "pp": pp, "sequence_parallel": t > 1,
                     "async_tp": False, "pp_schedule": schedule, "pp_virtual_stages": v, "pp_layers": None},
        "memory": {"activation_checkpointing": ac, "sac_ops": None, "float8": False, "reshard_after_forward": True},
        "compile": False})


class _OpCounter:
    """Counts the aten ops dispatched inside a `with` block (a TorchDispatchMode)."""

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.n += 1
                return func(*args, **(kwargs or {}))

        self.n, self.mode = 0, Mode()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)


def _runtime_counts(model, layers: int, ac: str) -> tuple[int, int, int]:
    """(forward, backward, optimizer) ops of the runtime's model (a name or a spec) with `layers` blocks, one
    micro-batch."""
    import torch

    from meshplan.runtime.activation_checkpoint import apply_ac
    from meshplan.runtime.initialisation import init_weights
    from meshplan.runtime.model import build_model
    from meshplan.runtime.train import loss_fn

    torch.manual_seed(0)
    m = build_model(replace(resolve_model(model), n_layers=layers), "cpu")
    init_weights(m, m.spec, 0)  # an MoE layer's counters are buffers: zeros, not the CPU allocator's leftovers
    apply_ac(m, ac, None)
    opt = torch.optim.AdamW(m.parameters())
    x = torch.randint(0, m.spec.vocab_size, (1, 64))
    loss_fn(m(x), x).backward()  # warm-up: lazy state
    opt.step()
    with _OpCounter() as fwd:
        loss = loss_fn(m(x), x)
    with _OpCounter() as bwd:
        loss.backward()
    with _OpCounter() as step:
        opt.step()
        opt.zero_grad(set_to_none=True)
    return fwd.n, bwd.n, step.n


@pytest.mark.parametrize("model", ["tiny-4l", "tiny-gpt"])
def test_block_op_counts_match_the_runtime(model):
    """One block's ops = the difference between a 4- and a 2-block model, over 2."""
    arch = resolve_model(model).arch
    per = {}
    for ac in ("none", "full"):
        two, four = _runtime_counts(model, 2, ac), _runtime_counts(model, 4, ac)
        per[ac] = [(b - a) / 2 for a, b in zip(two, four)]
    counted = BLOCK_OPS[arch]
    assert per["none"][0] == pytest.approx(counted.forward, rel=0.1)
    assert per["none"][1] == pytest.approx(counted.backward, rel=0.1)
    # Under full AC the backward also replays the forward: the difference is the recompute count.
    assert per["full"][1] - per["none"][1] == pytest.approx(counted.recompute, rel=0.1)
    assert per["none"][2] == pytest.approx(OPTIMIZER_OPS_PER_TENSOR * block_tensors(resolve_model(model)), rel=0.1)


MOE_VARIANTS = {"softmax_aux_shared": {}, "no_shared": {"shared_experts": 0},
                "sigmoid_bias": {"router": "sigmoid", "load_balance": "bias"}}


@pytest.mark.parametrize("variant", sorted(MOE_VARIANTS))
def test_moe_block_op_counts_match_the_runtime(variant):
    """One MoE block's ops (5 against 3 layers of tiny-moe, whose first layer is dense) against block_host of an
    MoE layer, forward, backward and full AC's replay, and its parameter tensors through the optimizer."""
    base = resolve_model("tiny-moe")
    spec = replace(base, moe=replace(base.moe, **MOE_VARIANTS[variant]))
    per = {}
    for ac in ("none", "full"):
        three, five = _runtime_counts(spec, 3, ac), _runtime_counts(spec, 5, ac)
        per[ac] = [(b - a) / 2 for a, b in zip(three, five)]
    plan = tiny_plan(1, ac="full")
    lay = layout_of(plan).with_(spec=spec)
    f, b, r = block_host(lay, layer=1)
    assert per["none"][0] == pytest.approx(f.ops, rel=0.1)
    assert per["none"][1] == pytest.approx(b.ops, rel=0.1)
    # Full AC's replay: priced per forward op (checkpoint_op_s), as a dense block's, so the ratio must hold.
    dense = BLOCK_OPS["llama"]
    assert (per["full"][1] - per["none"][1]) / per["none"][0] == pytest.approx(dense.recompute / dense.forward, rel=0.1)
    assert r.checkpointed == f.ops
    assert per["none"][2] == pytest.approx(OPTIMIZER_OPS_PER_TENSOR * block_tensors(spec, 1), rel=0.1)


@pytest.mark.parametrize("model", ["tiny-4l", "tiny-gpt"])
def test_parameter_tensor_counts_match_the_runtime(model):
    from meshplan.runtime.model import build_model

    spec = resolve_model(model)
    m = build_model(spec, "meta")
    names = [n for n, _ in m.named_parameters()]
    in_blocks = Counter(n.split(".")[1] for n in names if n.startswith("layers."))
    assert set(in_blocks.values()) == {block_tensors(spec)}
    assert len(names) - sum(in_blocks.values()) == root_tensors(spec, first=True, last=True)


# Collective calls of one training step on rank 0, counted in `meshplan run` of tiny-4l (seq 128, global
# batch 8, 4 gloo ranks, torch 2.13) with a TorchDispatchMode over the c10d ops, pipeline sends excluded
# (the schedule simulation prices those): (dp_replicate, dp_shard, cp, tp, micro_batch, ac) -> calls.
RUNTIME_CALLS = {
    (4, 1, 1, 1, 1, "none"): 3,  # DDP: a gradient all-reduce per micro-batch, the loss all-reduce
    (1, 4, 1, 1, 1, "none"): 29,  # FSDP: 5 + 4 all-gathers and 5 reduce-scatters per micro-batch
    (2, 2, 1, 1, 1, "none"): 39,  # HSDP: plus an all-reduce per unit
    (1, 2, 2, 1, 1, "none"): 121,  # FSDP x CP: K and V gathered, their gradients all-reduced, per block
    (1, 2, 1, 2, 1, "none"): 237,  # FSDP x TP + SP
}


@pytest.mark.parametrize("mesh, calls", RUNTIME_CALLS.items())
def test_collective_call_counts_match_the_runtime(mesh, calls):
    r, s, c, t, mb, ac = mesh
    lay = layout_of(tiny_plan(4, mb=mb, ac=ac, r=r, s=s, c=c, t=t))
    f, b, r = block_host(lay)
    hf, hb = head_host(lay)
    per_micro = (f + b + r) * lay.spec.n_layers + hf + hb + embedding_host(lay)
    modelled = per_micro.calls * lay.n_micro + step_host(lay, 0).calls
    assert modelled == pytest.approx(calls, rel=0.05)


def test_only_the_gpu_profiles_price_host_work():
    """The GPU profiles carry host costs measured on a GPU machine's host (priced where they outlast the
    kernels: tests/foundation/test_host_on_gpu.py); the built-in CPU profile prices none."""
    for name in builtin_names():
        assert priced(load_profile(name)) == (name != "cpu-gloo"), name


def test_calibration_recovers_host_costs_of_a_tiny_model(tmp_path):
    """Runs of tiny-4l (seq 128, as in the calibration benchmark) made by the cost model with known host
    costs and the profile's own device and link terms: the fit finds the host costs and leaves the measured
    bandwidth, matmul and memory-bound terms where they were, rather than trading one for the other."""
    base = load_profile("cpu-gloo")
    truth = with_overhead(base, "fsdp_overlap", 0.0)  # four processes on two cores: no core left to overlap on
    for name, value in HOST.items():
        truth = with_overhead(truth, name, value)
    runs = write_runs(tmp_path, truth, MESHES, model="tiny-4l", seq_len=128, global_batch=16)
    fit = calibrate([load_run(d) for d in runs], base)
    for name, value in HOST.items():
        assert fit.before[f"overheads.{name}"] == 0
        assert fit.after[f"overheads.{name}"] == pytest.approx(value, rel=0.03), name
    assert fit.after["overheads.fsdp_overlap"] == pytest.approx(0.0, abs=0.01)
    for name in ("device.matmul.max_fraction.fp32", "device.memory_bound_efficiency",
                 "collectives.loopback.bus_bandwidth_scale"):
        assert fit.after[name] == pytest.approx(fit.before[name], rel=0.03), name


def _with_host(**values) -> ClusterProfile:
    prof = load_profile("cpu-gloo")
    return replace(prof, overheads=replace(prof.overheads, **values))


def _recompute_and_forward(ac: str, **host) -> tuple[float, float]:
    from meshplan.cost_models.estimate import estimate_plan

    base, priced_ = (estimate_plan(tiny_plan(1, batch=4, ac=ac), prof) for prof in (_with_host(), _with_host(**host)))
    return (priced_.time_s["recompute"] - base.time_s["recompute"],
            priced_.time_s["compute"] - base.time_s["compute"])


def test_checkpoint_cost_is_per_forward_op_of_every_block_and_micro_batch():
    # tiny-4l: 4 blocks, 4 micro-batches of 1 (batch 4 on one rank), 109 forward ops a Llama block.
    recompute, forward = _recompute_and_forward("full", checkpoint_op_s=1e-5)
    assert recompute == pytest.approx(4 * 4 * 109 * 1e-5, rel=1e-9)
    assert forward == pytest.approx(0.0, abs=1e-12)


def test_selective_policy_cost_is_shared_by_the_forward_and_the_replay():
    recompute, forward = _recompute_and_forward("selective", checkpoint_op_s=0.0, sac_op_s=2e-5)
    assert recompute == pytest.approx(4 * 4 * 109 * 1e-5, rel=1e-9)
    assert forward == pytest.approx(4 * 4 * 109 * 1e-5, rel=1e-9)


def test_a_profile_without_checkpoint_costs_prices_the_counted_replay_ops():
    """Profiles measured before checkpoint_op_s and sac_op_s existed keep their old prices: the replay's
    counted ops at op_dispatch_s, and the policy's Python dispatch on the forward's and the replay's ops."""
    recompute, _ = _recompute_and_forward("full", op_dispatch_s=3e-6)
    assert recompute == pytest.approx(4 * 4 * BLOCK_OPS["llama"].recompute * 3e-6, rel=1e-9)
    recompute, forward = _recompute_and_forward("selective", python_dispatch_s=2e-5)
    ops = BLOCK_OPS["llama"]
    assert recompute + forward == pytest.approx(4 * 4 * (ops.forward + ops.recompute) * 2e-5, rel=1e-9)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_cp_gather_op_counts_match_the_runtime(tmp_path):
    """A block under CP 2 on gloo, counted in the runtime at 5 and 18 visible tiles per rank."""
    import json
    import os
    import subprocess

    out = tmp_path / "cp_counts.json"
    seqs = (128, 2048)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           str(Path(__file__).parent / "cp_count_worker.py"), str(out), *map(str, seqs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=220, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counted = json.loads(out.read_text())
    for seq in seqs:
        lay = layout_of(tiny_plan(2, seq=seq, batch=2, c=2))
        f, b, _ = block_host(lay)
        assert counted[str(seq)] == [pytest.approx(f.ops, rel=0.05), pytest.approx(b.ops, rel=0.05)], seq


@pytest.mark.parametrize("schedule, v, split", [("1F1B", 1, False), ("Interleaved1F1B", 2, False),
                                                ("InterleavedZeroBubble", 2, True)])
def test_every_pipeline_action_carries_its_runtimes_host_time(schedule, v, split):
    from meshplan.cost_models.estimate import estimate_plan, group_spans, stage_durations
    from meshplan.cost_models.layout import runtime_paths

    plan = tiny_plan(2, pp=2, schedule=schedule, v=v)
    single, multi = 3e-4, 7e-4
    base, priced_ = _with_host(), _with_host(pipeline_action_s=single, pipeline_multi_action_s=multi)
    act = single if v == 1 else multi
    lay = runtime_paths(layout_of(plan), base)
    spans = group_spans(lay, base, ("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    d0, d1 = stage_durations(lay, base, spans), stage_durations(lay, priced_, spans)
    assert [b - a for a, b in zip(d0.forward, d1.forward)] == pytest.approx([act] * 2 * v)
    assert [b - a for a, b in zip(d0.backward, d1.backward)] == pytest.approx([act] * 2 * v)
    assert [b - a for a, b in zip(d0.weight, d1.weight)] == pytest.approx([act if split else 0.0] * 2 * v)
    # 8 micro-batches, v stages a rank, 2 or 3 actions each: what the breakdown reports as overhead.
    est = estimate_plan(plan, priced_)
    assert est.time_s["overhead"] == pytest.approx(8 * v * (3 if split else 2) * act)
    assert estimate_plan(plan, base).time_s["overhead"] == 0.0


@pytest.mark.parametrize("parallel", [{"dp_shard": 2}, {"dp_shard": 2, "ep": 2}, {"dp_shard": 4, "ep": 2}],
                         ids=["fsdp2", "ep2_fsdp2", "ep2_fsdp4"])
def test_moe_collective_calls_match_the_runtime(parallel):
    """A step's collective calls on rank 0 of tiny-moe (one dense and three MoE blocks), counted over the
    runtime on PyTorch's fake process group, against the model: the EP all-to-alls (3 forward, 2 backward per
    MoE block and micro-batch) and the experts' FSDP unit, which communicates only where ep_fsdp > 1."""
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    from meshplan.runtime.options import RunOptions
    from meshplan.runtime.train import Trainer

    class Calls(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if name.startswith("c10d.") or (name.startswith("_c10d_functional.") and "wait" not in name):
                Calls.n += 1
            return func(*args, **(kwargs or {}))

    gpus = parallel["dp_shard"]
    raw = {"model": "tiny-moe", "cluster": "cpu-gloo", "gpus": gpus,
           "training": {"seq_len": 64, "global_batch": 8, "micro_batch": 2, "dtype": "fp32"},
           "parallel": {"dp_replicate": 1, "tp": 1, "cp": 1, "pp": 1, "sequence_parallel": False, "async_tp": False,
                        "pp_schedule": "1F1B", "pp_virtual_stages": 1, "pp_layers": None, **parallel},
           "memory": {"activation_checkpointing": "none", "sac_ops": None, "float8": False, "reshard_after_forward": True},
           "compile": False}
    plan = plan_from_dict(raw)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=gpus)
    try:
        trainer = Trainer(plan, RunOptions(steps=2, quiet=True), torch.device("cpu"))
        trainer.step(0)
        Calls.n = 0
        with Calls():
            trainer.step(1)
    finally:
        dist.destroy_process_group()
    lay = layout_of(plan)
    per_micro = embedding_host(lay) + sum((sum(block_host(lay, layer), start=HostOps()) for layer in range(4)),
                                          start=HostOps())
    hf, hb = head_host(lay)
    # The step's routing statistics: one all-reduce over the stage's ranks (moe.finish_step).
    modelled = (per_micro + hf + hb).calls * lay.n_micro + step_host(lay, 0).calls + 1
    assert modelled == pytest.approx(Calls.n, rel=0.05), (modelled, Calls.n)
