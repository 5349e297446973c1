"""Gloo worlds for the runtime tests: torchrun runs layouts_worker.py over a list of cases and
writes their results; a world that hangs is killed whole and fails its test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def start_world(nproc: int, spec: list[dict], tmp: Path, tag: str) -> tuple[subprocess.Popen, Path]:
    """torchrun of `spec` (layouts_worker's case list) on `nproc` ranks; (process, results path)."""
    cases_file, results = tmp / f"{tag}{nproc}.json", tmp / f"{tag}_results{nproc}.json"
    cases_file.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0", str(HERE / "layouts_worker.py"), str(cases_file), str(results)]
    log = open(tmp / f"{tag}{nproc}.log", "w")
    # A session of its own: on a timeout the whole world (torchrun and its workers) is killed.
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            start_new_session=True), results


def collect(worlds: list[tuple[subprocess.Popen, Path]], timeout_s: float, tmp: Path,
            partial_on_timeout: bool = False) -> dict:
    """Every world's results merged. A hang kills all worlds and fails, or, with
    partial_on_timeout, returns what the worlds finished (layouts_worker writes after each case)."""
    out: dict = {}
    timed_out = False
    for proc, path in worlds:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for p, _ in worlds:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            if not partial_on_timeout:
                pytest.fail(f"gloo world timed out after {timeout_s}s (hang?); logs in {tmp}")
            timed_out = True
        if path.exists():
            out.update(json.loads(path.read_text()))
        elif not timed_out:
            pytest.fail(f"world wrote no results (exit {proc.returncode}); see {tmp}")
    return out
