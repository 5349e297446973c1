"""IBM's fms-fsdp Llama 2 throughput tables (PyTorch FSDP1, A100 and H100) as published rows, the
network a page states, and gradients reduced in bf16, checked by hand."""

import csv
from dataclasses import replace
from pathlib import Path

import pytest

import meshplan
from meshplan.cost_models.comm import GroupSpan, collective_time
from meshplan.cost_models.constants import IBM_FMS
from meshplan.cost_models.estimate import ComputeWindows, data_parallel_comm, group_spans
from meshplan.cost_models.layout import layout_of
from meshplan.cost_models.published import IBM_OVERRIDES, ibm_fms_rows, llama2_spec
from meshplan.cost_models.validate import predict
from meshplan.profiles.registry import load_profile

CSV = Path(meshplan.__file__).parent / "data" / "published" / "ibm_fms_fsdp_llama2_throughput.csv"


def _csv() -> list[dict]:
    with open(CSV) as f:
        return list(csv.DictReader(f))


def test_the_pages_rows_become_the_layouts_they_ran():
    """16 rows (4 models x 2 GPUs x eager / compiled); the 4 of 13B, whose selective AC covers about 2
    blocks in 5 (HFU / MFU 1.07-1.16), are skipped; 7B is HSDP (8 GPUs a node shard, the nodes replicate),
    the rest FSDP over every GPU, no gradient accumulation, the page's network per GPU."""
    rows, printed = ibm_fms_rows(), _csv()
    assert len(rows) == len(printed) == 16 and all(r.table == IBM_FMS for r in rows)
    assert sorted(r.label for r in rows if r.skipped) == sorted(r.label for r in rows if "13b" in r.label)
    for row, r in zip(rows, printed):
        p = row.plan
        gpus = int(r["gpus"])
        assert (p.gpus, p.training.seq_len, p.training.micro_batch, p.training.global_batch) == (gpus, 4096, 2, 2 * gpus)
        if r["model"] == "7b":
            assert (p.parallel.dp_replicate, p.parallel.dp_shard) == (gpus // 8, 8)
        else:
            assert (p.parallel.dp_replicate, p.parallel.dp_shard) == (1, gpus)
        assert p.compile == (r["compile"] == "True")
        assert row.network_gbs_per_gpu == {"a100_80gb": 400 / 64, "h100_80gb": 800 / 64}[r["gpu"]]
        assert row.published == float(r["tokens_per_s_per_gpu"])
        if not row.skipped:
            assert p.memory.activation_checkpointing == ("none" if r["model"] == "7b" else "full")


def test_llama2_34b_is_fms_fsdps_shape():
    """fms-fsdp's llama2_34b: emb_dim 8192, 64 heads, 8 KV heads, 48 layers, FFN 22016, vocab 32000."""
    s = llama2_spec("34b")
    assert (s.dim, s.n_heads, s.n_kv_heads, s.n_layers, s.ffn_dim, s.vocab_size) == (8192, 64, 8, 48, 22016, 32000)
    per_layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 22016 + 2 * 8192
    assert s.num_params() == 48 * per_layer + 2 * 32000 * 8192 + 8192


def test_a_stated_network_scales_the_cross_node_collectives_alone():
    """400 Gb/s a node of 8 A100s is 6.25 GB/s a GPU, a quarter of the DGX profile's 25: a 1 GiB all-gather
    over 16 nodes' worth of ranks (one a node) takes the bandwidth term 4x longer, its latency the same; a
    node-local one does not change."""
    dgx = load_profile("a100-80g-dgx")
    slow = dgx.with_network_per_device(6.25)
    assert slow.link("network").bandwidth_gbs == 6.25 and slow.link("nvlink") == dgx.link("nvlink")
    across, inside = GroupSpan(16, 1), GroupSpan(8, 8)
    size = 2.0 ** 30
    fit = dgx.collectives["network"]["all_gather"]
    bw, lat = fit.line_for(size)
    # the latency: the larger of the profile's and NCCL's 15-step ring over the network (comm.nccl_latency_us)
    by_hand = max(lat, 8.4 + 15 * 14.0) * 1e-6 + (15 / 16) * size / (bw * 6.25 / 25.0 * 1e9)
    assert collective_time(slow, "all_gather", size, across) == pytest.approx(by_hand, rel=1e-12)
    assert collective_time(slow, "all_gather", size, inside) == collective_time(dgx, "all_gather", size, inside)


def test_bf16_gradient_reductions_move_half_the_bytes():
    """fms-fsdp reduces gradients in bf16 (its bfSixteen MixedPrecision): the FSDP reduce-scatter and the
    HSDP all-reduce carry 2 bytes a gradient where fp32 carries 4; the all-gathers do not change."""
    row = next(r for r in ibm_fms_rows() if r.label.startswith("Llama2-7b A100") and not r.plan.compile)
    prof = load_profile(row.plan.cluster).with_network_per_device(row.network_gbs_per_gpu)
    lay = replace(layout_of(row.plan), **IBM_OVERRIDES)
    assert lay.grad_reduce_bytes == 2.0
    spans = group_spans(lay, prof)
    bf16 = data_parallel_comm(lay, prof, spans, 0, ComputeWindows(1.0))
    fp32 = data_parallel_comm(replace(lay, grad_reduce_bytes=4.0), prof, spans, 0, ComputeWindows(1.0))
    assert bf16.all_gather == fp32.all_gather
    params = lay.spec.num_params()
    shard = params / 8
    # The replica all-reduce of each GPU's shard over the 16 nodes, every GPU of a node at once through its
    # share of the node's network (6.25 GB/s): its bandwidth term, by hand, per byte.
    fit = prof.collectives["network"]["all_reduce"]
    per_byte = 2 * 15 / 16 / (fit.line_for(shard * 4.0 / 33)[0] * 1e9)
    assert fp32.all_reduce - bf16.all_reduce == pytest.approx(shard * 2.0 * per_byte, rel=0.02)
    assert bf16.reduce_scatter < 0.55 * fp32.reduce_scatter


def test_the_rows_are_scored():
    """Every scored row predicts a positive throughput (the page's network and bf16 reductions applied)."""
    for row in ibm_fms_rows():
        if not row.skipped:
            value, est, _ = predict(row)
            assert 0 < value < 2 * row.published and est.fits
