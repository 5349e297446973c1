"""benchmarks/grouped_gemm.py on this CPU: a row per grouped shape with the measured and priced rates."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
def test_grouped_gemm_prints_a_row_per_shape(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grouped_gemm.py"), "--quick", "--profile",
                          "cpu-gloo", "--out", str(tmp_path)], capture_output=True, text=True, timeout=110)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line for line in res.stdout.splitlines() if re.match(r"\| 4 \| \d+ \|", line)]
    assert len(rows) == 3  # half of the CPU grid's 6 shapes
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[4] == "grouped_mm"
        measured, priced, ratio = map(float, cells[5:8])
        assert measured > 0 and priced > 0 and ratio == pytest.approx(priced / measured, rel=0.02, abs=0.01)
    assert (tmp_path / "grouped_gemm-CPU.md").read_text().strip() == res.stdout.strip()
