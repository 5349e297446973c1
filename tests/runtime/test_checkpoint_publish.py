"""Publishing a checkpoint: directory fsync refused by FUSE / network filesystems is tolerated
(exactly EINVAL, ENOTSUP/EOPNOTSUPP, ENOSYS), any other failure raises, and a publish that fails on
rank 0 raises one line on every rank instead of leaving the others waiting."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.runtime import checkpoint

WORKER = Path(__file__).with_name("checkpoint_publish_worker.py")
WORLD = 2
TIMEOUT_S = 120  # two ranks save a 4x4 Linear in ~5 s on a 2-core host; a hang waits for gloo's 60 s


def _refusing(code: int):
    def fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))
    return fsync


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS])
def test_dir_fsync_refused_by_the_filesystem_is_tolerated(tmp_path, monkeypatch, code):
    monkeypatch.setattr(os, "fsync", _refusing(code))
    checkpoint._fsync_dir(tmp_path)  # no error


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC, errno.EBADF, errno.EROFS])
def test_dir_fsync_other_failures_raise(tmp_path, monkeypatch, code):
    monkeypatch.setattr(os, "fsync", _refusing(code))
    with pytest.raises(OSError) as info:
        checkpoint._fsync_dir(tmp_path)
    assert info.value.errno == code


def test_dir_fsync_closes_its_descriptor_when_it_raises(tmp_path, monkeypatch):
    closed = []
    real_close = os.close
    monkeypatch.setattr(os, "fsync", _refusing(errno.EIO))
    monkeypatch.setattr(os, "close", lambda fd: (closed.append(fd), real_close(fd)))
    with pytest.raises(OSError):
        checkpoint._fsync_dir(tmp_path)
    assert len(closed) == 1


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP, errno.ENOSYS])
def test_save_asks_dcp_for_no_file_fsync_where_the_filesystem_refuses_it(tmp_path, monkeypatch, code):
    monkeypatch.setattr(os, "fsync", _refusing(code))
    assert checkpoint.files_can_fsync(tmp_path, 0) is False
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_file_fsync_accepted_and_real_failures_raise(tmp_path, monkeypatch):
    assert checkpoint.files_can_fsync(tmp_path, 3) is True
    monkeypatch.setattr(os, "fsync", _refusing(errno.EIO))
    with pytest.raises(OSError) as info:
        checkpoint.files_can_fsync(tmp_path, 3)
    assert info.value.errno == errno.EIO and list(tmp_path.iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _world(root: Path, errno_name: str) -> dict[int, dict]:
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(root), errno_name], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0].decode(errors="replace"))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"checkpoint save hung (killed after {TIMEOUT_S} s)")
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    return {r: json.loads((root / f"rank{r}.json").read_text()) for r in range(WORLD)}


@pytest.mark.distributed
def test_failed_publish_raises_one_line_on_every_rank(tmp_path):
    got = _world(tmp_path, "EIO")
    for rank, outcome in got.items():
        assert outcome["type"] == "CheckpointError", (rank, outcome)
        assert outcome["error"].startswith("checkpoint step-00000001 not published: OSError: ")
        assert os.strerror(errno.EIO) in outcome["error"] and "\n" not in outcome["error"]
    # nothing published: the shards stay in the hidden temp dir that latest() never returns
    assert checkpoint.latest(tmp_path) is None


@pytest.mark.distributed
def test_publish_on_a_filesystem_refusing_dir_fsync_completes(tmp_path):
    got = _world(tmp_path, "EINVAL")
    assert all(outcome["error"] is None for outcome in got.values()), got
    found = checkpoint.latest(tmp_path)
    assert found is not None and found.name == "step-00000001" and checkpoint.is_complete(found)
    assert checkpoint.read_meta(found)["world_size"] == WORLD
