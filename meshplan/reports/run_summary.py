"""The table `meshplan run` ends with: what a run measured beside what its plan predicted, and
one verdict line saying whether the run matched its plan."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Without a band from the estimate, a run matches its plan when its step time is within 15 %
# of the prediction: the "within 15 %" criterion the cost model is validated by (issue 16).
DEFAULT_TOLERANCE = 0.15


@dataclass(frozen=True)
class SummaryRow:
    label: str
    measured: float | None
    predicted: float | None
    fmt: str  # a format spec for the values, e.g. ",.0f"

    @property
    def ratio(self) -> float | None:
        if self.measured is None or not self.predicted:
            return None
        return self.measured / self.predicted

    def cells(self) -> tuple[str, str, str, str]:
        def show(v: float | None) -> str:
            return "n/a" if v is None else format(v, self.fmt)

        r = self.ratio
        return self.label, show(self.measured), show(self.predicted), "n/a" if r is None else f"{r:.2f}x"


def _mfu_percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def summary_rows(summary: dict[str, Any]) -> list[SummaryRow]:
    """Rows of the table from a run's summary.json. Measured MFU follows from measured throughput
    at the prediction's FLOPs per token and peak (MFU is proportional to tokens/s)."""
    m, p = summary.get("measured") or {}, summary.get("predicted") or {}
    tps_m, tps_p = m.get("tokens_per_s_per_gpu"), p.get("tokens_per_s_per_gpu")
    mfu_p = p.get("mfu")
    mfu_m = mfu_p * tps_m / tps_p if (mfu_p is not None and tps_m is not None and tps_p) else None
    alloc_m = m.get("peak_memory_allocated_gib", m.get("peak_memory_gib"))
    alloc_p = p.get("peak_memory_allocated_gib", p.get("peak_memory_gib"))
    rows = [
        SummaryRow("step time (s)", m.get("step_time_s"), p.get("step_time_s"), ".3f"),
        SummaryRow("tokens/s per GPU", tps_m, tps_p, ",.0f"),
        SummaryRow(f"MFU % ({p.get('mfu_peak', 'device peak')})", _mfu_percent(mfu_m), _mfu_percent(mfu_p), ".1f"),
        SummaryRow("peak memory allocated (GiB)", alloc_m, alloc_p, ".3f"),
    ]
    if m.get("peak_memory_reserved_gib") is not None:  # CUDA only: the CPU allocator keeps no cache
        rows.append(SummaryRow("peak memory reserved (GiB)", m.get("peak_memory_reserved_gib"),
                               p.get("peak_memory_reserved_gib"), ".3f"))
    return rows


def verdict(summary: dict[str, Any]) -> str:
    """One line: did the measured step time fall within the estimate's band (or the default tolerance)?"""
    m, p = summary.get("measured") or {}, summary.get("predicted") or {}
    got, want = m.get("step_time_s"), p.get("step_time_s")
    if got is None or not want:
        why = summary.get("predicted_unavailable") or "no measured step time"
        return f"cannot compare with the plan: {why}"
    band = p.get("step_time_band_s")
    if band:
        low, high = float(band[0]), float(band[1])
        source = "the estimate's band"
    else:
        low, high = want * (1 - DEFAULT_TOLERANCE), want * (1 + DEFAULT_TOLERANCE)
        source = f"±{DEFAULT_TOLERANCE:.0%} of the prediction"
    ratio = got / want
    if low <= got <= high:
        return f"the run matched its plan: {got:.3f} s/step is within {source} ({low:.3f}-{high:.3f} s)"
    side = "slower" if got > high else "faster"
    return (f"the run did NOT match its plan: {got:.3f} s/step is {ratio:.2f}x the predicted {want:.3f} s, "
            f"{side} than {source} ({low:.3f}-{high:.3f} s)")


def print_run_summary(run_dir: str | Path) -> bool:
    """Print the table and verdict of `run_dir`/summary.json; False if the run wrote none."""
    from rich.console import Console
    from rich.table import Table

    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return False
    summary = json.loads(path.read_text())
    table = Table(title=f"meshplan run: measured vs predicted ({path})")
    for name in ("", "measured", "predicted", "measured / predicted"):
        table.add_column(name, justify="left" if not name else "right")
    for row in summary_rows(summary):
        table.add_row(*row.cells())
    console = Console(width=120)
    console.print(table)
    console.print(verdict(summary))
    return True
