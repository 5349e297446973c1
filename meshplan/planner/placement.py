"""Where each mesh dimension's process groups land on the cluster, and which mesh orders matter.

The cost model charges a group's collectives by its GroupSpan (size, ranks per node). A mesh
order (outer to inner) decides the spans: dims placed innermost share a node. `distinct_orders`
keeps, for one set of degrees, one order per distinct span assignment (orders giving the same
spans score identically), starting with TorchTitan's (tp innermost).

`placement_for` writes the plan's `placement:` field from those spans. tests/planner/topology_oracle.py
derives the same field independently, from a networkx graph of the cluster's devices, hosts and
fabric, and test_placement checks the two agree (the graph is not built here: importing networkx
cost a cold `meshplan plan` 0.08 s for a mapping the spans already give).
"""

from __future__ import annotations

import itertools

from meshplan.cost_models.comm import GroupSpan
from meshplan.cost_models.estimate import DEFAULT_MESH_ORDER, group_spans, placement_of
from meshplan.cost_models.layout import Layout
from meshplan.profiles.schema import ClusterProfile

INNER_DIMS = ("dp_replicate", "dp_shard", "cp", "tp")


def candidate_orders() -> list[tuple[str, ...]]:
    """The declared mesh orders: pp outermost (stages exchange little), tp innermost (TP's per-layer
    collectives need the node's links), dp_replicate outside dp_shard (HSDP); dp_shard and cp free."""
    out = [DEFAULT_MESH_ORDER]
    for perm in itertools.permutations(("dp_replicate", "dp_shard", "cp")):
        if perm.index("dp_replicate") > perm.index("dp_shard"):
            continue
        order = ("pp",) + perm + ("tp",)
        if order not in out:
            out.append(order)
    return out


def distinct_orders(lay: Layout, prof: ClusterProfile) -> list[tuple[tuple[str, ...], dict[str, GroupSpan]]]:
    """One (order, spans) per distinct span assignment for these degrees, default order first."""
    seen, out = set(), []
    for order in candidate_orders():
        spans = group_spans(lay, prof, order)
        key = tuple(sorted(spans.items()))
        if key not in seen:
            seen.add(key)
            out.append((order, spans))
    return out


def placement_for(lay: Layout, order: tuple[str, ...], prof: ClusterProfile) -> dict[str, str]:
    """The plan's `placement:` field: the link level each dim's group crosses, from the spans the
    estimate charged its collectives by (so the field says what was priced)."""
    return placement_of(group_spans(lay, prof, order), prof)
