"""The plan's `placement:` field (placement_for: the cost model's group spans) agrees with an
independent derivation from the cluster's topology graph (topology_oracle.py), for every mesh order
the planner declares, on 8-GPU hosts and on a 72-GPU NVLink domain."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from topology_oracle import topology_placement  # noqa: E402

from meshplan.cost_models.layout import Layout, even_split  # noqa: E402
from meshplan.planner.placement import candidate_orders, placement_for  # noqa: E402
from meshplan.profiles.registry import load_profile  # noqa: E402
from meshplan.specs.registry import resolve_model  # noqa: E402

DEGREES = (1, 2, 3, 4, 8, 16)
SPEC = resolve_model("llama3-8b")


def _layout(pp: int, dp_replicate: int, dp_shard: int, cp: int, tp: int) -> Layout:
    return Layout(spec=SPEC, gpus=pp * dp_replicate * dp_shard * cp * tp, seq_len=8192, global_batch=1024,
                  micro_batch=1, dtype="bf16", dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, sp=tp > 1,
                  async_tp=False, pp=pp, schedule="1F1B", v=1, stage_layers=even_split(SPEC.n_layers, pp), cp=cp,
                  ac="none", sac_ops=None, float8=False, reshard_after_forward=False, compile=True)


@pytest.mark.parametrize("profile", ["h100-80g-dgx", "gb200-186g-nvl72"])
def test_placement_field_matches_the_topology_graph(profile):
    prof = load_profile(profile)
    checked = 0
    for pp, rep, shard, cp, tp in itertools.product((1, 2, 3), (1, 2), DEGREES, (1, 2, 3), (1, 2, 4, 8)):
        if pp * rep * shard * cp * tp > 96:
            continue
        lay = _layout(pp, rep, shard, cp, tp)
        degrees = {"pp": pp, "dp_replicate": rep, "dp_shard": shard, "cp": cp, "tp": tp}
        for order in candidate_orders():
            assert placement_for(lay, order, prof) == topology_placement(degrees, order, prof), (degrees, order)
            checked += 1
    assert checked > 500
