"""Published collective measurements as rows `meshplan validate` predicts: one collective of one
size over one group of GPUs, on the built-in profile of that hardware (comm.collective_time).

A profile's all-reduce line is NCCL's default on a full node: NVLS (in-switch reduction) on
H100, H200 and B200 nodes. Rows measured with NVLS turned off are left out for that reason; rows of
smaller groups, which NCCL runs as a ring, are kept and show what one line per link level costs.
Rows whose fabric has no built-in profile, or that measure a link rather than a collective, are
kept with the reason they are left out. A payload the source does not state (the GTC slides'
plateau figures) is priced at 8 GiB, where every profile's line has reached its bandwidth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from meshplan.cost_models.comm import GroupSpan, bus_factor, collective_time
from meshplan.cost_models.published import read_published_csv
from meshplan.profiles.registry import load_profile

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
PLATEAU_BYTES = 8 * UNITS["GiB"]
COLLECTIVES = {"all_reduce": "all_reduce", "all-reduce": "all_reduce", "all-gather": "all_gather",
               "reduce-scatter": "reduce_scatter"}


NVLS_OFF = "NVLS turned off (ring): the profile's all-reduce line is NCCL's default on a full node, NVLS"


@dataclass
class CollectiveRow:
    table: str
    label: str
    metric: str  # "time_us" | "busbw_gbs"
    published: float
    cluster: str | None = None
    collective: str = "all_reduce"
    payload_bytes: float = 0.0
    ranks: int = 8
    ranks_per_node: int = 8
    skipped: str | None = None

    def predict(self) -> float:
        span = GroupSpan(self.ranks, self.ranks_per_node)
        seconds = collective_time(load_profile(self.cluster), self.collective, self.payload_bytes, span)
        if self.metric == "time_us":
            return seconds * 1e6
        return bus_factor(self.collective, self.ranks) * self.payload_bytes / seconds / 1e9


def _bytes(text: str) -> int | None:
    m = re.match(r"\s*(\d+)\s*(B|KiB|MiB|GiB)\b", text)
    return int(m.group(1)) * UNITS[m.group(2)] if m else None


def dgx_h100_sweep_rows() -> list[CollectiveRow]:
    """nccl-tests all_reduce_perf on one DGX H100 (8 GPUs), every message size, out-of-place time."""
    table = "nccl-tests all_reduce, DGX H100 8 GPUs"
    return [CollectiveRow(table, f"{int(r['size (B)']):>12,} B", "time_us", float(r["out-of-place time (us)"]),
                          "h100-80g-dgx", "all_reduce", float(r["size (B)"]))
            for r in read_published_csv("comm_nccl_tests_allreduce_8xH100_single_node_dgxc.csv")]


def b200_node_rows() -> list[CollectiveRow]:
    """torch.distributed all_reduce on 8 B200 in one node and on 4 nodes of 8."""
    table = "all_reduce busbw, 8x B200 per node (torch all_reduce_bench)"
    rows = []
    for r in read_published_csv("comm_allreduce_busbw_b200_1node_vs_4nodes.csv"):
        size = _bytes(r["payload"])
        rows.append(CollectiveRow(table, f"{r['payload']} on 1 node", "busbw_gbs",
                                  float(r["1 node"].removesuffix("GBps")), "b200-180g-dgx", "all_reduce", size))
        rows.append(CollectiveRow(table, f"{r['payload']} on 4 nodes", "busbw_gbs",
                                  float(r["4 nodes"].removesuffix("GBps")),
                                  skipped="AWS EFA v4 between nodes (SRD), not the InfiniBand of the "
                                          "b200-180g-dgx profile: its latency differs"))
    return rows


def _point_cluster(system: str) -> str | None:
    if "H200" in system:
        return "h200-141g-dgx"
    if "B200" in system:
        return "b200-180g-dgx"  # NVLink 5 inside the node, as in a DGX B200
    return None


def measured_point_rows() -> list[CollectiveRow]:
    """Single-node collective measurements at a stated size and group size."""
    table = "measured collective points (H200, B200 nodes)"
    rows = []
    for r in read_published_csv("comm_measured_collective_points.csv"):
        bench, system = r["benchmark / collective"], r["system"]
        label = f"{r['GPUs']} GPUs, {r['payload']}, {r['algorithm']}: {bench} on {system}"
        kind = next((c for name, c in COLLECTIVES.items() if name in bench), None)
        size, cluster = _bytes(r["payload"]), _point_cluster(system)
        try:
            value = float(r["busbw or bandwidth (GB/s)"])
        except ValueError:
            value = None
        if kind is None:
            reason = "a link benchmark or a stated link bandwidth, not a collective"
        elif "NVLS_ENABLE=0" in bench:
            reason = NVLS_OFF
        elif size is None or value is None or not r["GPUs"].isdigit():
            reason = "guidance without a measured size or value"
        elif cluster is None:
            reason = "no built-in profile for this system"
        else:
            rows.append(CollectiveRow(table, label, "busbw_gbs", value, cluster, kind, size, int(r["GPUs"]),
                                      int(r["GPUs"])))
            continue
        rows.append(CollectiveRow(table, label, "busbw_gbs", 0.0, skipped=reason))
    return rows


# GTC slide configurations with a built-in profile of the same fabric and NCCL default algorithm.
GTC_FABRICS = {"NVLink3 (A100)": "a100-80g-dgx", "NVLink4 SHARP (H100)": "h100-80g-dgx",
               "NVLink5 SHARP (B200)": "b200-180g-dgx", "NVL3 + 8x 200Gb RDMA (DGX A100)": "a100-80g-dgx",
               "NVL4 + 8x 400Gb RDMA (DGX H100)": "h100-80g-dgx"}
GTC_RING = ("NVLink4 (H100)", "NVLink5 (B200)")  # the same nodes with NVLS off


def gtc_rows() -> list[CollectiveRow]:
    """NVIDIA GTC 2024/2025 slides: all_reduce bus bandwidth by fabric, 8 GPUs in a node or 32 over 4."""
    table = "NVIDIA GTC all_reduce busbw by fabric"
    rows = []
    for r in read_published_csv("comm_nvidia_gtc_nccl_allreduce_busbw.csv"):
        config, single = r["configuration"], r["scope"].startswith("Multi-GPU")
        label = f"{r['slide']} {config} ({'8 GPUs' if single else '32 GPUs, 8 per node'})"
        value = float(r["NCCL tests AllReduce bus bandwidth (GB/s)"])
        cluster = GTC_FABRICS.get(config)
        if cluster is None:
            if config in GTC_RING:
                reason = NVLS_OFF
            elif config == "NVLink (GB200 NVL72)":
                reason = "in sample: gb200-186g-nvl72's NVLink all-reduce line is this figure"
            elif "SHARP" in config:
                reason = "SHARP across nodes or an NVL72 rack: no built-in profile reduces in the network"
            else:
                reason = "no built-in profile for this fabric"
            rows.append(CollectiveRow(table, label, "busbw_gbs", value, skipped=reason))
            continue
        ranks = 8 if single else 32
        rows.append(CollectiveRow(table, label, "busbw_gbs", value, cluster, "all_reduce", PLATEAU_BYTES, ranks, 8))
    return rows


def collective_rows() -> list[CollectiveRow]:
    return dgx_h100_sweep_rows() + b200_node_rows() + measured_point_rows() + gtc_rows()


# Published tables that are not measurements of a run or a collective, and where they are used instead.
USED_ELSEWHERE = {
    "hw_peak_dense_tflops.csv": "datasheet peaks: the profiles' peak_tflops",
    "hw_memory_capacity_bandwidth.csv": "datasheet HBM size and bandwidth: the profiles' memory",
    "hw_measured_max_matmul_tflops_mamf.csv": "best-shape matmul microbenchmark: the profiles' matmul max_fraction",
    "hw_nvlink_generations.csv": "NVLink link rates: the profiles' links",
    "hw_internode_bandwidth_per_node.csv": "NIC rates per node: the profiles' network links",
    "korthikanti2022_activation_memory_formulas.csv": "formulas, reproduced exactly by tests/foundation",
    "korthikanti2022_table3_model_configs.csv": "the 22B configuration of Table 4's rows",
    "nvidia_model_flops_per_sample.csv": "FLOP counts, reproduced by tests/foundation",
    "moe_model_configs.csv": "MoE architectures: the built-in MoE models (specs/registry.py)",
    "attention_cudnn_sdpa.csv": "cuDNN's attention benchmark: the Blackwell profiles' attention points and the "
                                "H200's shape over lengths (tests/profiles/test_builtin_attention.py)",
}
