"""Nested cross-validation of a form that moves the dense rows, on the dense tables alone: forms.py's
compiled_elementwise by default (what a compiled Llama block's elementwise kernels move: eager PyTorch's
passes shrunk by the fitted compile_speedup, or the fused passes counted kernel by kernel), or
fsdp_copies (whether FSDP2's copy-out and copy-in on the compute stream are priced), or checkpoint_replay
(whether full AC's eager replay stops before a dense block's last matmul, as PyTorch's non-reentrant
checkpoint does), or compiled_loss (what a compiled loss moves: eager passes shrunk by compile_speedup, or
Inductor's fused kernels counted).

The mixture-of-experts tables are left out of the folds: their Megatron-Core rows run the stack's own fused
kernels whatever the form, and each of their folds costs minutes, so the full run
(`meshplan validate --cross --nested --form compiled_elementwise`) takes hours on this VM. The choice made
here never sees an MoE row, so their out-of-sample score under it (`meshplan validate --cross`) stays out of
sample; it moves them only through compile_speedup's share of their float8 casts.

    python benchmarks/nested_dense_form.py compiled_elementwise 2 > benchmarks/results/validate_nested-compiled_elementwise.txt
    python benchmarks/nested_dense_form.py fsdp_copies 2 > benchmarks/results/validate_nested-fsdp_copies.txt
    python benchmarks/nested_dense_form.py checkpoint_replay 2 > benchmarks/results/validate_nested-checkpoint_replay.txt
    python benchmarks/nested_dense_form.py compiled_loss 2 > benchmarks/results/validate_nested-compiled_loss.txt
    python benchmarks/nested_dense_form.py attention_rate > benchmarks/results/validate_nested-attention_rate-dense.txt

The second argument runs the outer folds in that many processes (the same folds, the same result).
"""

from __future__ import annotations

import sys

from meshplan.cost_models import forms
from meshplan.cost_models.crossval import fold_of, is_moe_source, step_time_rows
from meshplan.cost_models.nested import nested_cross_validate, nested_text

DENSE_FORMS = ("compiled_elementwise", "fsdp_copies", "checkpoint_replay", "compiled_loss", "attention_rate")


def is_dense_source(table: str) -> bool:
    """The tables nested_cross_validate keeps (module level, so that a worker process can take it)."""
    return not is_moe_source(table)


def main(form: str = "compiled_elementwise", jobs: str = "1") -> None:
    if form not in DENSE_FORMS:
        raise SystemExit(f"form: must be one of {', '.join(DENSE_FORMS)}, got {form!r}")
    rows = [r for r in step_time_rows() if is_dense_source(r.table)]
    result = nested_cross_validate(alternatives={form: forms.ALTERNATIVES[form]}, jobs=int(jobs),
                                   keep=is_dense_source)
    print(f"{len(rows)} dense rows of {len({r.table for r in rows})} tables "
          f"({len({fold_of(r.table) for r in rows})} folds)")
    print(nested_text(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
