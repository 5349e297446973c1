"""The runtime rules of specs/rules.py: the planner prunes what breaks them (counted under their
reason), a plan naming such a combination is refused in one line, and `run`'s pre-launch check
refuses a Plan built in code."""

from __future__ import annotations

import copy
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from planner_brute import make_plan  # noqa: E402

from meshplan import cli  # noqa: E402
from meshplan.errors import InputError  # noqa: E402
from meshplan.planner.constraints import REASONS  # noqa: E402
from meshplan.planner.search import search  # noqa: E402
from meshplan.profiles.registry import load_profile  # noqa: E402
from meshplan.runtime.options import check_runnable  # noqa: E402
from meshplan.specs.plan import PP_SCHEDULES, plan_from_dict  # noqa: E402
from meshplan.specs.rules import COMPILE_UNTRACEABLE, SAC_SPLIT_BACKWARD, ac_schedule_reason  # noqa: E402

# What ran on 2 gloo ranks (tiny-4l, pp 2, torch 2.13): every schedule with AC none and full; with
# selective AC, the three schedules that run input and weight gradients as separate passes failed
# with "Trying to backward an extra time" (tests/runtime/test_knob_matrix.py keeps this true).
SPLIT_BACKWARD = {"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}


@pytest.mark.parametrize("schedule", PP_SCHEDULES)
@pytest.mark.parametrize("ac", ["none", "full", "selective"])
def test_rule_table(schedule, ac):
    refused = ac == "selective" and schedule in SPLIT_BACKWARD
    assert (ac_schedule_reason(2, schedule, ac) is not None) == refused
    assert ac_schedule_reason(1, schedule, ac) is None  # no pipeline: the schedule never runs


def _search(schedule: str, ac: str):
    plan = make_plan("tiny-4l", 2, 128, 8, "cpu-gloo",
                     (f"parallel.pp_schedule={schedule}", f"memory.activation_checkpointing={ac}"))
    return search(plan, load_profile("cpu-gloo"), top_k=50)


@pytest.mark.parametrize("schedule", sorted(SPLIT_BACKWARD))
def test_search_prunes_selective_ac_with_split_backward(schedule):
    """pp is left auto: the pp=2 leaves are rejected under the rule's reason and every leaf is still
    accounted for; with full AC the same schedule is found, so the rule is what removed them."""
    res = _search(schedule, "selective")
    n = res.counts()
    assert SAC_SPLIT_BACKWARD in REASONS
    assert n["rejected_by_reason"].get(SAC_SPLIT_BACKWARD, 0) > 0
    assert n["accounted"] == n["space"], n
    assert res.ranked and all(c.layout.pp == 1 for c in res.ranked)
    full = _search(schedule, "full")
    assert full.counts()["rejected_by_reason"].get(SAC_SPLIT_BACKWARD, 0) == 0
    assert any(c.layout.pp == 2 and c.layout.schedule == schedule for c in full.ranked)


def test_default_search_writes_no_refused_plan():
    """The issue's command: the best plan and every ranked one obey the rule."""
    plan = make_plan("tiny-4l", 2, 128, 8, "cpu-gloo")
    res = search(plan, load_profile("cpu-gloo"), top_k=50)
    assert res.ranked
    for c in res.ranked:
        assert ac_schedule_reason(c.layout.pp, c.layout.schedule, c.layout.ac) is None
    assert res.counts()["rejected_by_reason"].get(SAC_SPLIT_BACKWARD, 0) > 0


def _plan_dict(schedule: str, ac: str) -> dict:
    return {"model": "tiny-4l", "cluster": "cpu-gloo", "gpus": 2,
            "training": {"seq_len": 128, "global_batch": 8, "micro_batch": 1, "dtype": "fp32"},
            "parallel": {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "sequence_parallel": False, "async_tp": False,
                         "pp": 2, "pp_schedule": schedule, "pp_virtual_stages": 2, "cp": 1},
            "memory": {"activation_checkpointing": ac, "float8": False, "reshard_after_forward": False},
            "compile": False}


def test_plan_file_refused_in_one_line(tmp_path, capsys):
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_plan_dict("ZBVZeroBubble", "selective")))
    for command in (["estimate", "--plan", str(path)], ["run", "--plan", str(path), "--steps", "1"]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "memory.activation_checkpointing" in err and "ZBVZeroBubble" in err


def test_run_precheck_refuses_plan_built_in_code():
    ok = plan_from_dict(_plan_dict("ZBVZeroBubble", "full"))
    check_runnable(ok)
    bad = replace(ok, memory=replace(ok.memory, activation_checkpointing="selective"))
    with pytest.raises(InputError, match="memory.activation_checkpointing"):
        check_runnable(bad)


# Compiled TP blocks with AC none: their backward failed in DTensor on 2 gloo ranks (torch 2.13,
# tiny-4l, tp 2); under full or selective AC, or without compile, they trained.
TP2_NO_AC = ("parallel.tp=2", "memory.activation_checkpointing=none")


def _nccl_twin(prof):
    """The same profile as if measured on NCCL, where the rule does not apply."""
    twin = copy.deepcopy(prof)
    twin.__dict__.pop("_cost_cache", None)
    twin.provenance = {**(twin.provenance or {}), "world": {**twin.provenance["world"], "backend": "nccl"}}
    return twin


def test_search_prunes_compiled_tp_without_ac_on_gloo():
    """tiny-4l on 2 ranks, tp 2 and AC none fixed: the leaves are 4 micro-batches (divisors of 8) x SP
    on/off x compile on/off = 16; the 8 compiled ones are rejected under the rule's reason, the rest
    scored, and no ranked plan compiles. On the NCCL twin of the profile compile wins: the rule removed it."""
    gloo = load_profile("cpu-gloo")
    res = search(make_plan("tiny-4l", 2, 128, 8, "cpu-gloo", TP2_NO_AC), gloo, top_k=50, jobs=1)
    n = res.counts()
    assert COMPILE_UNTRACEABLE in REASONS
    assert (n["space"], n["rejected_by_reason"], n["accounted"]) == (16, {COMPILE_UNTRACEABLE: 8}, 16)
    assert res.ranked and not any(c.layout.compile for c in res.ranked)
    pinned = search(make_plan("tiny-4l", 2, 128, 8, "cpu-gloo", TP2_NO_AC + ("compile=true",)), gloo, jobs=1)
    assert pinned.best is None and pinned.counts()["rejected_by_reason"] == {COMPILE_UNTRACEABLE: 8}
    twin = search(make_plan("tiny-4l", 2, 128, 8, "cpu-gloo", TP2_NO_AC), _nccl_twin(gloo), top_k=50, jobs=1)
    assert twin.best is not None and twin.best.layout.compile
    assert COMPILE_UNTRACEABLE not in twin.counts()["rejected_by_reason"]


@pytest.mark.parametrize("ac, degrees, compile_, code", [
    ("none", {"tp": 2}, True, 2), ("full", {"tp": 2}, True, 2), ("selective", {"tp": 2}, True, 2),
    ("full", {"cp": 2}, True, 2), ("full", {"tp": 2}, False, 0), ("full", {"dp_shard": 2}, True, 0)])
def test_estimate_refuses_compiled_tp_and_cp_on_gloo(tmp_path, capsys, ac, degrees, compile_, code):
    """Compiled TP blocks fail on gloo under every AC mode, and CP's gather attention does not trace
    (tests/runtime/test_compile.py measures both); the same layouts uncompiled, and compiled
    blocks without TP or CP, are estimated."""
    import yaml

    d = _plan_dict("1F1B", ac)
    d["parallel"].update(pp=1, pp_virtual_stages=1, **degrees)
    d["compile"] = compile_
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(d))
    assert cli.main(["estimate", "--plan", str(path)]) == code
    err = capsys.readouterr().err.strip()
    if code:
        why = "DTensor's backward" if "tp" in degrees else "does not trace"
        assert len(err.splitlines()) == 1 and "error: compile: true cannot run on gloo" in err and why in err, err
    else:
        assert err == ""
