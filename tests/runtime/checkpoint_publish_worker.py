"""One rank of a small gloo world that saves one checkpoint while directory fsync fails with a given
errno (file fsyncs, DCP's, are left alone); writes {rank: outcome} for test_checkpoint_publish.py."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from meshplan.runtime import checkpoint


def refuse_dir_fsync(code: int) -> None:
    """os.fsync raises `code` for directories, on rank 0 only (the one rank that publishes)."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        real(fd)

    os.fsync = fsync


def main(root: Path, errno_name: str) -> None:
    # a hang fails fast: the test's own timeout kills the world long before gloo's default 30 min
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    if rank == 0:
        refuse_dir_fsync(getattr(errno, errno_name))
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    outcome: dict = {"error": None, "type": None}
    try:
        checkpoint.save(root, [model], [opt], [sched], step=1, data_position=1, meta={"test": True})
    except Exception as exc:  # recorded for the test to judge
        outcome = {"error": str(exc), "type": exc.__class__.__name__}
    (root / f"rank{rank}.json").write_text(json.dumps(outcome))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
