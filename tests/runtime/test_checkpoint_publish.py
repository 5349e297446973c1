"""Publishing a DCP checkpoint: filesystems that cannot fsync a directory still get a complete
checkpoint; a publish that fails is one error on every rank, not a hang on the others."""

import errno
import os
import stat

import pytest
import torch
import torch.distributed as dist
from torch import nn

from meshplan.runtime import checkpoint


@pytest.fixture
def one_rank_world(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _trained():
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    sched.step()
    return model, opt, sched


def test_directory_fsync_unsupported_still_publishes(one_rank_world, tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync(fd):  # a FUSE / network volume: files sync, directories answer EINVAL
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    model, opt, sched = _trained()
    final = checkpoint.save(tmp_path, [model], [opt], [sched], step=3, data_position=3)
    assert checkpoint.latest(tmp_path) == final and checkpoint.is_complete(final)
    fresh = nn.Linear(8, 4)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh_sched = torch.optim.lr_scheduler.LambdaLR(fresh_opt, lambda s: 1.0)
    assert checkpoint.load(final, [fresh], [fresh_opt], [fresh_sched]) == (3, 3)
    assert torch.equal(fresh.weight, model.weight)


def test_other_directory_fsync_errors_still_fail(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        checkpoint._fsync_path(tmp_path)


def test_failed_publish_raises_on_every_rank(one_rank_world, tmp_path, monkeypatch):
    def publish(tmp, final, meta):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(checkpoint, "_publish", publish)
    model, opt, sched = _trained()
    with pytest.raises(checkpoint.CheckpointWriteError, match="cannot publish checkpoint .*step-00000002"):
        checkpoint.save(tmp_path, [model], [opt], [sched], step=2, data_position=2)
    assert checkpoint.latest(tmp_path) is None
