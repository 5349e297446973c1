"""What the H100 MoE rows (moe_training_h100.csv, the MoE Parallel Folding paper) leave open, and what the grouped
GEMMs' form did to them: each scored row's TFLOP/s error as shipped, with Mixtral's pipeline at 1 virtual stage
(the model zoo's config at the paper's date; the rows take 7, its Mixtral-8x22B setting from 2025-07-30, since the
published strong scaling rules 1 out: tests/foundation/test_moe_h100_rows.py), and under the inverse-distance
weighting of grouped points that shipped before (forms.py grouped_shape weighted).
Nothing here is fitted or chosen: the shipped constants throughout.

    python benchmarks/moe_h100_sensitivity.py > benchmarks/results/moe_h100_sensitivity.txt
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost_models import forms
from meshplan.cost_models.published import PublishedRow, moe_h100_rows
from meshplan.cost_models.validate import predict


def with_virtual_stages(row: PublishedRow, v: int) -> PublishedRow:
    par = replace(row.plan.parallel, pp_virtual_stages=v, pp_schedule="Interleaved1F1B" if v > 1 else "1F1B")
    return replace(row, plan=replace(row.plan, parallel=par))


def error(row: PublishedRow) -> float:
    return predict(row)[0] / row.published - 1


def main() -> None:
    print("TFLOP/s error (predicted / published - 1) of the scored H100 MoE rows")
    print(f"{'row':48s} {'published':>9s} {'shipped':>8s} {'VP 1':>8s} {'weighted':>8s}")
    cols: dict[tuple[str, str], list[float]] = {}
    for row in moe_h100_rows():
        if row.skipped:
            continue
        rid = row.label.split("(")[-1].rstrip(")")
        shipped = error(row)
        vp1 = error(with_virtual_stages(row, 1)) if row.label.startswith("Mixtral") else None
        with forms.forms(grouped_shape="weighted"):
            weighted = error(row)
        model = row.label.split(" ")[0]
        for name, e in (("shipped", shipped), ("VP 1", vp1), ("weighted", weighted)):
            if e is not None:
                cols.setdefault((model, name), []).append(e)
        vp1_text = f"{vp1:+8.1%}" if vp1 is not None else f"{'':>8s}"
        print(f"{rid:48s} {row.published:9.1f} {shipped:+8.1%} {vp1_text} {weighted:+8.1%}")
    for (model, name), errs in cols.items():
        print(f"{model}, {name}: mean absolute error {sum(abs(e) for e in errs) / len(errs):.1%} over {len(errs)} rows")


if __name__ == "__main__":
    main()
