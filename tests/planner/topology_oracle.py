"""The plan's `placement:` field derived independently of the cost model: the cluster as a networkx
graph (devices, each joined to its host's switch by the node level; hosts joined to one fabric by
the network), each mesh dimension's groups mapped to devices by the mesh order, and the dimension charged to the
slowest link level on the shortest paths between the members of any of its groups. test_placement checks
the planner's placement_for (the cost model's group spans) against it."""

from __future__ import annotations

import networkx as nx

from meshplan.profiles.schema import ClusterProfile


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
    """Devices joined to their host's switch by the node level, hosts to one fabric by the network."""
    g = nx.Graph()
    hosts = {d // devices_per_node for d in devices}
    for d in devices:
        g.add_edge(d, ("host", d // devices_per_node), level=node_level, weight=1)
    if len(hosts) > 1:
        for h in hosts:
            g.add_edge(("host", h), "fabric", level=cluster_level, weight=10)
    return g


def _groups(order: tuple[str, ...], degrees: dict[str, int], dim: str) -> list[list[int]]:
    """Every process group of `dim`: the ranks that differ only in their `dim` coordinate."""
    world = 1
    for d in degrees.values():
        world *= d
    out = []
    for rank in range(world):
        coords = _rank_coords(order, degrees, rank)
        if coords[dim] == 0:
            out.append([_rank_of(order, degrees, {**coords, dim: i}) for i in range(degrees[dim])])
    return out


def topology_placement(degrees: dict[str, int], order: tuple[str, ...], prof: ClusterProfile) -> dict[str, str]:
    """dim -> the slowest link level any of its groups crosses (a collective's groups run in step, so
    the slowest decides), from the shortest paths of the topology graph; dims of size 1 omitted."""
    severity = {"node": 0, "cluster": 1}
    scope = {l.name: l.scope for l in prof.links}
    world = 1
    for d in degrees.values():
        world *= d
    g = _topology(set(range(world)), prof.devices_per_node, prof.node_level(), prof.cluster_level())
    paths: dict[int, dict] = {}
    out = {}
    for dim in order:
        if degrees[dim] == 1:
            continue
        worst = prof.node_level()
        for members in _groups(order, degrees, dim):
            if members[0] not in paths:
                paths[members[0]] = nx.single_source_dijkstra_path(g, members[0], weight="weight")
            for m in members[1:]:
                path = paths[members[0]][m]
                for a, b in zip(path, path[1:]):
                    lvl = g.edges[a, b]["level"]
                    if severity[scope[lvl]] > severity[scope[worst]]:
                        worst = lvl
        out[dim] = worst
    return out
