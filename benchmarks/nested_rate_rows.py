"""Nested cross-validation of forms.py's rate_rows on the mixture-of-experts tables alone: which rows a
device's sustained rate is fitted on (every row, or only those whose kernels are all measured).

The choice moves only constants fitted on these tables (the Blackwell sustained fraction, the MoE host
time), and only Blackwell profiles price their rows, so the dense tables would add fourteen identical
folds at two hours on this VM; `meshplan validate --cross --nested --form rate_rows` runs them all.

    python benchmarks/nested_rate_rows.py > benchmarks/results/validate_nested-rate_rows.txt
"""

from __future__ import annotations

from meshplan.cost_models import forms
from meshplan.cost_models.crossval import fold_of, is_moe_source, training_rows
from meshplan.cost_models.nested import nested_cross_validate, nested_text


def main() -> None:
    rows = [r for r in training_rows() if is_moe_source(r.table)]
    result = nested_cross_validate(rows, {"rate_rows": forms.ALTERNATIVES["rate_rows"]})
    print(f"{len(rows)} MoE rows of {len({r.table for r in rows})} tables, held out by model "
          f"({len({fold_of(r.table) for r in rows})} folds)")
    print(nested_text(result))


if __name__ == "__main__":
    main()
