"""Fault injection for the recovery tests: `MESHPLAN_FAULT=<kind>:<rank>:<step>` makes one rank fail
at one point of the first attempt of a run (TORCHELASTIC_RESTART_COUNT 0), so a restarted or
resumed run proceeds normally.

kinds:
  kill_after_step  the rank SIGKILLs itself right after finishing optimizer step <step> (and any
                   checkpoint of that step): a worker dying mid-run without a word.
  raise_in_save    the rank raises while writing checkpoint <step>, after its shards are on disk
                   and before the checkpoint is published: a crash in the middle of a save.

Unset (always, outside tests) this module does nothing.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

ENV = "MESHPLAN_FAULT"
KINDS = ("kill_after_step", "raise_in_save")


class InjectedFault(RuntimeError):
    """Raised by raise_in_save; deliberately not an InputError (it is a crash, exit code 1)."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int

    @classmethod
    def from_env(cls) -> "Fault | None":
        raw = os.environ.get(ENV, "")
        if not raw or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
            return None
        kind, rank, step = raw.split(":")
        if kind not in KINDS:
            raise ValueError(f"{ENV}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        return cls(kind, int(rank), int(step))

    def hits(self, kind: str, rank: int, step: int) -> bool:
        return self.kind == kind and self.rank == rank and self.step == step


def maybe_fail(kind: str, rank: int, step: int) -> None:
    fault = Fault.from_env()
    if fault is None or not fault.hits(kind, rank, step):
        return
    if kind == "kill_after_step":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFault(f"{ENV}: injected {kind} on rank {rank} at step {step}")
