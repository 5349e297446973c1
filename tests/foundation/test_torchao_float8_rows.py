"""torchao's float8 training benchmarks (torchao/float8/README.md, 2025-03) as published rows: Llama 3 8B on 8 H100 run
by TorchTitan, FSDP 8, op-level SAC, compiled blocks, in bf16 and with tensorwise float8."""

from __future__ import annotations

import pytest

from meshplan.cost_models.constants import PROFILE_CONSTANTS, TORCHAO_FLOAT8
from meshplan.cost_models.published import read_published_csv, torchao_float8_rows
from meshplan.cost_models.validate import predict
from meshplan.specs.rules import TORCHTITAN


def test_the_printed_speedups_are_the_printed_tokens_per_second():
    """A transcription check: the README's speedup column is each row's tokens/s over the bf16 row's."""
    printed = read_published_csv("torchao_float8_training_h100.csv")
    base = float(printed[0]["median tokens/s per GPU"])
    assert base == 6150.0
    for r in printed[1:]:
        speedup = float(r["median tokens/s per GPU"]) / base - 1
        assert f"{100 * speedup:.2f}%" == r["speedup as printed"]


def test_rows_are_the_benchmark_scripts_runs():
    rows = torchao_float8_rows()
    assert [r.skipped is None for r in rows] == [True, True, False]
    assert "rowwise" in rows[2].skipped
    for row, float8 in zip(rows[:2], (False, True)):
        p = row.plan
        assert row.table == TORCHAO_FLOAT8 and p.cluster == "h100-96g-gt" and p.gpus == 8
        assert (p.parallel.dp_shard, p.parallel.tp, p.parallel.pp, p.parallel.cp) == (8, 1, 1, 1)
        # --training.batch_size=1 of 8192 tokens on each rank (float8_training_benchmark.sh, llama3_8b.toml)
        assert (p.training.micro_batch, p.training.global_batch, p.training.seq_len) == (1, 8, 8192)
        assert p.memory.activation_checkpointing == "selective" and p.memory.sac_ops is None and p.stack == TORCHTITAN
        assert p.memory.float8 is float8 and p.compile is True
        # TorchTitan's train.py of 2025-03 still left the loss uncompiled, its model still expanded K/V
        assert row.layout_overrides["compiles_loss"] is False and row.layout_overrides["kv_repeated"] is True
    assert [r.published for r in rows[:2]] == [6150.0, 7689.5]
    assert [r.published_memory_gib for r in rows[:2]] == [47.65, 47.77]


def test_float8_speedup_and_memory_against_the_readme():
    """The published figures, not the model's: float8 tensorwise ran 25.03 % faster than bf16 at the same memory
    (47.65 and 47.77 GiB). The model, fitted with these rows in the H100 rate but not on this ratio, prices the
    speed-up within 3 points and each peak within 3 %."""
    (bf16, est_bf16, _), (fp8, est_fp8, _) = [predict(r) for r in torchao_float8_rows()[:2]]
    assert fp8 / bf16 - 1 == pytest.approx(0.2503, abs=0.03)
    assert est_bf16.reserved_peak_gib == pytest.approx(47.65, rel=0.03)
    assert est_fp8.reserved_peak_gib == pytest.approx(47.77, rel=0.03)


def test_the_rows_feed_the_h100_rate_and_the_allocator_slack():
    by_name = {c.name: c for c in PROFILE_CONSTANTS}
    assert any(TORCHAO_FLOAT8 in tables for tables in by_name["device.sustained_fraction"].fitted_on.values())
    assert any(TORCHAO_FLOAT8 in tables for tables in by_name["overheads.memory_fragmentation"].fitted_on.values())


def test_the_b200_rows_are_scored_on_memory_alone_and_fit_nothing():
    """torchao's B200 runs (2025-08, power-limited to a cap not printed): memory-only rows, TorchTitan's compiled
    loss (the stack's default) and repeat_kv, in no constant's fit, counted as published rows, not the runtime's."""
    from meshplan.cost_models.constants import RUNTIME_RUNS, TORCHAO_B200
    from meshplan.cost_models.crossval import _memory_rows_text
    from meshplan.cost_models.published import MEMORY_ONLY, all_training_rows, torchao_b200_memory_rows

    rows = torchao_b200_memory_rows()
    scored = [r for r in rows if not r.skipped]
    assert [r.plan.memory.float8 for r in scored] == [False, True] and len(rows) == 5
    assert all("not a" in r.skipped for r in rows if r.skipped)  # MXFP8 and rowwise: recipes not priced
    for r in scored:
        assert r.table == TORCHAO_B200 and r.metric == MEMORY_ONLY and r.published == r.published_memory_gib
        assert r.plan.cluster == "b200-180g-dgx" and r.layout_overrides == {"kv_repeated": True}
    assert [r.published for r in scored] == [33.71, 33.38]
    assert not any(TORCHAO_B200 in tables for c in PROFILE_CONSTANTS for tables in c.fitted_on.values())
    memory = [r for r in all_training_rows() if not r.skipped]
    own = sum(r.table == RUNTIME_RUNS for r in memory)
    published = sum(r.published_memory_gib is not None for r in memory) - own
    assert _memory_rows_text(memory) == f"{published} published, {own} of the runtime's own runs" and own == 8
