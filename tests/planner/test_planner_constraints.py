"""Every plan the search returns obeys the hard rules and fits; plans round-trip through the plan
file and `meshplan estimate`; and the search accounts for every leaf of the space it declares."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from planner_brute import divisors, make_plan, tight_profile  # noqa: E402

from meshplan import cli  # noqa: E402
from meshplan.cost_models.estimate import estimate_layout, estimate_plan  # noqa: E402
from meshplan.cost_models.layout import even_split  # noqa: E402
from meshplan.cost_models.memory import GIB, rank_memory  # noqa: E402
from meshplan.planner.constraints import NO_FIT  # noqa: E402
from meshplan.planner.placement import candidate_orders  # noqa: E402
from meshplan.planner.search import search  # noqa: E402
from meshplan.profiles.registry import load_profile  # noqa: E402
from meshplan.specs.plan import PP_SCHEDULES, SAC_OPS, load_plan, plan_from_dict  # noqa: E402
from meshplan.specs.rules import microbatch_reason, profile_backend  # noqa: E402

# (model, gpus, seq_len, global_batch, cluster, fixes, usable-memory override)
SEARCHES = {
    "tiny-4l-8-auto": ("tiny-4l", 8, 256, 16, "h100-80g-dgx", (), None),
    "tiny-4l-8-tight": ("tiny-4l", 8, 256, 16, "h100-80g-dgx", ("compile=true",), 1.0016),
    "small-16-tp2": ("small", 16, 256, 32, "h100-80g-dgx", ("parallel.tp=2",), None),
    "small-8-pp2-tight": ("small", 8, 512, 16, "h100-80g-dgx", ("parallel.pp=2",), 1.06),
    "tiny-gpt-4-cpu": ("tiny-gpt", 4, 128, 8, "cpu-gloo", (), None),
    "tiny-2-fixed-ac": ("tiny", 2, 256, 4, "cpu-gloo", ("memory.activation_checkpointing=selective",), None),
}

_RESULTS: dict = {}


def run(name):
    if name not in _RESULTS:
        model, gpus, seq, gb, cluster, fix, usable = SEARCHES[name]
        prof = tight_profile(cluster, usable, shared=False) if usable else load_profile(cluster)
        plan = make_plan(model, gpus, seq, gb, cluster, fix)
        _RESULTS[name] = (plan, prof, search(plan, prof, top_k=10))
    return _RESULTS[name]


def hard_rule_violations(lay, plan, prof) -> list[str]:
    """Every hard rule of the plan contract, checked from first principles on a complete layout."""
    spec, bad = lay.spec, []
    if lay.dp_replicate * lay.dp_shard * lay.cp * lay.tp * lay.pp != plan.gpus:
        bad.append("degrees product != gpus")
    if spec.n_heads % lay.tp or spec.n_kv_heads % lay.tp or spec.ffn_dim % lay.tp:
        bad.append("tp does not divide heads/kv heads/ffn")
    if lay.tp > prof.devices_per_node:
        bad.append("tp crosses nodes")
    if lay.cp > 1 and lay.seq_len % (2 * lay.cp):
        bad.append("2*cp does not divide seq_len")
    if lay.sp and lay.tp > 1 and (lay.seq_len // lay.cp) % lay.tp:
        bad.append("SP: tp does not divide seq_len/cp")
    if lay.sp and lay.tp == 1:
        bad.append("SP without TP")
    if lay.async_tp and lay.tp == 1:
        bad.append("async TP without TP")
    if lay.global_batch % (lay.micro_batch * lay.dp):
        bad.append("global_batch % (micro_batch*dp) != 0")
    if lay.global_batch // (lay.micro_batch * lay.dp) < 1:
        bad.append("no micro-batch per rank")
    if lay.pp == 1:
        if lay.v != 1 or lay.stage_layers != (spec.n_layers,):
            bad.append("virtual stages / split without PP")
    else:
        if lay.schedule not in PP_SCHEDULES:
            bad.append("unknown schedule")
        if lay.schedule in ("GPipe", "1F1B") and lay.v != 1:
            bad.append("single-stage schedule with v != 1")
        if lay.schedule in ("ZBVZeroBubble", "DualPipeV") and lay.v != 2:
            bad.append("V-shaped schedule with v != 2")
        if not 1 <= lay.v <= 4:
            bad.append("v out of range")
        if len(lay.stage_layers) != lay.pp * lay.v or sum(lay.stage_layers) != spec.n_layers:
            bad.append("stage split does not match pp*v / n_layers")
        if min(lay.stage_layers) < 1:
            bad.append("empty stage")
        if microbatch_reason(lay.schedule, lay.pp, lay.v, lay.n_micro):
            bad.append("micro-batch count not accepted by the schedule")
        if lay.reshard_after_forward:
            bad.append("reshard after forward with PP")
        # PyTorch's SAC cache serves a saved tensor once; these schedules recompute twice (I and W).
        if lay.ac == "selective" and lay.schedule in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"):
            bad.append("selective AC with a split-backward schedule")
    if lay.ac != "selective" and lay.sac_ops is not None:
        bad.append("sac_ops without selective AC")
    if isinstance(lay.sac_ops, tuple) and not set(lay.sac_ops) <= set(SAC_OPS):
        bad.append("unknown SAC op kind")
    if lay.float8 and not prof.supports_float8():
        bad.append("float8 on a device without fp8")
    if lay.micro_batch not in divisors(lay.global_batch):
        bad.append("micro_batch does not divide global_batch")
    return bad


def fixed_field_violations(lay, plan) -> list[str]:
    """Fields the plan fixes must come back unchanged."""
    bad = []
    p, m = plan.parallel, plan.memory
    for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp"):
        if getattr(p, k) != "auto" and getattr(lay, k) != getattr(p, k):
            bad.append(k)
    if m.activation_checkpointing != "auto" and lay.ac != m.activation_checkpointing:
        bad.append("activation_checkpointing")
    if plan.compile != "auto" and lay.compile != plan.compile:
        bad.append("compile")
    if lay.seq_len != plan.training.seq_len:
        bad.append("seq_len")
    if plan.training.global_batch != "auto" and lay.global_batch != plan.training.global_batch:
        bad.append("global_batch")
    return bad


@pytest.mark.parametrize("name", list(SEARCHES))
def test_returned_plans_obey_hard_rules_and_fit(name):
    plan, prof, res = run(name)
    assert res.ranked, "the search found nothing"
    usable = prof.device.usable_memory_gib
    for c in res.ranked:
        lay = c.layout
        assert not hard_rule_violations(lay, plan, prof), (hard_rule_violations(lay, plan, prof), lay)
        assert not fixed_field_violations(lay, plan), (fixed_field_violations(lay, plan), lay)
        assert tuple(c.order) in candidate_orders()
        est = estimate_layout(lay, prof, c.order)  # the full estimate, independently of the search's parts
        assert est.fits and est.peak_memory_gib <= usable, (est.peak_memory_gib, usable, lay)
        assert est.step_time_s == pytest.approx(c.estimate.step_time_s, rel=1e-12)
        # the search's own figures are the estimate's, not an approximation of it
        assert c.step_time_s == pytest.approx(est.step_time_s, rel=1e-9)
        assert c.peak_memory_gib == pytest.approx(est.peak_memory_gib, rel=1e-9)
    steps = [c.estimate.step_time_s for c in res.ranked]
    assert steps == sorted(steps)
    for c in res.scored:  # every exactly scored leaf, fitting or not: still a legal plan
        assert not hard_rule_violations(c.layout, plan, prof), (hard_rule_violations(c.layout, plan, prof), c.layout)
        assert not fixed_field_violations(c.layout, plan)
        assert (c.peak_memory_gib <= usable) == estimate_layout(c.layout, prof, c.order).fits
    # nothing that fits and was scored beats the winner
    fitting = [c.step_time_s for c in res.scored if c.peak_memory_gib <= usable]
    assert min(fitting) == pytest.approx(res.best.estimate.step_time_s, rel=1e-9)


def test_pp_plans_respect_in_flight_memory():
    """For a pipelined winner the peak is taken over every rank with its schedule's activations in flight."""
    plan, prof, res = run("small-8-pp2-tight")
    c = res.best
    assert c.layout.pp == 2
    est = c.estimate
    assert len(est.per_rank_memory_gib) == 2
    assert est.peak_memory_gib == pytest.approx(max(r["total"] for r in est.per_rank_memory_gib))
    # each rank's memory is charged with the activations its simulated schedule holds at its peak
    for r, flight in enumerate(est.pipeline["in_flight"]):
        assert flight >= 1.0
        want = rank_memory(c.layout, r, flight, prof.overheads).total / GIB
        assert est.per_rank_memory_gib[r]["total"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("name", list(SEARCHES))
def test_plans_round_trip_through_plan_dict(name):
    plan, prof, res = run(name)
    for c in res.ranked:
        p = c.to_plan(res.base_plan)
        assert p.is_complete(), p.auto_fields()
        again = plan_from_dict(p.to_dict())
        assert again.to_dict() == p.to_dict()
        est = estimate_plan(again, prof)
        assert est.step_time_s == pytest.approx(c.estimate.step_time_s, rel=1e-9)
        assert est.peak_memory_gib == pytest.approx(c.estimate.peak_memory_gib, rel=1e-9)


@pytest.mark.parametrize("args", [
    ["--model", "tiny-4l", "--gpus", "8", "--seq-len", "256", "--global-batch", "16"],
    ["--model", "small", "--gpus", "8", "--seq-len", "512", "--global-batch", "16", "--fix", "parallel.pp=2",
     "--fix", "compile=true"],
    ["--model", "tiny-gpt", "--gpus", "4", "--seq-len", "128", "--global-batch", "8", "--cluster", "cpu-gloo"],
])
def test_estimate_of_written_plan_matches_search(tmp_path, capsys, args):
    out = tmp_path / "best.yaml"
    assert cli.main(["plan", *args, "--out", str(out), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert out.is_file() and (tmp_path / "best.candidates.csv").is_file()
    assert cli.main(["estimate", "--plan", str(out), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["step_time_s"] == pytest.approx(planned["best"]["step_time_s"], rel=1e-9)
    assert est["peak_memory_gib"] == pytest.approx(planned["best"]["peak_memory_gib"], rel=1e-9)
    assert est["fits"] is True
    assert est["plan"]["parallel"] == planned["best"]["plan"]["parallel"]
    # the file is complete: no auto left for estimate to fill
    assert load_plan(out).is_complete()
    counts = planned["search"]["counts"]
    assert counts["accounted"] == counts["space"]


# ---------------------------------------------------------------------------------------------
# Counting: every leaf of the declared space ends in exactly one bucket
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(SEARCHES))
def test_every_leaf_accounted(name):
    _, _, res = run(name)
    n = res.counts()
    assert n["accounted"] == n["space"], n
    assert all(v >= 0 for k, v in n.items() if isinstance(v, int)), n
    assert n["scored_exactly"] >= len(res.ranked)
    # A simulation either scores a leaf or stops once a rank holds more than fits (a no-fit rejection).
    assert n["simulated"] - n["simulations_stopped"] <= len(res.scored)
    assert n["simulations_stopped"] <= n["rejected_by_reason"].get(NO_FIT, 0)
    assert n["rejected"] == sum(n["rejected_by_reason"].values())


def declared_space_size(plan, prof, global_batch: int, ac: int) -> int:
    """The space size from the space's documentation, written independently of search.py: leaves per
    (mesh degrees, distinct mesh order, micro-batch) are products of each knob's option count.
    Only for plans whose every field is auto (so each knob has its full option list)."""
    from meshplan.cost_models.estimate import group_spans
    from meshplan.cost_models.layout import Layout

    from planner_brute import factorisations

    spec, seq = plan.model, plan.training.seq_len
    f8 = 2 if prof.supports_float8() else 1
    total = 0
    for dr, ds, cp, tp, pp in factorisations(plan.gpus, 5):
        probe = Layout(spec=spec, gpus=plan.gpus, seq_len=seq, global_batch=global_batch, micro_batch=1,
                       dtype="bf16", dp_replicate=dr, dp_shard=ds, tp=tp, sp=False, async_tp=False, pp=pp,
                       schedule="1F1B", v=1, stage_layers=even_split(spec.n_layers, pp), cp=cp, ac="none",
                       sac_ops=None, float8=False, reshard_after_forward=True, compile=False)
        orders = {tuple(sorted(group_spans(probe, prof, o).items())) for o in candidate_orders()}
        sp = 2 if tp > 1 else 1
        # Async TP is declared only where the runtime runs it: NCCL clusters (specs/rules.py).
        async_tp = 2 if tp > 1 and profile_backend(prof.provenance) == "nccl" else 1
        reshard = 2 if (ds > 1 and pp == 1) else 1
        compile_ = 2
        sched = 1 if pp == 1 else 2 * (1 + 1 + 4 + 4 + 4 + 1 + 1)  # (schedule, v) pairs x {even, balanced}
        mbs = len(divisors(global_batch))
        total += len(orders) * mbs * sp * async_tp * ac * f8 * reshard * compile_ * sched
    return total


@pytest.mark.parametrize("name", ["tiny-4l-8-auto", "tiny-gpt-4-cpu"])
def test_space_size_matches_declared_space(name):
    """`meshplan plan` leaves sac_ops auto: AC is none | selective (SAC ILP) | full."""
    plan, prof, res = run(name)
    assert plan.memory.sac_ops == "auto"
    assert res.space_size == declared_space_size(plan, prof, plan.training.global_batch, ac=3)


def test_space_size_with_torchtitan_policy_option():
    """A plan file with activation_checkpointing auto and sac_ops null searches
    none | selective (TorchTitan op policy) | selective (SAC ILP) | full, as space.py documents."""
    d = {"model": "tiny-gpt", "cluster": "cpu-gloo", "gpus": 4, "training": {"seq_len": 128, "global_batch": 8},
         "parallel": {}, "memory": {"sac_ops": None}, "compile": "auto"}
    plan = plan_from_dict(d)
    prof = load_profile("cpu-gloo")
    res = search(plan, prof, top_k=3)
    assert res.space_size == declared_space_size(plan, prof, 8, ac=4)
    n = res.counts()
    assert n["accounted"] == n["space"]
