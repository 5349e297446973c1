"""Re-planning: a checkpoint written by 4 ranks under FSDP x TP (2x2) resumes on 2 ranks under
FSDP 2 and under PP 2 through DCP resharding (model and optimizer state keyed by layout-free
FQNs), and training continues with the losses of the run that kept the original plan.

Tolerance 1e-4 relative, as for the layout tests (tests/runtime/test_layouts.py): all runs are
fp32 and read the same global batch at each step (data.py indexes rows by step, independent of
the layout); the layouts differ only in how sums are split and ordered (sharded matmuls,
reduce-scatter vs all-reduce, 2 vs 4 micro-batches per rank): observed 4.4e-8 relative over
steps 5-8. A lost or repeated step is far outside it: consecutive steps' losses differ by
2e-3 to 5e-3 relative over steps 4-8 here. Step 5's loss checks the loaded weights; steps 6-8 also the AdamW
moments and the LR schedule position.
"""

from __future__ import annotations

import pytest

from helpers import STEPS
from helpers import assert_losses_match, losses, metrics

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
REL_TOL = 1e-4
RESUMED = list(range(5, STEPS + 1))


@pytest.mark.parametrize("name", ["replan_fsdp", "replan_pp"])
def test_resume_under_another_plan(resumed, name):
    job, ref = resumed[name].ok(), resumed["ref_fsdp_tp"].ok()
    assert "resumed from" in job.text() and "at step 4 (written under" in job.text(), job.text()[-2000:]
    assert_losses_match(losses(job.out), losses(ref.out), REL_TOL, RESUMED)
    ref_lr = {r["step"]: r["lr"] for r in metrics(ref.out)}
    for r in metrics(job.out):
        assert r["lr"] == pytest.approx(ref_lr[r["step"]], rel=1e-12)


def test_resume_rejects_another_model_or_batch(tmp_path, resumed):
    """Different global batch: the data order would change; refused with a one-line error."""
    import json
    import shutil

    from meshplan.errors import InputError
    from meshplan.runtime.checkpoint import check_compatible

    src = resumed["ref_fsdp_tp"].ok().out / "checkpoints" / "step-00000004"
    meta = json.loads((src / "meta.json").read_text())
    check_compatible(src, meta["model"], 32, 8)
    with pytest.raises(InputError, match="global_batch"):
        check_compatible(src, meta["model"], 32, 16)
    with pytest.raises(InputError, match="model"):
        check_compatible(src, {**meta["model"], "n_layers": 2}, 32, 8)
    shutil.copytree(src, tmp_path / "c")
    (tmp_path / "c" / "meta.json").write_text("not json")
    with pytest.raises(InputError, match="meta.json"):
        check_compatible(tmp_path / "c", meta["model"], 32, 8)
