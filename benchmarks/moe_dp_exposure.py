"""How much of the Blackwell MoE rows' error their data-parallel overlap could carry: each row's error with
Megatron-Core's bucketed overlap as priced (the all-gathers under the first micro-batch's forward, the
reduce-scatters under the last one's backward) and with nothing hidden (Layout.dp_overlap "none"), at the
shipped constants. A diagnostic, not a fit: rows that move less than a point are not listed.

    python benchmarks/moe_dp_exposure.py > benchmarks/results/moe_dp_exposure.txt
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from meshplan.cost_models.estimate import data_parallel_comm, group_spans, ComputeWindows
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.cost_models.published import moe_blackwell_rows
from meshplan.cost_models.validate import predict
from meshplan.profiles.registry import load_profile


def issued_s(row) -> float:
    """The critical rank's data-parallel all-gathers and reduce-scatters over the step, hidden or not."""
    prof = load_profile(row.plan.cluster)
    lay = replace(runtime_paths(layout_of(row.plan), prof), **row.layout_overrides)
    c = data_parallel_comm(lay, prof, group_spans(lay, prof), 0, ComputeWindows(1.0))
    return c.all_gather + c.reduce_scatter


def main() -> None:
    hidden, exposed = [], []
    print(f"{'row':62s} {'published':>10s} {'DP comm s':>9s} {'buckets':>8s} {'none':>8s}")
    for row in moe_blackwell_rows():
        if row.skipped:
            continue
        as_priced = predict(row)[0] / row.published - 1
        unhidden = replace(row, layout_overrides={**row.layout_overrides, "dp_overlap": "none"})
        bare = predict(unhidden)[0] / row.published - 1
        hidden.append(abs(as_priced))
        exposed.append(abs(bare))
        if abs(bare - as_priced) >= 0.01:
            print(f"{row.label[-62:]:62s} {row.published:10.0f} {issued_s(row):9.2f} {as_priced:+8.1%} {bare:+8.1%}")
    print(f"MAPE over {len(hidden)} rows: buckets {statistics.mean(hidden):.1%}, none {statistics.mean(exposed):.1%}")


if __name__ == "__main__":
    main()
