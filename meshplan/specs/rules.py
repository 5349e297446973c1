"""Combinations of plan knobs that PyTorch cannot run, each one rule in one place.

The planner prunes them (the reason string is what its rejection summary counts), a plan that
names one is refused in one line (loading a plan: `estimate`, `plan --fix`, `tune`) and `run`
checks them again before it launches anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.errors import InputError
from meshplan.fields import AUTO

if TYPE_CHECKING:
    from meshplan.specs.plan import Plan

# Schedules whose backward is two passes (torch.distributed.pipelining's I and W actions): input
# gradients first, with the graph retained, weight gradients later.
SPLIT_BACKWARD_SCHEDULES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")

SAC_SPLIT_BACKWARD = "selective AC with a split-backward (zero-bubble) schedule"


def ac_schedule_reason(pp: int, schedule: str, ac: str) -> str | None:
    """Selective AC under a split-backward schedule: the input-gradient and the weight-gradient pass
    are separate autograd calls, so a checkpointed block is recomputed once for each; PyTorch's
    selective-checkpoint cache hands out each saved tensor once ("Trying to backward an extra time").
    Full AC recomputes the whole block each time and runs. TorchTitan runs its zero-bubble
    schedules with full AC for the same reason."""
    if pp > 1 and ac == "selective" and schedule in SPLIT_BACKWARD_SCHEDULES:
        return SAC_SPLIT_BACKWARD
    return None


def check_runtime_rules(plan: Plan) -> None:
    """One-line error for a rule the plan breaks; fields still 'auto' are left to the planner."""
    p, mem = plan.parallel, plan.memory
    if AUTO in (p.pp, p.pp_schedule, mem.activation_checkpointing):
        return
    if ac_schedule_reason(p.pp, p.pp_schedule, mem.activation_checkpointing):
        raise InputError("memory.activation_checkpointing",
                         f"selective does not run with pp_schedule {p.pp_schedule}, which splits backward into "
                         "input- and weight-gradient passes that each recompute a checkpointed block (PyTorch's "
                         "selective-checkpoint cache serves a saved tensor once); use full or none, or a schedule "
                         f"other than {', '.join(SPLIT_BACKWARD_SCHEDULES)}")
