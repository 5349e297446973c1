"""Everything the planner emits runs: each combination of schedule x AC (none, full, selective with
two op sets) x float8 (emulated) x compile x TP x CP x micro-batch on 2 and 4 gloo ranks either
trains two steps or is refused by the plan rules, and the rules refuse exactly what PyTorch cannot run.

The cross product (knob_matrix.py) is too big to run; a deterministic all-pairs cover of it is run,
every runnable plan of a world size one after another in one torchrun world (layouts_worker.py), the
two worlds concurrently. torch.compile on CPU builds C++ per compiled block (~20 s a plan here), so
compile = true joins the cover only with MESHPLAN_TEST_COMPILE_MATRIX=1 (20-30 s of inductor build per plan).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from knob_matrix import AC_CHOICES, KNOBS, all_cases, covering_subset, knobs_of, pairs
from worlds import collect, start_world
from meshplan.runtime.activation_checkpoint import apply_ac
from meshplan.runtime.initialisation import init_weights
from meshplan.runtime.model import build_model
from meshplan.runtime.options import RunOptions
from meshplan.runtime.reference import reference_run
from meshplan.specs.plan import plan_from_dict
from meshplan.specs.registry import resolve_model
from meshplan.specs.rules import SPLIT_BACKWARD_SCHEDULES, ac_schedule_reason

HERE = Path(__file__).parent
STEPS = 2
WORLD_TIMEOUT_S = 180  # the 4-rank world takes 31-45 s here
COMPILE = (False, True) if os.environ.get("MESHPLAN_TEST_COMPILE_MATRIX") == "1" else (False,)
CASES = all_cases(COMPILE)
COVER = covering_subset(CASES)
BY_NAME = {c.name: c for c in COVER}


def _rule_refuses(case) -> bool:
    k = knobs_of(case.combo)
    return ac_schedule_reason(1 if k["schedule"] == "none" else 2, k["schedule"], AC_CHOICES[k["ac"]][0]) is not None


# ---- the space and its cover (no processes) ------------------------------------------------------
def test_cover_covers_every_pair_of_the_space():
    """Brute force: every pair of knob values found in a runnable plan is in a chosen runnable plan;
    every other pair found in the space is in a chosen refused plan; nothing is chosen twice."""
    runnable = [c for c in CASES if c.refused is None]
    chosen_run = set().union(*(pairs(c.combo) for c in COVER if c.refused is None))
    chosen_all = set().union(*(pairs(c.combo) for c in COVER))
    for c in runnable:
        assert pairs(c.combo) <= chosen_run, c.name
    for c in CASES:
        assert pairs(c.combo) <= chosen_all, c.name
    assert len({c.name for c in COVER}) == len(COVER)
    assert len(COVER) < len(CASES) / 10  # the point of the cover
    for i, name in enumerate(KNOBS):  # every value of every knob is run
        if name != "compile":
            assert {c.combo[i] for c in COVER if c.refused is None} == set(KNOBS[name]), name


def test_refusals_are_exactly_the_rules():
    """Over the whole cross product: a plan is refused by the split-backward SAC rule iff it has
    selective AC with a split-backward schedule; every other refusal is the pipeline micro-batch
    count (PyTorch's schedules need one micro-batch per stage), nothing else."""
    for c in CASES:
        if _rule_refuses(c):
            assert c.refused and c.refused.startswith("memory.activation_checkpointing:"), c.name
        elif c.refused:
            k = knobs_of(c.combo)
            assert c.refused.startswith("training.global_batch:") and k["schedule"] not in ("none", "GPipe", "1F1B"), \
                (c.name, c.refused)


@pytest.mark.parametrize("ac", list(AC_CHOICES))
def test_split_backward_fails_exactly_where_the_rule_refuses(ac):
    """What the zero-bubble schedules run per micro-batch (torch.distributed.pipelining's I then W
    actions), on two of the runtime's checkpointed blocks: PyTorch raises for selective AC, the rule's
    set; a one-pass backward runs for every AC mode. The gradients of both equal the unwrapped ones."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    spec = resolve_model("tiny-4l", "model")
    mode, ops = AC_CHOICES[ac]

    def blocks():
        model = build_model(spec, "cpu")
        init_weights(model, spec, 0)
        apply_ac(model, mode, ops)
        return [model.layers["0"], model.layers["1"]]

    x0 = torch.randn(2, 32, spec.dim, generator=torch.Generator().manual_seed(0))

    def forward(mods):
        x = x0.clone().requires_grad_(True)
        y = x
        for m in mods:
            y = m(y)
        return x, y, [p for m in mods for p in m.parameters()]

    x, y, params = forward(blocks())
    torch.autograd.backward(y, torch.ones_like(y))
    one_pass = [p.grad.clone() for p in params]

    x, y, params = forward(blocks())
    refused = ac_schedule_reason(2, SPLIT_BACKWARD_SCHEDULES[0], mode) is not None
    _, groups = stage_backward_input([y], [torch.ones_like(y)], [x], iter(params))
    if refused:
        with pytest.raises(RuntimeError, match="backward an extra time"):
            stage_backward_weight(iter(params), groups)
        return
    stage_backward_weight(iter(params), groups)
    for got, want in zip([p.grad for p in params], one_pass):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


# ---- the cover, run ------------------------------------------------------------------------------
def _start_world(nproc: int, cases: list, tmp: Path, data: str):
    return start_world(nproc, [{"name": c.name, "plan": c.plan, "steps": STEPS, "data": data} for c in cases], tmp,
                       "matrix")


@pytest.fixture(scope="module")
def one_batch(tmp_path_factory) -> str:
    """A token file holding exactly one global batch (8 rows of 32, overlapping as in a text): every
    step reads the same batch (data.py's offset wraps at len - seq_len - 1 = 8 x 32), so step 2's loss
    below step 1's is the optimizer step going downhill, not an easier batch."""
    import numpy as np

    t = COVER[0].plan["training"]
    assert all(c.plan["training"]["seq_len"] == t["seq_len"] and c.plan["training"]["global_batch"] == t["global_batch"]
               for c in COVER)
    n = t["global_batch"] * t["seq_len"] + t["seq_len"] + 1
    path = tmp_path_factory.mktemp("data") / "one_batch.bin"
    (np.arange(n) * 3 % 256).astype(np.uint16).tofile(path)  # tiny-4l's vocab is 256
    return str(path)


@pytest.fixture(scope="module")
def results(tmp_path_factory, one_batch) -> dict:
    tmp = tmp_path_factory.mktemp("matrix")
    runnable = [c for c in COVER if c.refused is None]
    worlds = [_start_world(n, [c for c in runnable if knobs_of(c.combo)["world"] == n], tmp, one_batch)
              for n in KNOBS["world"]]
    out = collect(worlds, WORLD_TIMEOUT_S, tmp, partial_on_timeout=True)
    missing = [c for c in runnable if c.name not in out or _lost_peer(out[c.name])]
    if missing:
        # Seen in about one full run of fifteen, always in the 4-rank world at DualPipeV x TP 2 x full
        # AC: one rank spins (a hang), or one closes its gloo connection and the others fail with
        # "Connection closed by peer" while the world goes on to its next case (CI at 1c2e19b); the
        # same plan alone trained 40 of 40 times under load. The cases a hang or a lost peer
        # left unrun get one fresh world each; a second failure fails the test. Any other error fails.
        for n in KNOBS["world"]:
            log = tmp / f"matrix{n}.log"
            if log.exists():
                print(f"--- matrix{n}.log, last lines ---\n" + "\n".join(log.read_text().splitlines()[-60:]))
        print(f"knob matrix: a world hung or lost a rank; rerunning {[c.name for c in missing]} in fresh worlds")
        retry = tmp / "retry"
        retry.mkdir()
        again = [_start_world(n, [c for c in missing if knobs_of(c.combo)["world"] == n], retry, one_batch)
                 for n in KNOBS["world"] if any(knobs_of(c.combo)["world"] == n for c in missing)]
        out.update(collect(again, WORLD_TIMEOUT_S, retry))
    return out


def _lost_peer(result: dict) -> bool:
    """A case that failed because another rank closed its connection, not by an error of its own."""
    return any(s in result.get("error", "") for s in ("Connection closed by peer", "Connection reset by peer"))


@pytest.fixture(scope="module")
def first_loss(one_batch) -> float:
    """Step 1's loss in one process, no wrappers: every layout's first loss must equal it (fp32 and
    float8 alike within 1e-3; float8's rounding moves it by ~1e-5 relative)."""
    plan = plan_from_dict(COVER[0].plan | {"gpus": 1, "parallel": {}, "memory": {}})
    return reference_run(plan, RunOptions(steps=1, seed=0, data=one_batch), float8=False)[0].loss


@pytest.mark.distributed
@pytest.mark.parametrize("name", [c.name for c in COVER])
def test_combination_trains_or_is_refused(name, results, first_loss):
    case = BY_NAME[name]
    if case.refused is not None:
        assert _rule_refuses(case), case.refused  # shown to fail in PyTorch above
        return
    got = results.get(name)
    assert got is not None, f"{name} did not run"
    assert "error" not in got, got.get("error")
    losses = got["losses"]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), losses
    assert abs(losses[0] - first_loss) <= 1e-3 * first_loss, (losses, first_loss)
    assert losses[1] < losses[0], losses  # the optimizer step moved the weights downhill (on the same batch)


def test_planner_writes_no_float8_plan_for_gloo():
    """Why the matrix leaves out float8 with TP (knob_matrix.plan_of): the planner never writes float8
    for the CPU profile, whatever the layout."""
    from meshplan.planner.search import search
    from meshplan.profiles.registry import load_profile

    plan = plan_from_dict({"model": "tiny-4l", "cluster": "cpu-gloo", "gpus": 4,
                           "training": {"seq_len": 128, "global_batch": 8}})
    res = search(plan, load_profile("cpu-gloo"), top_k=50)
    assert res.ranked and not any(c.layout.float8 for c in res.ranked)
    assert not load_profile("cpu-gloo").supports_float8()  # what the space's float8 options follow
