"""A property of the published pipelined rows themselves, with no cost model: of two runs of one layout that
differ only in how many micro-batches a step pushes through each pipeline (global batch or data-parallel
degree), the one with fewer cannot beat the other's rate with its bubble taken away. The same micro-batch
costs the same; more data-parallel ranks add traffic, never take it away; and an (interleaved) 1F1B
pipeline of p stages and v virtual stages idles (p - 1) / v micro-batch times a step (Narayanan et al.
2021). A row that breaks this was encoded with the wrong pipeline: the check found Mixtral-8x22B's H100
rows at one virtual stage (tests/foundation/test_moe_h100_rows.py)."""

from __future__ import annotations

from collections import defaultdict

from meshplan.cost_models.published import MEMORY_ONLY, PublishedRow, all_training_rows


def _micro_batches(row: PublishedRow) -> int:
    p = row.plan
    return p.training.global_batch // (p.parallel.dp() * p.training.micro_batch)


def _layout_key(row: PublishedRow) -> tuple:
    p, par = row.plan, row.plan.parallel
    return (row.table, p.cluster, p.model.name, p.training.seq_len, p.training.micro_batch, p.memory.float8,
            par.tp, par.pp, par.pp_virtual_stages, par.ep, par.cp)


def pipelined_groups() -> dict[tuple, list[PublishedRow]]:
    """Scored throughput rows with a pipeline and a stated micro-batch, by layout."""
    groups: dict[tuple, list[PublishedRow]] = defaultdict(list)
    for row in all_training_rows():
        if row.skipped or row.plan is None or row.metric.startswith("layer_") or row.metric == MEMORY_ONLY:
            continue
        if row.plan.parallel.pp > 1 and row.plan.training.micro_batch != "auto":
            groups[_layout_key(row)].append(row)
    return groups


def bubble_bound(rate: float, m: int, fewer: int, pp: int, vp: int) -> float:
    """The most a run of `fewer` micro-batches can reach, given `rate` at `m` (see the module doc)."""
    bubble = (pp - 1) / vp
    return rate * (m + bubble) / m * fewer / (fewer + bubble)


def test_the_bound_by_hand():
    """8 stages, one virtual stage: at 128 micro-batches 516.5 is 516.5 x 135/128 = 544.7 bubble-free, and at
    16 a bubble of 7 leaves 16/23 of that."""
    assert abs(bubble_bound(516.5, 128, 16, pp=8, vp=1) - 516.5 * 135 / 128 * 16 / 23) < 1e-9
    assert bubble_bound(500.0, 64, 64, pp=4, vp=2) == 500.0


def test_no_published_pipelined_row_beats_its_bubble():
    groups = [g for g in pipelined_groups().values() if len({_micro_batches(r) for r in g}) > 1]
    assert len(groups) >= 3  # Mixtral and Qwen2 on H100, DeepSeek-V3 on B200 at two global batches
    for rows in groups:
        most = max(rows, key=_micro_batches)
        m = _micro_batches(most)
        for row in rows:
            par = row.plan.parallel
            bound = bubble_bound(most.published, m, _micro_batches(row), par.pp, par.pp_virtual_stages)
            assert row.published <= bound * (1 + 1e-9), (row.label, row.published, bound)
