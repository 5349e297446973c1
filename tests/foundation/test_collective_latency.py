"""A collective's latency grows with the ranks and nodes it spans, as NCCL's own latency model has it
(cost_models/comm.py nccl_latency_us; NVIDIA/nccl src/graph/tuning.cc, Simple protocol: 8.4 us fixed, a ring
step 3.4 us over NVLink and 14 us over the network, a tree step 4.0 / 14 us): checked against hand
computations of that model, and against what it does to a plan that shards over thousands of GPUs."""

from __future__ import annotations

import math

import pytest

from meshplan.cost_models import forms
from meshplan.cost_models.comm import GroupSpan, collective_time, nccl_latency_us
from meshplan.cost_models.estimate import estimate_plan
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import Plan, plan_from_dict


def test_ring_all_gather_steps_by_hand():
    # 512 ranks on 64 nodes: 448 NVLink steps and 63 network steps of a 511-step ring
    assert nccl_latency_us("all_gather", 512, 64) == pytest.approx(8.4 + 448 * 3.4 + 63 * 14.0)
    assert nccl_latency_us("reduce_scatter", 128, 128) == pytest.approx(8.4 + 127 * 14.0)


def test_all_reduce_takes_the_lower_of_tree_and_ring():
    # one rank on each of 1024 nodes: the tree's 2 x 10 network steps, not the ring's 2 x 1023
    assert nccl_latency_us("all_reduce", 1024, 1024) == pytest.approx(8.4 + 2 * 10 * 14.0)
    # two nodes of 8: tree 8.4 + 2 (7 x 4.0 + 1 x 14) = 92.4 against ring 8.4 + 2 (14 x 3.4 + 14) = 131.6
    assert nccl_latency_us("all_reduce", 16, 2) == pytest.approx(92.4)
    assert nccl_latency_us("all_to_all", 64, 8) == 0.0


def test_a_wide_group_pays_the_steps_a_small_one_keeps_the_measured_latency():
    prof = load_profile("h100-80g-dgx")
    net = prof.collectives[prof.cluster_level()]["all_gather"]
    node = prof.collectives[prof.node_level()]["all_gather"]
    _, net_lat = net.line_for(1.0)
    _, node_lat = node.line_for(1.0)
    # one byte: latency alone. Inside a node the profile's measured line, unchanged.
    assert collective_time(prof, "all_gather", 1.0, GroupSpan(8, 8)) == pytest.approx(node_lat * 1e-6, rel=1e-3)
    # two nodes: the measured network + node latency where it exceeds NCCL's 16-rank ring (70 us)
    two = max(net_lat + node_lat, 8.4 + 14 * 3.4 + 14.0)
    assert collective_time(prof, "all_gather", 1.0, GroupSpan(16, 8)) == pytest.approx(two * 1e-6, rel=1e-3)
    # 256 nodes of 8: NCCL's 2047-step ring, 9.7 ms, far past any measured latency
    wide = 8.4 + (2048 - 256) * 3.4 + 255 * 14.0
    assert collective_time(prof, "all_gather", 1.0, GroupSpan(2048, 8)) == pytest.approx(wide * 1e-6, rel=1e-3)
    assert wide > 100 * (net_lat + node_lat)


def test_gloo_keeps_its_measured_latency():
    """NCCL's model prices NCCL's collectives: a CPU profile (gloo) keeps the latency it measured."""
    prof = load_profile("cpu-gloo")
    _, net_lat = prof.collectives[prof.cluster_level()]["all_gather"].line_for(1.0)
    _, node_lat = prof.collectives[prof.node_level()]["all_gather"].line_for(1.0)
    assert nccl_latency_us("all_gather", 8192, 1024) > 2 * (net_lat + node_lat)  # 38.7 ms against 10.5
    assert collective_time(prof, "all_gather", 1.0, GroupSpan(8192, 8)) == pytest.approx(
        (net_lat + node_lat) * 1e-6, rel=1e-3)


def _fsdp_plan(shard: int, gpus: int = 2048) -> Plan:
    return plan_from_dict({
        "version": 1, "model": "llama3-8b", "cluster": "h100-80g-dgx", "gpus": gpus, "compile": True,
        "mesh_order": ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
        "training": {"seq_len": 8192, "global_batch": gpus, "micro_batch": 1, "dtype": "bf16"},
        "parallel": {"dp_replicate": gpus // shard, "dp_shard": shard, "tp": 1, "sequence_parallel": False,
                     "async_tp": False, "pp": 1, "pp_schedule": "1F1B", "pp_virtual_stages": 1,
                     "pp_layers": None, "cp": 1},
        "memory": {"activation_checkpointing": "none", "sac_ops": None, "float8": False,
                   "reshard_after_forward": True}})


def test_sharding_over_thousands_of_gpus_costs_more_than_hybrid_sharding():
    """FSDP2 gathers and reduce-scatters every block over its shard group: over 2048 GPUs each call pays
    a 2047-step ring, milliseconds, where HSDP's 8-GPU shard group pays its node's latency and all-reduces
    the gradients once, by tree. The per-rank work is the same, so the difference is the exposed comm. FSDP2's
    copies, the same bytes on every rank either way, are left out (forms.py fsdp_copies)."""
    with forms.forms(fsdp_copies="none"):
        fsdp, hsdp = (estimate_plan(_fsdp_plan(s), load_profile("h100-80g-dgx")) for s in (2048, 8))
    assert fsdp.time_s["fsdp_comm"] > 10 * hsdp.time_s["fsdp_comm"]
    assert fsdp.step_time_s > hsdp.step_time_s
    # 32 blocks, an all-gather in forward and in backward and a reduce-scatter: ~96 calls of ~9.7 ms
    # issued, so the exposed share is at least a few hundred ms
    assert fsdp.time_s["fsdp_comm"] > 0.1
    assert math.isfinite(fsdp.step_time_s)
