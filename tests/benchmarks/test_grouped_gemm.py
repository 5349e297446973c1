"""benchmarks/grouped_gemm.py on this CPU: a row per grouped shape with the measured and priced rates."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshplan.profiles.registry import load_profile

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


@pytest.mark.timeout(120)
def test_grouped_gemm_lists_the_published_rows_shapes(tmp_path):
    """--rows on a CPU lists the MoE rows' expert GEMMs untimed. By hand: Mixtral-8x22B at TP 2, EP 8, one
    sequence of 4096 a micro-batch: 8 ranks x 2048 tokens x top-2 over 8 experts = 4096 tokens for the one
    local expert, gate/up 6144 -> 16384 and down back; Qwen2-57B-A14B at TP 2, EP 4: 4 x 2048 x top-8 over 64
    experts = 1024 tokens for each of 16 local experts of 2560. No rate above the H200's MAMF, 794.5 TFLOP/s
    (hw_measured_max_matmul_tflops_mamf.csv), and priced = form x sustained_fraction."""
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grouped_gemm.py"), "--rows", "--profile",
                          "h200-141g-dgx", "--out", str(tmp_path)], capture_output=True, text=True, timeout=110)
    assert res.returncode == 0, res.stderr[-2000:]
    sustained = load_profile("h200-141g-dgx").device.sustained_fraction
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:5]): [c.strip() for c in line.strip("|").split("|")]
            for line in res.stdout.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)}
    for shape in (("1", "4096", "16384", "6144", "mixtral-8x22b"), ("1", "4096", "6144", "16384", "mixtral-8x22b"),
                  ("16", "1024", "2560", "3584", "qwen2-57b-a14b"), ("16", "1024", "3584", "2560", "qwen2-57b-a14b")):
        assert shape in rows, shape
    for cells in rows.values():
        assert cells[5] == "not timed"
        form, priced = float(cells[6]), float(cells[7])
        assert 0 < form <= 794.5 + 0.5
        assert priced == pytest.approx(sustained * form, rel=0.01)
    assert (tmp_path / "grouped_gemm_rows-CPU.md").read_text().strip() == res.stdout.strip()
