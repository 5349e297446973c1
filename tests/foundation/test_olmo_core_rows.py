"""AI2 OLMo-core's throughput table (H100, FSDP2 + torch.compile, BF16 and float8) as published rows:
the layouts its scripts ran and the model shapes its TransformerConfig built, checked by hand."""

import csv
from dataclasses import replace
from pathlib import Path

import meshplan
from meshplan.cost_models.constants import OLMO_CORE, PROFILE_CONSTANTS
from meshplan.cost_models.layout import layout_of
from meshplan.cost_models.published import OLMO_CORE_OVERRIDES, olmo_core_rows
from meshplan.specs.rules import TORCHTITAN

CSV = Path(meshplan.__file__).parent / "data" / "published" / "olmo_core_throughput.csv"


def _csv() -> list[dict]:
    with open(CSV) as f:
        return list(csv.DictReader(f))


def test_the_tables_rows_become_the_layouts_the_scripts_ran():
    """8 rows (1B, 7B, Llama 8B, 13B, each BF16 and float8), seq 4096; the scripts' rank micro-batches (8, 2, 2
    and 1 sequences of 4096 tokens) and global batches (1024 sequences, 2048 for the 13B) over 8 GPUs of FSDP,
    compiled, no activation checkpointing, float8 where the row passes float8_config.enabled=true."""
    rows, printed = olmo_core_rows(), _csv()
    assert len(rows) == len(printed) == 8 and all(r.table == OLMO_CORE and not r.skipped for r in rows)
    micro = {"1B": 8, "7B": 2, "8B": 2, "13B": 1}
    for row, r in zip(rows, printed):
        p = row.plan
        assert (p.gpus, p.training.seq_len, p.training.micro_batch) == (8, 4096, micro[r["model_size"]])
        assert p.training.global_batch == (2048 if r["model_size"] == "13B" else 1024)
        assert (p.parallel.dp_shard, p.parallel.dp_replicate, p.parallel.tp, p.parallel.pp) == (8, 1, 1, 1)
        assert p.compile and p.memory.activation_checkpointing == "none" and p.memory.reshard_after_forward
        assert p.memory.float8 == (r["precision"] == "BF16/FP8")
        assert p.stack == TORCHTITAN and row.published == float(r["tokens_per_s_per_gpu"])
    assert [r.published for r in rows] == [55000, 65000, 10000, 13000, 9500, 12500, 4600, 5500]


def test_olmo2_7b_has_the_parameters_of_its_shape():
    """OLMo 2 7B as OLMo-core built it: 32 layers of 4096, MHA (32 heads), SwiGLU 11008 (8/3 x 4096 rounded
    up to 256), untied embeddings over dolma2's 100278 tokens padded to 100352: 32 x (4 x 4096^2 + 3 x 4096
    x 11008) + 2 x 100352 x 4096 = 7,298,088,960 matrix parameters, plus the norms."""
    spec = next(r for r in olmo_core_rows() if r.label.startswith("7B")).plan.model
    assert (spec.dim, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.ffn_dim, spec.vocab_size) == (
        4096, 32, 32, 32, 11008, 100352)
    assert spec.qk_norm and not spec.tied_embeddings
    matrices = 32 * (4 * 4096 ** 2 + 3 * 4096 * 11008) + 2 * 100352 * 4096
    assert matrices == 7_298_088_960
    assert 0 <= spec.num_params() - matrices < 32 * 4 * 4096 + 4096  # per-layer norms and the final one


def test_llama_8b_keeps_llama3s_shape_with_olmos_vocabulary():
    """Llama3-8B in OLMo-core: hidden 14336 (8/3 x 4096 x 1.3 rounded up to 1024), 8 KV heads, no q/k
    norm, the dolma2 vocabulary (100352) instead of Llama 3's 128256."""
    spec = next(r for r in olmo_core_rows() if r.label.startswith("8B")).plan.model
    assert (spec.ffn_dim, spec.n_kv_heads, spec.qk_norm, spec.vocab_size) == (14336, 8, False, 100352)
    assert 1024 * -(-int(1.3 * int(8 * 4096 / 3)) // 1024) == 14336


def test_the_rows_run_fused_adamw_and_flash_attention():
    """Every script builds AdamWConfig(fused=True): one fused kernel, not torch.optim's foreach passes."""
    row = olmo_core_rows()[0]
    lay = replace(layout_of(row.plan), **row.layout_overrides)
    assert row.layout_overrides == OLMO_CORE_OVERRIDES
    assert not lay.optimizer_foreach and lay.attention_kernel == "flash" and lay.compiles_loss
    assert lay.grad_sync == "every_microbatch" and lay.grad_reduce_bytes == 4.0


def test_the_h100_rate_is_fitted_on_them_too():
    sustained = next(c for c in PROFILE_CONSTANTS if c.name == "device.sustained_fraction")
    assert any(OLMO_CORE in tables for tables in sustained.fitted_on.values())
