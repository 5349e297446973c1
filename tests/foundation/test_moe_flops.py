"""Model FLOPs of mixture-of-experts models: what one token runs (its active experts), checked by hand
and against Megatron-Bridge's performance summaries, whose TFLOP/s per GPU over tokens/s per GPU is
the FLOPs per token Megatron-Core counts (causal attention at half, sliding windows capped)."""

from __future__ import annotations

import csv
import io
import statistics
from importlib import resources

import pytest

from meshplan.cost_models.flops import model_flops_per_token
from meshplan.specs.registry import BUILTIN_MODELS

PUBLISHED = "moe_training_blackwell.csv"  # meshplan/data/published, a copy of ../shared/data/published
NAMES = {"Qwen3-30B-A3B": "qwen3-30b-a3b", "Qwen3-235B-A22B": "qwen3-235b-a22b", "GPT-OSS-120B": "gpt-oss-120b",
         "DeepSeek-V3": "deepseek-v3"}


def test_qwen3_30b_a3b_by_hand():
    d, layers, heads, hd, s = 2048, 48, 32, 128, 4096
    attention_proj = d * heads * hd + 2 * d * 4 * hd + heads * hd * d  # q, k, v (4 KV heads), o
    experts = (8 * 3 * d * 768) + d * 128  # 8 of 128 SwiGLU experts of 768, and the router
    logits = d * 151936
    matmul = 2 * (layers * (attention_proj + experts) + logits)
    attention = layers * 2 * s * heads * 2 * hd / 2  # q.k and p.v over half the keys on average
    assert model_flops_per_token(BUILTIN_MODELS["qwen3-30b-a3b"], s, causal=True) == pytest.approx(
        3 * (matmul + attention), rel=1e-12)


def megatron_rows() -> dict[str, list[float]]:
    """Megatron-Bridge's FLOPs per token by model. GPT-OSS from the 26.06 containers on: earlier ones
    counted its experts as two matrices instead of SwiGLU's three (27.2 against 32.6 GFLOP at seq
    4096 for the same model). DeepSeek-V3 from the rows labelled without MTP, which the spec leaves out."""
    out: dict[str, list[float]] = {}
    text = resources.files("meshplan.data.published").joinpath(PUBLISHED).read_text()
    for r in csv.DictReader(io.StringIO(text)):
        name = NAMES.get(r["model"])
        if not name or not r["tflops_per_gpu"] or not r["tokens_per_s_per_gpu"] or r["seq_len"] != "4096":
            continue
        if name == "deepseek-v3" and not r["id"].endswith("-nomtp"):
            continue
        if name == "gpt-oss-120b" and not any(v in r["source_version"] for v in ("26.06", "26.08")):
            continue
        out.setdefault(name, []).append(float(r["tflops_per_gpu"]) * 1e12 / float(r["tokens_per_s_per_gpu"]))
    return out


def test_active_flops_per_token_match_megatron_bridge():
    rows = megatron_rows()
    assert sorted(rows) == sorted(NAMES.values())
    for name, figures in rows.items():
        ours = model_flops_per_token(BUILTIN_MODELS[name], 4096, causal=True)
        # The summaries print 3-4 significant digits of each figure: the median of the rows, within 1 %.
        assert ours == pytest.approx(statistics.median(figures), rel=0.01), (name, ours, figures)


def test_dense_models_are_counted_as_before():
    """One block kind: the per-block count times the layers, as the dense convention always was."""
    m = BUILTIN_MODELS["llama3-8b"]
    d, kv, f, s = 4096, 1024, 14336, 8192
    block = 2 * (d * d + 2 * d * kv + d * d + 3 * d * f)
    attention = 4 * s * d  # no causal halving in the dense convention
    assert model_flops_per_token(m, s) == pytest.approx(3 * (32 * (block + attention) + 2 * d * 128256), rel=1e-12)
