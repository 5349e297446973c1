"""Collective communication time on the link level a group spans (nccl-tests bus-bandwidth model)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.rules import NCCL, profile_backend


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw = algbw x this: the bytes each rank's link carries per byte of payload
    (all_reduce: the buffer; all_gather / reduce_scatter: the full, gathered buffer)."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


@dataclass(frozen=True)
class GroupSpan:
    """A process group's shape on the cluster: its size and how many of its ranks share a node."""

    size: int
    ranks_per_node: int
    # Hosts the group's most spread member touches, where the mesh's blocks straddle host boundaries
    # (estimate.group_spans); None: as many as its size needs at ranks_per_node a host.
    hosts: int | None = None

    @property
    def nodes(self) -> int:
        if self.hosts is not None:
            return self.hosts
        return max(1, -(-self.size // max(1, self.ranks_per_node)))


def collective_time(profile: ClusterProfile, collective: str, payload_bytes: float, span: GroupSpan,
                    calls: int = 1) -> float:
    """Seconds for one collective of `payload_bytes` over the group (or `calls` of them sharing it:
    each pays the latency, the bytes are paid once).

    Inside a node it runs on the node level. Across nodes, NCCL's hierarchical algorithms move the
    inter-node share through every NIC the group has on a node, so the bus bandwidth is the
    network's per-device figure times the group's ranks per node, capped by the node level.
    """
    n = span.size
    if n <= 1 or payload_bytes <= 0:
        return 0.0
    message = payload_bytes / calls
    node_bw, node_lat = profile.collectives[profile.node_level()][collective].line_for(message)
    if span.nodes <= 1:
        return calls * node_lat * 1e-6 + bus_factor(collective, n) * payload_bytes / (node_bw * 1e9)
    net_bw, net_lat = profile.collectives[profile.cluster_level()][collective].line_for(message)
    if collective == "all_to_all":
        return calls * net_lat * 1e-6 + _all_to_all_across_nodes(payload_bytes, span, net_bw, node_bw)
    busbw = min(net_bw * span.ranks_per_node, node_bw)
    latency = net_lat + (node_lat if span.ranks_per_node > 1 else 0.0)
    if runs_nccl(profile):
        latency = max(latency, nccl_latency_us(collective, n, span.nodes))
    return calls * latency * 1e-6 + bus_factor(collective, n) * payload_bytes / (busbw * 1e9)


def runs_nccl(profile: ClusterProfile) -> bool:
    """Whether the profile's collectives are NCCL's (a GPU profile), not gloo's (a CPU one)."""
    return profile_backend(profile.provenance) == NCCL


# NCCL's own latency model of its collectives, Simple protocol (NVIDIA/nccl src/graph/tuning.cc at b6475625,
# ncclTopoTuneModel: baseLat, hwLat): a fixed part and one per step of the algorithm, a step over NVLink or
# over the network. A ring all-gather or reduce-scatter of n ranks on N nodes runs n - 1 steps, N - 1 of them
# across nodes; an all-reduce runs a tree across nodes, 2 x log2(N) network steps and 2 x (n / N - 1) NVLink
# ones, or a ring of twice the all-gather's steps, whichever NCCL's model finds faster. A profile's measured
# latency is that of the rings it measured (a node or two); the steps are what grows past them. Gloo's
# collectives (CPU profiles) keep their measured latency.
NCCL_BASE_US = 8.4
NCCL_RING_STEP_US = {"node": 3.4, "network": 14.0}
NCCL_TREE_STEP_US = {"node": 4.0, "network": 14.0}


def nccl_latency_us(collective: str, n: int, nodes: int) -> float:
    """NCCL's modelled latency of one ring all-gather / reduce-scatter or one all-reduce (tree or ring, the
    lower) over n ranks on `nodes` nodes, in microseconds; 0 for the collectives it does not model so."""
    inside = n - nodes  # steps between ranks of one node, over NVLink
    ring, tree = NCCL_RING_STEP_US, NCCL_TREE_STEP_US
    if collective in ("all_gather", "reduce_scatter"):
        return NCCL_BASE_US + inside * ring["node"] + (nodes - 1) * ring["network"]
    if collective == "all_reduce":
        by_ring = NCCL_BASE_US + 2 * (inside * ring["node"] + (nodes - 1) * ring["network"])
        by_tree = NCCL_BASE_US + 2 * ((n / nodes - 1) * tree["node"] + math.log2(nodes) * tree["network"])
        return min(by_ring, by_tree)
    return 0.0


def _all_to_all_across_nodes(payload_bytes: float, span: GroupSpan, net_bw: float, node_bw: float) -> float:
    """An all-to-all has no hierarchical shortcut: each rank sends the (n - r) / n of its buffer bound for
    the other nodes' ranks through its own NIC (the network's per-device figure), while the (r - 1) / n
    for its node's other ranks crosses the node level at the same time."""
    n, r = span.size, span.ranks_per_node
    return max((n - r) / n * payload_bytes / (net_bw * 1e9), (r - 1) / n * payload_bytes / (node_bw * 1e9))


def forwarded_all_to_all_time(profile: ClusterProfile, network_bytes: float, node_bytes: float) -> float:
    """An all-to-all sent in two stages that pipeline chunk by chunk, as DeepEP's normal internode kernels
    run dispatch and combine: `network_bytes` through the rank's own NIC (the network's all-to-all rate per
    device) and `node_bytes` forwarded to their ranks inside the node (the node level's), the slower stage
    setting the time."""
    net_bw, net_lat = profile.collectives[profile.cluster_level()]["all_to_all"].line_for(network_bytes)
    node_bw, node_lat = profile.collectives[profile.node_level()]["all_to_all"].line_for(node_bytes)
    return (net_lat + node_lat) * 1e-6 + max(network_bytes / (net_bw * 1e9), node_bytes / (node_bw * 1e9))


def p2p_time(profile: ClusterProfile, payload_bytes: float, crosses_node: bool) -> float:
    """One pipeline transfer: benchmarked latency and bandwidth, plus the call's wait for its peer (host.py)."""
    level = profile.cluster_level() if crosses_node else profile.node_level()
    bandwidth, latency = profile.collectives[level]["send_recv"].line_for(payload_bytes)
    sync = profile.overheads.collective_sync_s
    return latency * 1e-6 + payload_bytes / (bandwidth * 1e9) + sync
