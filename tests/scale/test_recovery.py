"""Surviving failures: a worker killed mid-run (torchrun --max-restarts restarts the group, which
resumes from the newest complete checkpoint without --resume), and a crash in the middle of a
checkpoint save (the previous checkpoint stays loadable; --resume picks the newest complete one).
Either way the run ends with every step logged once and the losses of an uninterrupted run."""

from __future__ import annotations

import os

import pytest

from helpers import STEPS
from helpers import assert_losses_match, losses, metrics
from meshplan.runtime import checkpoint

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
ALL_STEPS = list(range(1, STEPS + 1))
# Same plan, same world, same data: a resumed run repeats the uninterrupted run's arithmetic after
# loading bit-identical state (observed: equal to the last bit); a lost or repeated step (another
# batch, LR or optimizer state) moves the loss by ~1e-3 or more.
REL_TOL = 1e-6


def test_killed_worker_restarts_from_last_checkpoint(jobs):
    killed, ref = jobs["killed"].ok(), jobs["ref_fsdp"].ok()
    log = killed.text()
    assert "restart 1 after a failure" in log, log[-3000:]
    assert "at step 2" in log  # rank 1 died after step 3; the newest checkpoint was step 2
    rows = metrics(killed.out)
    assert [r["step"] for r in rows] == ALL_STEPS  # step 3 logged once although it ran twice
    assert_losses_match(losses(killed.out), losses(ref.out), REL_TOL, ALL_STEPS)
    names = sorted(os.listdir(killed.out / "checkpoints"))
    assert names == [f"step-{s:08d}" for s in (2, 4, 6, 8)], names
    assert all(checkpoint.is_complete(killed.out / "checkpoints" / n) for n in names)


def test_crash_during_save_keeps_previous_checkpoint(resumed):
    state = resumed.crash_state
    assert state["codes"] != [0], "the injected fault did not fail the run"
    assert "InjectedFault" in state["log"]
    # Steps 5 and 6 ran, step 6's save died after the shards were written: a temp dir without
    # .complete is left and never loaded; step-4 is the newest complete checkpoint.
    assert state["steps"] == [1, 2, 3, 4, 5, 6]
    assert state["entries"] == [".tmp-step-00000006", "step-00000002", "step-00000004"], state["entries"]
    assert state["latest"] is not None and state["latest"].name == "step-00000004"

    after, ref = resumed["after_crash"].ok(), resumed["ref_fsdp"].ok()
    assert "resumed from" in after.text() and "at step 4" in after.text()
    assert [r["step"] for r in metrics(after.out)] == ALL_STEPS  # 5, 6 dropped and re-run, not duplicated
    assert_losses_match(losses(after.out), losses(ref.out), REL_TOL, ALL_STEPS)
    names = sorted(os.listdir(after.out / "checkpoints"))
    assert names == [f"step-{s:08d}" for s in (2, 4, 6, 8)], names  # the stale temp dir is gone


def test_latest_ignores_unpublished_directories(tmp_path):
    root = tmp_path / "checkpoints"
    for name, files in {"step-00000002": [".metadata", ".complete"], "step-00000004": [".metadata", ".complete"],
                        "step-00000006": [".metadata"], ".tmp-step-00000008": [".metadata", ".complete"],
                        "step-9": [".metadata", ".complete"]}.items():
        (root / name).mkdir(parents=True)
        for f in files:
            (root / name / f).write_text("")
    assert checkpoint.latest(tmp_path).name == "step-00000004"
    assert checkpoint.latest(tmp_path / "nothing") is None


def test_trim_metrics_keeps_rows_up_to_the_checkpoint(tmp_path):
    from meshplan.runtime.train import trim_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n\n{"step": 3}\n{"step": 4, "lo')  # last row cut by a crash
    trim_metrics(path, 2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    trim_metrics(tmp_path / "absent.jsonl", 2)  # nothing to trim: no error, nothing created
    assert not (tmp_path / "absent.jsonl").exists()
