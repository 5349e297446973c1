"""What the H100 MoE rows (moe_training_h100.csv, the MoE Parallel Folding paper) leave open, and what the grouped
GEMMs' form did to them: each scored row's TFLOP/s error as shipped, with Mixtral's pipeline at 7 virtual stages
(the model zoo's Mixtral-8x22B setting from 2025-07-30; the paper's date's config, which the rows take, has 1),
and under the inverse-distance weighting of grouped points that shipped before (forms.py grouped_shape weighted).
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
    print(f"{'row':48s} {'published':>9s} {'shipped':>8s} {'VP 7':>8s} {'weighted':>8s}")
    cols: dict[tuple[str, str], list[float]] = {}
    for row in moe_h100_rows():
        if row.skipped:
            continue
        rid = row.label.split("(")[-1].rstrip(")")
        shipped = error(row)
        vp7 = error(with_virtual_stages(row, 7)) if row.plan.parallel.pp_virtual_stages == 1 else None
        with forms.forms(grouped_shape="weighted"):
            weighted = error(row)
        model = row.label.split(" ")[0]
        for name, e in (("shipped", shipped), ("VP 7", vp7), ("weighted", weighted)):
            if e is not None:
                cols.setdefault((model, name), []).append(e)
        vp7_text = f"{vp7:+8.1%}" if vp7 is not None else f"{'':>8s}"
        print(f"{rid:48s} {row.published:9.1f} {shipped:+8.1%} {vp7_text} {weighted:+8.1%}")
    for (model, name), errs in cols.items():
        print(f"{model}, {name}: mean absolute error {sum(abs(e) for e in errs) / len(errs):.1%} over {len(errs)} rows")


if __name__ == "__main__":
    main()
