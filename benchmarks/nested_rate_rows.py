"""Nested cross-validation of a form that moves only the mixture-of-experts rows, on those tables alone:
forms.py's rate_rows by default (which rows a device's sustained rate is fitted on: every row, or only those
whose kernels are all measured), or the form named as the argument (overlap_contention: whether the
collectives Megatron-Core's mechanisms hide inside a block slow the compute beside them; the visible rows
of Megatron-Core, whose mechanisms they are, are all MoE rows; memory_rate: whether the Blackwell parts'
memory-bound rate is sourced or fitted on their rows, all of them MoE rows; attention_rate: whether a
profile's attention points are derated by the sustained rate, which moves the dense tables too, whose half
benchmarks/nested_dense_form.py runs; grouped_rate: whether the Blackwell parts price their grouped expert GEMMs
at the H200's measured shape curve or as matmuls of their own shapes; grouped_shape: whether a grouped GEMM's
rate between and beyond a profile's grouped points is their inverse-distance blend or a saturating form fitted
to them).

Such a choice moves only constants fitted on these tables (the Blackwell sustained fraction, the MoE host
time), and only Blackwell profiles price their rows, so the dense tables would add fourteen identical
folds at two hours on this VM; `meshplan validate --cross --nested --form FORM` runs them all. memory_rate's
fitted alternative fits two Blackwell rates jointly (crossval.coupled_targets), about a minute a fit here
against 13 seconds for one, so its nested run takes 26 minutes with 2 processes.

    python benchmarks/nested_rate_rows.py > benchmarks/results/validate_nested-rate_rows.txt
    python benchmarks/nested_rate_rows.py overlap_contention > benchmarks/results/validate_nested-overlap_contention.txt
    python benchmarks/nested_rate_rows.py memory_rate 2 > benchmarks/results/validate_nested-memory_rate.txt
    python benchmarks/nested_rate_rows.py attention_rate > benchmarks/results/validate_nested-attention_rate-moe.txt
    python benchmarks/nested_rate_rows.py grouped_rate 2 > benchmarks/results/validate_nested-grouped_rate.txt
    python benchmarks/nested_rate_rows.py grouped_shape 2 > benchmarks/results/validate_nested-grouped_shape.txt

The second argument runs the outer folds in that many processes (the same folds, the same result).
"""

from __future__ import annotations

import sys

from meshplan.cost_models import forms
from meshplan.cost_models.crossval import fold_of, is_moe_source, step_time_rows
from meshplan.cost_models.nested import nested_cross_validate, nested_text

MOE_ONLY_FORMS = ("rate_rows", "overlap_contention", "memory_rate", "attention_rate", "grouped_rate", "grouped_shape")


def main(form: str = "rate_rows", jobs: str = "1") -> None:
    if form not in MOE_ONLY_FORMS:
        raise SystemExit(f"form: must be one of {', '.join(MOE_ONLY_FORMS)}, got {form!r}")
    rows = [r for r in step_time_rows() if is_moe_source(r.table)]
    result = nested_cross_validate(alternatives={form: forms.ALTERNATIVES[form]}, jobs=int(jobs), keep=is_moe_source)
    print(f"{len(rows)} MoE rows of {len({r.table for r in rows})} tables, held out by model "
          f"({len({fold_of(r.table) for r in rows})} folds)")
    print(nested_text(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
