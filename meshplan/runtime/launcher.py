"""Start torchrun (torch.distributed.run) for a plan on this node: one process per GPU, or per
simulated GPU on CPU (gloo). The workers run `python -m meshplan.runtime.worker` with the same
arguments as `meshplan run`."""

from __future__ import annotations

import subprocess
import sys


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    # --standalone: a local rendezvous on a free port, so concurrent runs do not collide.
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "-m", "meshplan.runtime.worker", *argv]


def launch(nproc: int, argv: list[str]) -> int:
    """Run torchrun in a child process and return its exit code."""
    return subprocess.call(torchrun_command(nproc, argv))
