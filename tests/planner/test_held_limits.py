"""Peaks.held_limits: per pipeline rank, the most activation sets that still fit in its lightest phase.
The interpolated guess must land where a scan over every count does."""

from __future__ import annotations

import pytest

from meshplan.cost_models.layout import Layout, even_split
from meshplan.cost_models.memory import GIB, rank_memory
from meshplan.planner.peaks import Peaks
from meshplan.profiles.registry import load_profile
from meshplan.specs.registry import resolve_model

PROF = load_profile("h100-80g-dgx")


def _layout(pp: int, v: int, micro: int, ac: str) -> Layout:
    spec = resolve_model("llama3-70b")
    return Layout(spec=spec, gpus=64 * pp, seq_len=8192, global_batch=256, micro_batch=micro, dtype="bf16",
                  dp_replicate=1, dp_shard=8, tp=8, sp=True, async_tp=False, pp=pp,
                  schedule="Interleaved1F1B" if v > 1 else "1F1B", v=v, stage_layers=even_split(80, pp * v), cp=1,
                  ac=ac, sac_ops=None, float8=False, reshard_after_forward=False, compile=True)


def _scan(lay: Layout, r: int, usable: float) -> float:
    """The largest count that fits, by trying every count (inf: all fit; -1: none)."""
    cap = lay.n_micro * lay.v
    fits = [rank_memory(lay, r, float(h), PROF.overheads, accumulating=0, loss_live=False).total / GIB <= usable
            for h in range(cap + 1)]
    if all(fits):
        return float("inf")
    if not fits[0]:
        return -1.0
    return float(fits.index(False) - 1)


@pytest.mark.parametrize("pp,v,micro,ac", [(4, 1, 1, "none"), (4, 2, 1, "selective"), (8, 1, 2, "full"),
                                           (2, 4, 1, "none")])
@pytest.mark.parametrize("usable", [20.0, 35.0, 60.0, 78.5, 500.0, 1.0])
def test_held_limits_equal_a_scan_over_every_count(pp, v, micro, ac, usable):
    lay = _layout(pp, v, micro, ac)
    got = Peaks(PROF, usable).held_limits(lay)
    assert got == tuple(_scan(lay, r, usable) for r in range(pp))
