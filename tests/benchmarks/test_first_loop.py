"""The README's first CPU loop runs end to end on this machine (benchmarks/first_loop.py, 4 steps):
profile, plan, run, report all succeed and the run's step lands near its plan's prediction. The
README's 15 % verdict is what the committed 8-step output shows; here, on CI's shared cores and
two timed steps, the check is a looser 0.6-1.6x, which a broken batch rule or cost model misses by far
(the old default planned 13.9 s steps)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_first_loop_runs_and_lands_near_its_plan(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_loop.py"), "--steps", "4",
                          "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=380)
    out = res.stdout
    assert "FAILED" not in out and out.count(" s  meshplan ") == 4, out + res.stderr
    got = re.search(r"the run (?:did NOT match|matched) its plan: ([\d.]+) s/step", out)
    pick = re.search(r"pick: .*: ([\d.]+) s/step predicted", out)
    assert got and pick, out
    assert 0.6 < float(got.group(1)) / float(pick.group(1)) < 1.6, out
    assert (tmp_path / "report.html").is_file()
