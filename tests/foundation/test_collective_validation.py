"""Collectives against published measurements, and every published table accounted for."""

from importlib import resources

import pytest

from meshplan.cost_models.comm import bus_factor
from meshplan.cost_models.published_comm import (
    USED_ELSEWHERE, b200_node_rows, collective_rows, dgx_h100_sweep_rows, gtc_rows, measured_point_rows)
from meshplan.cost_models.validate import validation_results
from meshplan.profiles.fit import collective_entry
from meshplan.profiles.registry import load_profile

RUN_TABLES = {"narayanan2021_megatron_weak_scaling.csv", "korthikanti2022_table4_per_layer_time_22B.csv",
              "torchtitan_llama31_h100_2024-12.csv", "moe_training_blackwell.csv", "moe_training_h100.csv",
              "mosaicml_llmfoundry_mpt_throughput.csv", "ibm_fms_fsdp_llama2_throughput.csv",
              "olmo_core_throughput.csv", "torchtitan_performance_doc_2024.csv", "torchao_float8_training_h100.csv",
              "torchao_mx_training_b200.csv"}
COLLECTIVE_TABLES = {"comm_nccl_tests_allreduce_8xH100_single_node_dgxc.csv",
                     "comm_allreduce_busbw_b200_1node_vs_4nodes.csv", "comm_measured_collective_points.csv",
                     "comm_nvidia_gtc_nccl_allreduce_busbw.csv"}


def test_every_shipped_table_is_validated_or_says_where_it_is_used():
    shipped = {f.name for f in resources.files("meshplan.data.published").iterdir() if f.name.endswith(".csv")}
    assert shipped == RUN_TABLES | COLLECTIVE_TABLES | set(USED_ELSEWHERE)
    assert not (RUN_TABLES | COLLECTIVE_TABLES) & set(USED_ELSEWHERE)


def test_rows_and_reasons():
    assert len(dgx_h100_sweep_rows()) == 32
    b200 = b200_node_rows()
    assert len(b200) == 40 and sum(r.skipped is None for r in b200) == 20
    points = measured_point_rows()
    assert sum(r.skipped is None for r in points) == 14
    assert all(any(w in r.skipped for w in ("link", "guidance", "NVLS turned off")) for r in points if r.skipped)
    assert [r.label for r in points if r.skipped and "NVLS" in r.skipped] == \
        ["8 GPUs, 16GiB, Ring: nccl-tests all-reduce, NCCL_NVLS_ENABLE=0 on 8x H200 node (NVLink 4)"]
    gtc = gtc_rows()
    assert sum(r.skipped is None for r in gtc) == 9
    # the ring figures of nodes whose profile line is NCCL's default (NVLS) are left out, SHARP kept
    assert {r.label for r in gtc if r.skipped and "NVLS" in r.skipped} == {
        "GTC24 NVLink4 (H100) (8 GPUs)", "GTC25 NVLink4 (H100) (8 GPUs)", "GTC25 NVLink5 (B200) (8 GPUs)"}
    assert len({(r.table, r.label) for r in collective_rows()}) == len(collective_rows())


def test_busbw_prediction_by_hand():
    # an all-gather of 16 GiB on 8 H200: 7/8 of 16 GiB at the profile's 361 GB/s plus 15 us of latency
    row = next(r for r in measured_point_rows() if r.collective == "all_gather")
    seconds = 15e-6 + 7 / 8 * 16 * 2**30 / 361e9
    assert row.predict() == pytest.approx(7 / 8 * 16 * 2**30 / seconds / 1e9, rel=1e-3)
    assert row.predict() == pytest.approx(361.4, rel=0.01)


def test_bus_factor_rejects_unknown_collectives():
    assert bus_factor("all_reduce", 4) == 1.5 and bus_factor("send_recv", 2) == 1.0
    with pytest.raises(ValueError):
        bus_factor("allreduce", 4)


def test_refitted_small_message_line_is_latency_not_bandwidth():
    """Flat small-message times (a latency floor) must not become a line faster than large messages."""
    sizes = [2.0 ** k for k in range(10, 31)]
    effective = [s * bus_factor("all_reduce", 8) for s in sizes]
    # 50 us floor below 1 MiB; 100 GB/s from 1 to 16 MiB; 500 GB/s above, plus 100 us
    times = [50e-6 if s < 2**20 else (20e-6 + x / 100e9 if s < 2**24 else 100e-6 + x / 500e9)
             for s, x in zip(sizes, effective)]
    entry, _ = collective_entry(sizes, effective, times)
    assert len(entry["segments"]) == 2
    assert entry["bus_bandwidth_gbs"] <= entry["segments"][0]["bus_bandwidth_gbs"]
    assert entry["latency_us"] == pytest.approx(50, rel=0.2)


@pytest.mark.parametrize("rows,cluster", [(dgx_h100_sweep_rows, "h100-80g-dgx"), (b200_node_rows, "b200-180g-dgx")])
def test_builtin_all_reduce_is_profile_clusters_fit_of_the_sweep(rows, cluster):
    """The built-in line is what profile-cluster's fit writes for the published sweep, and follows it."""
    sweep = [r for r in rows() if not r.skipped]
    nbytes = [r.payload_bytes for r in sweep]
    effective = [b * bus_factor("all_reduce", 8) for b in nbytes]
    if sweep[0].metric == "time_us":
        times = [r.published * 1e-6 for r in sweep]
    else:
        times = [e / (r.published * 1e9) for e, r in zip(effective, sweep)]
    entry, _ = collective_entry(nbytes, effective, times)
    fit = load_profile(cluster).collectives["nvlink"]["all_reduce"]
    assert (fit.bus_bandwidth_gbs, fit.latency_us) == (entry["bus_bandwidth_gbs"], entry["latency_us"])
    assert [(s.min_bytes, s.bus_bandwidth_gbs, s.latency_us) for s in fit.segments] == \
        [(s["min_bytes"], s["bus_bandwidth_gbs"], s["latency_us"]) for s in entry["segments"]]
    for r in sweep:  # two lines over >= 1 MiB cannot follow every bump of a torch-level sweep: 20 %
        if r.payload_bytes >= 1 << 20:
            assert abs(r.predict() / r.published - 1) <= 0.20, r.label


def test_collective_tables_in_validate():
    results = [r for r in validation_results() if "error" in r and r["metric"] in ("time_us", "busbw_gbs")]
    assert len(results) == sum(not r.skipped for r in collective_rows())
    by_table: dict[str, list[float]] = {}
    for r in results:
        by_table.setdefault(r["table"], []).append(abs(r["error"]))
    for table, errors in by_table.items():
        assert sum(errors) / len(errors) <= 0.12, table
