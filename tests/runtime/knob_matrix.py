"""The knobs the planner emits, their cross product as plans, and a deterministic covering subset.

Every combination either trains or is refused by the plan rules (plan_from_dict's checks, which
include specs/rules.py, and run's pre-launch check). test_knob_matrix.py runs the subset.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from cases import plan as base_case
from meshplan.errors import InputError
from meshplan.runtime.options import check_runnable
from meshplan.specs.plan import PP_SCHEDULES, SINGLE_STAGE_SCHEDULES, plan_from_dict

# "none": no pipeline (pp = 1). AC: selective with TorchTitan-like defaults and with a second op set.
AC_CHOICES: dict[str, tuple[str, list[str] | None]] = {
    "none": ("none", None), "full": ("full", None), "sac_default": ("selective", None),
    "sac_attn_ffn_out": ("selective", ["attention", "ffn_out"]),
}
KNOBS: dict[str, tuple] = {
    "world": (2, 4),
    "schedule": ("none",) + PP_SCHEDULES,
    "ac": tuple(AC_CHOICES),
    "float8": (False, True),
    "compile": (False, True),
    "tp": (1, 2),
    "cp": (1, 2),
    "micro_batch": (1, 2),
}

Combo = tuple  # one value per knob, in KNOBS order


@dataclass
class Case:
    name: str
    combo: Combo
    plan: dict[str, Any]
    refused: str | None  # the plan rule's one-line error, or None: it must train


def knobs_of(combo: Combo) -> dict[str, Any]:
    return dict(zip(KNOBS, combo))


def case_name(combo: Combo) -> str:
    k = knobs_of(combo)
    return (f"w{k['world']}_{k['schedule']}_{k['ac']}_f8{int(k['float8'])}_c{int(k['compile'])}"
            f"_tp{k['tp']}_cp{k['cp']}_mb{k['micro_batch']}")


def plan_of(combo: Combo) -> dict[str, Any] | None:
    """The plan mapping of a combination (tiny-4l, seq 32, global batch 8, fp32; the data-parallel
    degree fills the world as FSDP), or None when the degrees do not multiply to the world, or for
    float8 with TP: torchao's float8 TP all-gathers float8 bytes, a dtype gloo lacks ("Invalid scalar
    type"), and the planner emits float8 only for float8 devices (never for cpu-gloo), so on gloo
    that pair is not a plan the planner writes."""
    k = knobs_of(combo)
    if k["float8"] and k["tp"] > 1:
        return None
    pp = 1 if k["schedule"] == "none" else 2
    rest, left = divmod(k["world"], pp * k["tp"] * k["cp"])
    if left or rest < 1:
        return None
    ac, sac_ops = AC_CHOICES[k["ac"]]
    parallel: dict[str, Any] = {"pp": pp, "tp": k["tp"], "cp": k["cp"], "dp_shard": rest,
                                "sequence_parallel": k["tp"] > 1}
    if pp > 1:
        parallel["pp_schedule"] = k["schedule"]
        parallel["pp_virtual_stages"] = 1 if k["schedule"] in SINGLE_STAGE_SCHEDULES else 2
    out = base_case("tiny-4l", memory={"activation_checkpointing": ac, "sac_ops": sac_ops, "float8": k["float8"],
                                       "reshard_after_forward": pp == 1}, **parallel)
    out["training"]["micro_batch"] = k["micro_batch"]
    out["compile"] = k["compile"]
    return out


def refusal(plan: dict[str, Any]) -> str | None:
    """The one-line error the plan rules give, or None."""
    try:
        check_runnable(plan_from_dict(plan))
    except InputError as exc:
        return str(exc)
    return None


def all_cases(compile_values: tuple[bool, ...] = (False, True)) -> list[Case]:
    """The full cross product, less combinations whose degrees do not fill the world."""
    out = []
    values = [compile_values if name == "compile" else v for name, v in KNOBS.items()]
    for combo in itertools.product(*values):
        plan = plan_of(combo)
        if plan is not None:
            out.append(Case(case_name(combo), combo, plan, refusal(plan)))
    return out


def pairs(combo: Combo) -> set[tuple[int, Any, int, Any]]:
    return {(i, combo[i], j, combo[j]) for i, j in itertools.combinations(range(len(combo)), 2)}


def _cover(cases: list[Case], todo: set) -> list[Case]:
    """Greedy: repeatedly the case covering the most pairs still in `todo` (ties: the earliest)."""
    todo, chosen = set(todo), []
    while todo:
        best = max(cases, key=lambda c: len(pairs(c.combo) & todo))
        chosen.append(best)
        todo -= pairs(best.combo)
    return chosen


def covering_subset(cases: list[Case]) -> list[Case]:
    """Deterministic all-pairs cover: every pair of knob values that occurs in a runnable case is
    covered by a chosen runnable case (so it is shown to train); the pairs that occur only in refused
    cases are then covered by refused cases (so the refusal is shown)."""
    runnable = [c for c in cases if c.refused is None]
    refused = [c for c in cases if c.refused is not None]
    run_pairs = set().union(*(pairs(c.combo) for c in runnable))
    only_refused = set().union(*(pairs(c.combo) for c in refused)) - run_pairs
    return _cover(runnable, run_pairs) + _cover(refused, only_refused)
