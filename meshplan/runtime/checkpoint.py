"""Distributed checkpoints with torch.distributed.checkpoint (DCP), safe against crashes and
loadable under any other plan.

A checkpoint is DIR/checkpoints/step-NNNNNNNN/ holding
  - model and optimizer state as DCP shards (`*.distcp` + `.metadata`), keyed by the parameter's
    fully-qualified name in the plain model (get_model_state_dict / get_optimizer_state_dict strip
    FSDP, activation-checkpoint and compile wrappers; pipeline stages keep whole-model FQNs). DCP
    stores each tensor's global shape and every shard's offsets, so a checkpoint written by one
    layout (FSDP x TP on 4 ranks, PP on 2, ...) loads into any other: resharding on load.
  - the LR scheduler state, the step and the data position (the index of the next global batch;
    data.py reads the same global batch at a step under every plan),
  - meta.json: the plan it was written under, world size, global batch and sequence length,
  - .complete: written last, after every rank's shards are fsync'ed (DCP's FileSystemWriter
    fsyncs each file, sync_files=True, where the filesystem accepts a file fsync: some FUSE and
    network volumes refuse it, and DCP would fail the save; files_can_fsync asks first).

Publishing: every rank writes into the hidden `.tmp-step-N`; after a barrier rank 0 writes
meta.json and .complete (fsync'ed), fsyncs the directory and renames it to `step-N` (atomic), then
fsyncs the parent (where the filesystem allows a directory fsync: FUSE and network volumes refuse
it), and tells every rank whether publishing worked, so a failure raises CheckpointError on all.
A crash at any point leaves either no `step-N` or a complete one, and the older checkpoints
untouched; `latest` only returns directories holding `.complete`. The run
directory must be on a filesystem every rank sees (as DCP itself requires on several nodes).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from meshplan.errors import InputError
from meshplan.runtime.faults import maybe_fail

STEP_DIR = re.compile(r"^step-(\d{8})$")
TMP_PREFIX = ".tmp-step-"
COMPLETE = ".complete"
META = "meta.json"
# Flat optimizer keys ("state.<fqn>.exp_avg") so the state of several model parts (pipeline
# stages on one rank, each with its own optimizer) merges into one dict without collisions, and
# a plan with another stage split finds every parameter's state under the same key.
OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _state(parts: list[nn.Module], optimizers: list, schedulers: list, step: int, data_position: int) -> dict[str, Any]:
    model: dict[str, Any] = {}
    optim: dict[str, Any] = {}
    for part, opt in zip(parts, optimizers):
        model.update(get_model_state_dict(part, options=OPTIONS))
        optim.update(get_optimizer_state_dict(part, opt, options=OPTIONS))
    # One scheduler state, not one per part: every part's scheduler is identical, and the number
    # of parts per rank changes with the plan (virtual pipeline stages).
    return {"model": model, "optim": optim,
            "train": {"step": step, "data_position": data_position, "lr_scheduler": schedulers[0].state_dict()}}


# fsync is refused with these by some FUSE and network filesystems (the volumes GPU clouds mount as
# work directories), for directories and on some for files too. They give no stronger guarantee to ask
# for: the rename stays atomic there. Any other errno (EIO, ENOSPC, ...) is a real failure.
FSYNC_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


class CheckpointError(RuntimeError):
    """A checkpoint could not be published; raised on every rank with one line naming why."""


def _fsync(fd: int) -> bool:
    """fsync, or False where the filesystem does not support it (FSYNC_UNSUPPORTED); other errors raise."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in FSYNC_UNSUPPORTED:
            raise
        return False
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, text: str) -> bool:
    """Write and fsync a file; False where the filesystem refuses file fsync."""
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        return _fsync(f.fileno())


def files_can_fsync(directory: Path, rank: int) -> bool:
    """Whether this rank's filesystem accepts fsync of a file in `directory`. DCP's writer fsyncs every
    file it writes and fails the whole save on a refusal, so where it is refused the save asks for none."""
    probe = directory / f".fsync-probe-{rank}"
    try:
        return _write_synced(probe, "")
    finally:
        probe.unlink(missing_ok=True)


def save(root: Path, parts: list[nn.Module], optimizers: list, schedulers: list, step: int, data_position: int,
         meta: dict[str, Any] | None = None) -> Path:
    """Write checkpoint `step` under root/checkpoints and publish it atomically; returns its directory."""
    ckpt_root = root / "checkpoints"
    final = ckpt_root / f"step-{step:08d}"
    tmp = ckpt_root / f"{TMP_PREFIX}{step:08d}"
    rank = dist.get_rank()
    if rank == 0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(ckpt_root)
    dist.barrier()
    writer = FileSystemWriter(str(tmp), sync_files=files_can_fsync(ckpt_root, rank))
    dcp.save(_state(parts, optimizers, schedulers, step, data_position), storage_writer=writer,
             checkpoint_id=str(tmp))
    maybe_fail("raise_in_save", rank, step)
    dist.barrier()
    failure: Exception | None = None
    if rank == 0:
        try:
            _publish(tmp, final, {**(meta or {}), "step": step, "data_position": data_position,
                                  "world_size": dist.get_world_size(), "written_at": time.time()})
        except Exception as exc:  # any failure: it is raised again below, on every rank
            failure = exc
    # Rank 0's outcome, on every rank: a failed publish fails the whole run at once rather than
    # leaving the other ranks in the next collective until the process group times out.
    outcome = [None if failure is None else _one_line(failure)]
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise CheckpointError(f"checkpoint {final.name} not published: {outcome[0]}") from failure
    return final


def _one_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _remove_stale_temps(ckpt_root: Path) -> None:
    """Temp dirs left by a crashed save are never loaded; remove them before writing anew."""
    for p in ckpt_root.iterdir():
        if p.name.startswith(TMP_PREFIX) or p.name.startswith(".old-step-"):
            shutil.rmtree(p, ignore_errors=True)


def _publish(tmp: Path, final: Path, meta: dict[str, Any]) -> None:
    _write_synced(tmp / META, json.dumps(meta, indent=1) + "\n")
    _write_synced(tmp / COMPLETE, "")
    _fsync_dir(tmp)
    old = None
    if final.exists():  # re-saving a step (e.g. a run repeated with the same --out): keep the old until replaced
        old = final.with_name(f".old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def is_complete(path: Path) -> bool:
    return STEP_DIR.match(path.name) is not None and (path / COMPLETE).is_file() and (path / ".metadata").is_file()


def latest(root: Path) -> Path | None:
    """The newest complete checkpoint under root/checkpoints (temp dirs and unmarked dirs are ignored)."""
    ckpt_root = root / "checkpoints"
    if not ckpt_root.is_dir():
        return None
    found = sorted(p for p in ckpt_root.iterdir() if is_complete(p))
    return found[-1] if found else None


def read_meta(path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError) as exc:
        raise InputError("--resume", f"{path} has no readable {META} ({exc.__class__.__name__})")
    if not isinstance(meta, dict):
        raise InputError("--resume", f"{path / META} must hold a JSON object")
    return meta


def check_compatible(path: Path, model: dict[str, Any], seq_len: int, global_batch: int) -> dict[str, Any]:
    """A checkpoint resumes under any layout, but only for the same model and the same data order:
    the model shape, sequence length and global batch must equal the ones it was written with."""
    meta = read_meta(path)
    written = {"model": _shape(meta.get("model")), "seq_len": meta.get("seq_len"), "global_batch": meta.get("global_batch")}
    now = {"model": _shape(model), "seq_len": seq_len, "global_batch": global_batch}
    for key in ("model", "seq_len", "global_batch"):
        if written[key] != now[key]:
            field = "model" if key == "model" else f"training.{key}"
            was, has = (_differences(written[key], now[key]) if key == "model" else (written[key], now[key]))
            raise InputError(field, f"the checkpoint {path.name} was written with {key} {was}, the plan has "
                                    f"{has}; a resumed run must keep the model, seq_len and global_batch "
                                    "(the layout may change)")
    return meta


def check_resumable(out: Path, model: dict[str, Any], seq_len: int, global_batch: int) -> None:
    """Before launch: the newest complete checkpoint in `out`, if there is one, is of this model, seq_len and
    global batch (check_compatible), so a mismatch is one line from `meshplan run`, not one per worker."""
    found = latest(out)
    if found is not None:
        check_compatible(found, model, seq_len, global_batch)


def _differences(was: Any, has: Any) -> tuple[str, str]:
    """The model fields that differ, dotted (e.g. moe.experts 8 against 4), or the whole specs."""
    if not (isinstance(was, dict) and isinstance(has, dict)):
        return repr(was), repr(has)
    was, has = _flat(was), _flat(has)
    keys = sorted(k for k in set(was) | set(has) if was.get(k) != has.get(k))
    return ", ".join(f"{k} {was.get(k)!r}" for k in keys), ", ".join(f"{k} {has.get(k)!r}" for k in keys)


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _shape(model: Any) -> Any:
    """A model spec without its name: a model named differently (alias, config.json) is the same model."""
    return {k: v for k, v in model.items() if k != "name"} if isinstance(model, dict) else model


def load(path: Path, parts: list[nn.Module], optimizers: list, schedulers: list) -> tuple[int, int]:
    """Restore model, optimizer and schedulers in place (resharding to this layout); returns
    (step, data_position)."""
    state = _state(parts, optimizers, schedulers, 0, 0)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:  # missing keys / shape mismatch: the checkpoint is not of this model
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise InputError("--resume", f"cannot load {path}: {first[:300]}")
    for part, opt in zip(parts, optimizers):
        set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        set_optimizer_state_dict(part, opt, state["optim"], options=OPTIONS)
    for sched in schedulers:
        sched.load_state_dict(state["train"]["lr_scheduler"])
    return int(state["train"]["step"]), int(state["train"]["data_position"])
