"""MosaicML's llm-foundry MPT throughput table (PyTorch FSDP1 through Composer) as published rows, and the
eager GPT block it runs (ATen's one-kernel LayerNorm and GELU), priced by hand."""

import csv
from dataclasses import replace
from pathlib import Path

import pytest

import meshplan
from meshplan.cost_models.compute import attention_tflops, memory_bound_time
from meshplan.cost_models.flops import attention_flops_per_token
from meshplan.cost_models.layout import layout_of
from meshplan.cost_models.published import LLMFOUNDRY_OVERRIDES, llmfoundry_rows, mpt_spec
from meshplan.cost_models.timing import block_compute, elementwise_times
from meshplan.profiles.registry import load_profile

CSV = Path(meshplan.__file__).parent / "data" / "published" / "mosaicml_llmfoundry_mpt_throughput.csv"


def _csv() -> list[dict]:
    with open(CSV) as f:
        return list(csv.DictReader(f))


def test_mpt_specs_have_the_pages_parameter_count():
    """The page's NumParams column, every row: the sizes' (d_model, heads, layers) with learned positions
    over the row's sequence length and tied embeddings give it to the parameter."""
    for r in _csv():
        assert mpt_spec(r["model"], int(r["seq_len"])).num_params() == int(r["num_params"]), r


def test_every_row_is_scored_or_says_why_not():
    """216 rows on the page: A100 40GB (78, no profile) and Transformer Engine FP8 (7) are skipped, the
    70 H100 and 61 A100 80GB bf16 rows are scored; the plan is the row's as printed."""
    rows, printed = llmfoundry_rows(), _csv()
    assert len(rows) == len(printed) == 216
    skipped = [r.skipped for r in rows if r.skipped]
    assert sum("a100_40gb" in s for s in skipped) == 78 and sum("FP8" in s for s in skipped) == 7
    assert len(skipped) == 85
    for row, r in zip(rows, printed):
        p = row.plan
        assert (p.gpus, p.training.seq_len, p.training.micro_batch, p.training.global_batch) == \
            (int(r["gpus"]), int(r["seq_len"]), int(r["micro_batch"]), int(r["global_batch"]))
        assert p.parallel.dp_shard == p.gpus and p.parallel.tp == p.parallel.pp == 1
        assert p.memory.reshard_after_forward == (r["sharding"] == "FULL_SHARD")
        assert (p.memory.activation_checkpointing == "full") == (r["activation_checkpointing"] == "True")
        assert row.published == float(r["tokens_per_s_per_gpu"])


def test_eager_gpt_block_elementwise_by_hand():
    """Per token, forward: LayerNorm 2 passes x2, residual add 3 x2 (on d), GELU 2 (on 4d), the attention
    output's copy 2 (on d); backward 3 x2, 3 x2, 3 and 2. Under TP the FFN and attention widths split."""
    spec = mpt_spec("7b", 2048)
    d, f = spec.dim, spec.ffn_dim
    h100 = load_profile("h100-80g-dgx")
    for row in llmfoundry_rows():
        if row.plan.model.name == "mpt-7b" and row.plan.training.seq_len == 2048 and not row.skipped:
            break
    lay = replace(layout_of(row.plan), **LLMFOUNDRY_OVERRIDES)
    tokens = lay.micro_batch * 2048
    fwd = (2 * 2 + 2 * 3) * d + 2 * f + 2 * d
    bwd = (2 * 3 + 2 * 3) * d + 3 * f + 2 * d
    got = elementwise_times(lay, h100)
    assert got[0] == pytest.approx(memory_bound_time(h100.device, fwd * tokens * 2), rel=1e-12)
    assert got[1] == pytest.approx(memory_bound_time(h100.device, bwd * tokens * 2), rel=1e-12)
    tp2 = replace(lay, tp=2, sp=False)
    fwd2 = (2 * 2 + 2 * 3) * d + 2 * f / 2 + 2 * d / 2
    assert elementwise_times(tp2, h100)[0] == pytest.approx(memory_bound_time(h100.device, fwd2 * tokens * 2),
                                                            rel=1e-12)


def test_mpt_attention_runs_the_triton_kernel_at_the_papers_ratio_to_flashattention2():
    """MPT's benchmark runs used attn_impl triton (submit_benchmarks.py's default when the tables were made):
    its causal attention is priced by hand as the profile's FlashAttention-2 rate at the sequence and head
    size, times the FlashAttention-2 paper's ratio (1.3), with nothing else in the block changed."""
    assert LLMFOUNDRY_OVERRIDES["attention_kernel"] == "triton"
    h100 = load_profile("h100-80g-dgx")
    row = next(r for r in llmfoundry_rows() if r.plan.model.name == "mpt-1b" and r.plan.training.seq_len == 8192)
    lay = replace(layout_of(row.plan), **LLMFOUNDRY_OVERRIDES)
    s, spec = 8192, row.plan.model
    # Causal: a query sees s / 2 keys on average; 4 FLOPs per key and head dimension (QK^T and PV), one block.
    flops = 4 * (s / 2) * spec.n_heads * spec.head_dim * lay.micro_batch * s
    assert attention_flops_per_token(spec, s, causal=True) * lay.micro_batch * s == pytest.approx(flops, rel=1e-9)
    fa2_fwd = flops / (attention_tflops(h100.device, s, "bf16", spec.head_dim) * 1e12)
    fa2_bwd = 2.5 * flops / (attention_tflops(h100.device, s, "bf16", spec.head_dim, backward=True) * 1e12)
    triton = block_compute(lay, h100)
    flash = block_compute(replace(lay, attention_kernel="flash"), h100)
    assert flash.attention_forward == pytest.approx(fa2_fwd, rel=1e-9)
    assert triton.attention_forward == pytest.approx(1.3 * fa2_fwd, rel=1e-9)
    assert triton.attention_backward == pytest.approx(1.3 * fa2_bwd, rel=1e-9)
    assert triton.matmul_by_kind == flash.matmul_by_kind
    assert (triton.elementwise_forward, triton.elementwise_backward) == (flash.elementwise_forward,
                                                                         flash.elementwise_backward)


def test_every_scored_run_fits_its_gpu():
    """Each row is a run that completed on 80 GB GPUs, at the largest micro-batch the page's sweep found to
    fit: the model must not price any of them over the GPU's memory. Before flash-attn's loss and the
    metric phase were priced (eager fp32 cross-entropy buffers, 14 bytes a logit at the backward's start),
    39 of the 131 did not fit (at 83d76e3)."""
    from meshplan.cost_models.validate import predict

    scored = [r for r in llmfoundry_rows() if not r.skipped]
    over = [r.label for r in scored if not predict(r)[1].fits]
    assert len(scored) == 131 and over == []
