"""Run options (the `meshplan run` flags other than the plan) and checks of a plan for running."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meshplan.errors import InputError
from meshplan.specs.plan import Plan
from meshplan.specs.rules import (backend_for_device, check_runtime_rules, float8_device_reason, microbatch_reason,
                                  stack_reason, tied_embeddings_reason, unsupported_fields)


@dataclass
class RunOptions:
    steps: int = 10
    data: str = "synthetic"          # "synthetic" or a path to a flat token file
    data_dtype: str = "auto"         # token file dtype: uint16 | uint32 | auto (by vocab size)
    out: str | None = None
    seed: int = 0
    resume: bool = False
    checkpoint_every: int = 0        # 0: only at the end (when --out is given)
    final_checkpoint: bool = True    # False: a measurement run, which need not write weights and moments
    lr: float = 1e-3
    min_lr_ratio: float = 0.1        # cosine decays to lr * min_lr_ratio
    warmup_steps: int | None = None  # LR warm-up; None: max(1, steps // 10)
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    timing_warmup: int = 2           # first steps excluded from the measured medians
    track_memory: str = "warmup"     # warmup | all | off (see metrics.py)
    profile_steps: int = 0           # torch.profiler traces of this many steps after the warm-up (profiling.py)
    balanced_routing: bool = False   # MoE test mode: experts by token position, not by the router (runtime/moe.py)
    quiet: bool = False

    def lr_warmup_steps(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 10)

    def to_argv(self) -> list[str]:
        """The `meshplan run` flags that reproduce these options (what torchrun workers are given):
        paths made absolute, so a worker started elsewhere (another node, sbatch) finds them."""
        argv = ["--steps", str(self.steps), "--seed", str(self.seed), "--lr", repr(self.lr),
                "--max-grad-norm", repr(self.max_grad_norm), "--timing-warmup", str(self.timing_warmup),
                "--track-memory", self.track_memory, "--checkpoint-every", str(self.checkpoint_every),
                "--data", self.data if self.data == "synthetic" else str(Path(self.data).resolve()),
                "--data-dtype", self.data_dtype]
        if self.out:
            argv += ["--out", str(Path(self.out).resolve())]
        if self.profile_steps:
            argv += ["--profile-steps", str(self.profile_steps)]
        if self.warmup_steps is not None:
            argv += ["--warmup-steps", str(self.warmup_steps)]
        if self.resume:
            argv.append("--resume")
        if not self.final_checkpoint:
            argv.append("--no-final-checkpoint")
        if self.balanced_routing:
            argv.append("--balanced-routing")
        if self.quiet:
            argv.append("--quiet")
        return argv


def check_runnable(plan: Plan, device_type: str | None = None) -> None:
    """A plan can run when nothing is 'auto' and the runtime supports its combination (on
    `device_type`'s backend when given: None where it is not known, as for an sbatch script)."""
    auto = plan.auto_fields()
    if auto:
        raise InputError("plan", f"has 'auto' fields ({', '.join(auto)}); fill them with "
                                 "`meshplan estimate --plan P` or `meshplan plan` first")
    check_runtime_rules(plan)  # the combinations the planner prunes (specs/rules.py), for plans built in code
    why = stack_reason(plan.stack, "run")
    if why:
        raise InputError("stack", why)
    p = plan.parallel
    why = tied_embeddings_reason(plan.model.tied_embeddings, p.tp, p.pp)
    if why:
        raise InputError("model.tied_embeddings", why)
    local_batch = plan.training.global_batch // p.dp()
    n_micro = local_batch // plan.training.micro_batch
    if microbatch_reason(p.pp_schedule, p.pp, p.pp_virtual_stages, n_micro):
        raise InputError("training.global_batch", f"gives {n_micro} pipeline micro-batches per rank, which "
                                                  f"{p.pp_schedule} (pp {p.pp}, {p.pp_virtual_stages} virtual stages) "
                                                  "does not accept: interleaved schedules need whole rounds of pp, "
                                                  "V-shaped ones at least pp*pp_virtual_stages")
    if device_type is not None:
        check_backend(plan, device_type)


def local_device_type() -> str:
    """The device `meshplan run` workers started on this machine use (worker.pick_device)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(plan: Plan, device: str | None = None) -> None:
    """Refuse float8 on a GPU without fp8 tensor cores (this process's CUDA device, or GPU 0).
    Uncompiled float8 is refused against the plan's profile (plan_checks.check_against_profile)."""
    import torch

    if not plan.memory.float8 or not torch.cuda.is_available():
        return
    why = float8_device_reason(True, "cuda", torch.cuda.get_device_capability(device))
    if why:
        raise InputError("memory.float8", why)


def check_backend(plan: Plan, device_type: str) -> None:
    """Refuse, naming the field, what the runtime cannot honour on this device's backend, before
    anything launches (the rules are specs/rules.py's, which the planner follows too)."""
    backend = backend_for_device(device_type)
    for field_name, why in unsupported_fields(plan, backend):
        raise InputError(field_name, f"cannot run on {device_type} ({backend}): {why}")
