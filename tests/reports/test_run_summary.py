"""The table and verdict `meshplan run` ends with, on summaries written by hand."""

from __future__ import annotations

import json

from meshplan.reports.run_summary import print_run_summary, summary_rows, verdict


def _summary(measured_s: float, band=None) -> dict:
    predicted = {"step_time_s": 2.0, "tokens_per_s_per_gpu": 1000.0, "mfu": 0.40, "peak_memory_gib": 10.0}
    if band:
        predicted["step_time_band_s"] = band
    return {"measured": {"step_time_s": measured_s, "tokens_per_s_per_gpu": 2000.0 / measured_s,
                         "peak_memory_gib": 9.0},
            "predicted": predicted}


def test_rows_carry_ratios_and_mfu_in_percent():
    rows = {r.label: r for r in summary_rows(_summary(2.5))}
    assert rows["step time (s)"].ratio == 1.25
    assert rows["tokens/s per GPU"].measured == 800.0
    mfu = next(r for label, r in rows.items() if label.startswith("MFU %"))
    # 800 tok/s against 1000 predicted at 40 % MFU: 32 %, shown in percent.
    assert abs(mfu.measured - 32.0) < 1e-9 and abs(mfu.predicted - 40.0) < 1e-9
    assert rows["peak memory allocated (GiB)"].cells()[3] == "0.90x"


def test_verdict_uses_the_band_when_the_estimate_gives_one():
    assert "matched its plan" in verdict(_summary(2.2))                 # within +-15 % of 2.0
    assert "did NOT match" in verdict(_summary(2.5))                    # 25 % slower
    assert "did NOT match" in verdict(_summary(2.2, band=[1.9, 2.1]))    # outside a narrower band
    assert "matched its plan" in verdict(_summary(2.5, band=[1.8, 2.6]))
    assert "faster" in verdict(_summary(1.0))


def test_print_run_summary(tmp_path, capsys):
    assert not print_run_summary(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps(_summary(4.0)))
    assert print_run_summary(tmp_path)
    out = capsys.readouterr().out
    assert "2.00x" in out and "did NOT match" in out
