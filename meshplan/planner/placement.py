"""Where each mesh dimension's process groups land on the cluster, and which mesh orders matter.

The cost model charges a group's collectives by its GroupSpan (size, ranks per node). A mesh
order (outer to inner) decides the spans: dims placed innermost share a node. `distinct_orders`
keeps, for one set of degrees, one order per distinct span assignment (orders giving the same
spans score identically), starting with TorchTitan's (tp innermost).

`topology_placement` derives the same mapping independently from a networkx graph of the cluster
(nodes = devices, edges weighted by link level: node-local links inside a host, the network
between hosts through a switch vertex): each dim's group containing rank 0 is mapped to devices
and charged to the slowest link level on the paths between its members. It is used for the
plans the planner writes (the `placement:` field) and checked against `group_spans` in tests.
"""

from __future__ import annotations

import itertools

from meshplan.cost_models.comm import GroupSpan
from meshplan.cost_models.estimate import DEFAULT_MESH_ORDER, group_spans
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


def _rank_coords(order: tuple[str, ...], degrees: dict[str, int], rank: int) -> dict[str, int]:
    coords = {}
    for dim in reversed(order):
        rank, coords[dim] = divmod(rank, degrees[dim])
    return coords


def _rank_of(order: tuple[str, ...], degrees: dict[str, int], coords: dict[str, int]) -> int:
    r = 0
    for dim in order:
        r = r * degrees[dim] + coords[dim]
    return r


def _topology(devices: set[int], devices_per_node: int, node_level: str, cluster_level: str):
    """Devices joined to their host's switch by the node level, hosts to one fabric by the network
    (only the hosts the groups touch are built, so a 16k-GPU cluster stays a small graph)."""
    import networkx as nx

    g = nx.Graph()
    hosts = {d // devices_per_node for d in devices}
    for d in devices:
        g.add_edge(d, ("host", d // devices_per_node), level=node_level, weight=1)
    if len(hosts) > 1:
        for h in hosts:
            g.add_edge(("host", h), "fabric", level=cluster_level, weight=10)
    return g


def topology_placement(degrees: dict[str, int], order: tuple[str, ...], prof: ClusterProfile) -> dict[str, str]:
    """dim -> link level its rank-0 group spans, from the topology graph (dims of size 1 omitted)."""
    import networkx as nx

    severity = {"node": 0, "cluster": 1}
    scope = {l.name: l.scope for l in prof.links}
    origin = _rank_coords(order, degrees, 0)
    groups = {dim: [_rank_of(order, degrees, {**origin, dim: i}) for i in range(degrees[dim])]
              for dim in order if degrees[dim] > 1}
    devices = {d for members in groups.values() for d in members}
    if not devices:
        return {}
    g = _topology(devices, prof.devices_per_node, prof.node_level(), prof.cluster_level())
    out = {}
    for dim, members in groups.items():
        paths = nx.single_source_dijkstra_path(g, members[0], weight="weight")
        worst = prof.node_level()
        for m in members[1:]:
            path = paths[m]
            for a, b in zip(path, path[1:]):
                lvl = g.edges[a, b]["level"]
                if severity[scope[lvl]] > severity[scope[worst]]:
                    worst = lvl
        out[dim] = worst
    return out


def placement_for(lay: Layout, order: tuple[str, ...], prof: ClusterProfile) -> dict[str, str]:
    """The plan's `placement:` field, from the topology graph."""
    degrees = {"pp": lay.pp, "dp_replicate": lay.dp_replicate, "dp_shard": lay.dp_shard, "cp": lay.cp, "tp": lay.tp}
    return topology_placement(degrees, order, prof)
