"""Distributed checkpoints with torch.distributed.checkpoint (DCP).

A checkpoint is DIR/checkpoints/step-NNNNNNNN/: model and optimizer state (sharded as they live,
via get_state_dict / set_state_dict, so any layout can write its own shards) plus the LR
schedulers, the step and the data position. It is written to a hidden temp dir and renamed when
every rank has finished, so a directory named step-* is always complete.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

STEP_DIR = re.compile(r"^step-(\d{8})$")
# Flat optimizer keys ("state.<fqn>.exp_avg") so the state of several model parts (pipeline
# stages on one rank, each with its own optimizer) merges into one dict without collisions.
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _state(parts: list[nn.Module], optimizers: list, schedulers: list, step: int, data_position: int) -> dict[str, Any]:
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for part, opt in zip(parts, optimizers):
        model.update(get_model_state_dict(part, options=OPTIONS))
        optim.update(get_optimizer_state_dict(part, opt, options=OPTIONS))
    return {"model": model, "optim": optim,
            "train": {"step": step, "data_position": data_position,
                      "lr_schedulers": [s.state_dict() for s in schedulers]}}


def save(root: Path, parts: list[nn.Module], optimizers: list, schedulers: list, step: int, data_position: int) -> Path:
    """Write checkpoint `step` under root/checkpoints atomically; returns its directory."""
    ckpt_root = root / "checkpoints"
    final = ckpt_root / f"step-{step:08d}"
    tmp = ckpt_root / f".tmp-step-{step:08d}"
    if dist.get_rank() == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    dcp.save(_state(parts, optimizers, schedulers, step, data_position), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under root/checkpoints (temp dirs are ignored)."""
    ckpt_root = root / "checkpoints"
    if not ckpt_root.is_dir():
        return None
    found = sorted(p for p in ckpt_root.iterdir() if STEP_DIR.match(p.name) and (p / ".metadata").exists())
    return found[-1] if found else None


def load(path: Path, parts: list[nn.Module], optimizers: list, schedulers: list) -> tuple[int, int]:
    """Restore model, optimizer and schedulers in place; returns (step, data_position)."""
    state = _state(parts, optimizers, schedulers, 0, 0)
    dcp.load(state, checkpoint_id=str(path))
    for part, opt in zip(parts, optimizers):
        set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        set_optimizer_state_dict(part, opt, state["optim"], options=OPTIONS)
    for sched, sd in zip(schedulers, state["train"]["lr_schedulers"]):
        sched.load_state_dict(sd)
    return int(state["train"]["step"]), int(state["train"]["data_position"])
