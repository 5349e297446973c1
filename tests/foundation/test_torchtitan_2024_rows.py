"""TorchTitan's performance page of 2024-08 (its 405B on 128 H100; Llama 3 and Llama 2 on 64 A100) as
published rows: the layouts its configs ran, the shapes and lengths its printed MFU implies, and the fused
RMSNorm its small models ran, each checked by hand."""

import csv
from dataclasses import replace
from pathlib import Path

import meshplan
from meshplan.cost_models import constants
from meshplan.cost_models.constants import TORCHTITAN_DOC_2024, TORCHTITAN_DOC_2024_H100
from meshplan.cost_models.crossval import source_of
from meshplan.cost_models.layout import layout_of
from meshplan.cost_models.published import torchtitan_doc_2024_rows
from meshplan.cost_models.timing import _pytorch_elementwise_bytes
from meshplan.specs.rules import TORCHTITAN

CSV = Path(meshplan.__file__).parent / "data" / "published" / "torchtitan_performance_doc_2024.csv"


def _csv() -> list[dict]:
    with open(CSV) as f:
        return list(csv.DictReader(f))


def test_the_pages_rows_become_the_layouts_its_configs_ran():
    """Table 1: FSDP 16 x TP 8 (SP) over 128 H100 at local batch 2 of 8192 tokens (global 32), full AC,
    compiled, float8, async TP in its last row alone; its 'None' row left out (not printed whether it
    compiled). Tables 2 and 3: FSDP over 64 A100, eager; the 'selective layer' rows left out."""
    rows = torchtitan_doc_2024_rows()
    assert len(rows) == len(_csv()) == 11 and all(r.plan.stack == TORCHTITAN for r in rows)
    assert [r.published for r in rows if not r.skipped] == [177, 185, 2973, 331, 2162, 1904, 355, 353]
    assert [i for i, r in enumerate(rows) if r.skipped] == [0, 3, 7]
    for row in rows[:3]:
        p = row.plan
        assert (p.cluster, p.gpus, p.parallel.dp_shard, p.parallel.tp, p.parallel.sequence_parallel) == (
            "h100-96g-gt", 128, 16, 8, True)
        assert (p.training.seq_len, p.training.micro_batch, p.training.global_batch) == (8192, 2, 32)
        assert p.memory.activation_checkpointing == "full" and row.table == TORCHTITAN_DOC_2024_H100
    assert [r.plan.compile for r in rows[1:3]] == [True, True] and not rows[0].plan.compile
    assert [r.plan.memory.float8 for r in rows[:3]] == [False, True, True]
    assert [r.plan.parallel.async_tp for r in rows[:3]] == [False, False, True]
    for row in rows[3:]:
        p = row.plan
        assert (p.cluster, p.gpus, p.parallel.dp_shard, p.parallel.tp) == ("a100-80g-dgx", 64, 64, 1)
        assert not p.compile and not p.memory.float8
    assert [r.plan.memory.activation_checkpointing for r in rows[3:]] == [
        "selective", "selective", "full", "none", "selective", "selective", "selective", "full"]
    assert [r.plan.training.micro_batch for r in rows[3:]] == [1, 1, 1, 2, 2, 2, 1, 2]


def test_the_printed_mfu_follows_from_each_rows_shape_and_length():
    """TorchTitan's MFU of the day: (6 x parameters + 12 x layers x dim x seq) x tokens/s over the dense bf16
    peak (312 TFLOP/s on A100, 989 on H100; twice that for its float8 rows). Its April 2024 train.py counted
    every parameter, its August one left the token embedding out (get_num_params(exclude_embedding=True),
    9515a140b). Every printed figure, the rows left out too, within 0.2 points: the models and lengths are
    those the page ran."""
    for row, r in zip(torchtitan_doc_2024_rows(), _csv()):
        spec, seq = row.plan.model, row.plan.training.seq_len
        h100 = row.plan.cluster == "h100-96g-gt"
        params = spec.num_params() - (spec.vocab_size * spec.dim if h100 else 0)
        peak = (989e12 if h100 else 312e12) * (2 if "Float8" in r["techniques"] else 1)
        mfu = 100 * float(r["TPS/GPU"]) * (6 * params + 12 * spec.n_layers * spec.dim * seq) / peak
        assert abs(mfu - float(r["MFU as printed"].rstrip("%"))) < 0.2, (r["model"], mfu)


def test_a_fused_rmsnorm_moves_two_passes_where_the_composite_moves_twenty():
    """Llama 3 8B, one micro-batch of 8192 tokens in bf16: the two norms of a block move 2 x 4096 elements a
    token, 20 passes each as eager fp32 ops, 2 as one kernel: 8192 x 2 x 4096 x (20 - 2) x 2 bytes less."""
    row = next(r for r in torchtitan_doc_2024_rows() if "8B" in r.label and not r.skipped)
    fused = replace(layout_of(row.plan), **row.layout_overrides)
    assert fused.norm_kernel == "fused"
    composite = fused.with_(norm_kernel="composite")
    saved = _pytorch_elementwise_bytes(composite, 0) - _pytorch_elementwise_bytes(fused, 0)
    assert saved == 8192 * 2 * 4096 * (20 - 2) * 2


def test_only_the_runs_whose_config_names_the_fused_kernel_run_it():
    """llama3_8b.toml and llama_13b.toml set norm_type fused_rmsnorm; the 70B configs rmsnorm (TorchTitan's
    fused kernel did not run with TP then), as did the 405B one."""
    fused = {r.label.split(" | ")[0] for r in torchtitan_doc_2024_rows() if r.layout_overrides["norm_kernel"] == "fused"}
    assert fused == {"Table 2: Llama 3 8B", "Table 3: Llama 2 13B"}


def test_async_tps_share_is_fitted_on_two_pages():
    """The async-TP share rests on two A/B pairs: the December tables' Table 4 and this page's Table 1, two
    sources as crossval counts them (a leave-one-source-out fold leaves either)."""
    tables = constants.profile_constant("overheads.tp_async_overlap").fitted_on["h100-96g-gt"]
    assert {source_of(t) for t in tables} == {"TorchTitan H100", TORCHTITAN_DOC_2024}


def test_the_memory_model_puts_the_pages_out_of_memory_run_over_the_a100():
    """The page's first version (528cab939, 2024-04-16) printed OOM for Llama 2 70B at local batch 2 with
    selective op AC on the 80 GB A100s, and ran it at batch 1 and, with full AC, at batch 2 (its footnote).
    The estimate agrees on all three: over the part's usable memory at batch 2, under it otherwise."""
    from meshplan.cost_models.estimate import estimate_plan
    from meshplan.profiles.registry import load_profile

    prof = load_profile("a100-80g-dgx")
    rows = {r.plan.memory.activation_checkpointing: r for r in torchtitan_doc_2024_rows() if "Llama 2 70B" in r.label}

    def fits(row, micro_batch: int) -> bool:
        plan = row.plan.copy()
        plan.training = replace(plan.training, micro_batch=micro_batch, global_batch=micro_batch * 64)
        return estimate_plan(plan, prof, **row.layout_overrides).fits

    assert fits(rows["selective"], 1) and fits(rows["full"], 2)
    assert not fits(rows["selective"], 2)
