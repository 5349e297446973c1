"""The runtime's own runs on a lent GPU as memory validation rows (published.runtime_memory_rows): each
run's plan and the peak memory it measured, read from gpu_truth's per-run summaries
(benchmarks/gpu_session.sh brings them back under benchmarks/results/gpu_session-<GPU>-<commit>/).

    python benchmarks/runtime_memory_rows.py benchmarks/results/gpu_session-NVIDIA_H200-19a97d1

writes meshplan/data/measured/runtime_runs.json (--out to write elsewhere). Only runs that ran
under the allocator setting the launcher gives every run (runtime/launcher.py ALLOCATOR_ENV) are
taken: the memory model's allocator slack is that setting's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshplan.runtime.launcher import ALLOCATOR_ENV  # noqa: E402
from meshplan.yamlio import atomic_write_text  # noqa: E402

OUT = ROOT / "meshplan" / "data" / "measured" / "runtime_runs.json"
SESSION = re.compile(r"gpu_session-(?P<device>.+)-(?P<commit>[0-9a-f]{7})$")


def session_rows(session: Path) -> list[dict]:
    """One row per run summary of a gpu_session folder, in name order."""
    m = SESSION.search(session.name)
    if not m:
        raise SystemExit(f"{session}: not a gpu_session-<GPU>-<commit> folder")
    rows = []
    for path in sorted(session.glob("*-summary.json")):
        summary = json.loads(path.read_text())
        run, measured = summary["run"], summary["measured"]
        if run.get("allocator_conf") != ALLOCATOR_ENV["PYTORCH_ALLOC_CONF"] or "peak_memory_reserved_gib" not in measured:
            continue
        rows.append({
            "id": path.name.removesuffix("-summary.json"),
            "device": m["device"].replace("_", " "),
            "commit": m["commit"],
            "summary": str(path.relative_to(ROOT)),
            "torch": summary["versions"]["torch"],
            "allocator_conf": run["allocator_conf"],
            "memory_measure": run["memory_measure"],
            "plan": summary["plan"],
            "reserved_gib": round(measured["peak_memory_reserved_gib"], 4),
            "allocated_gib": round(measured["peak_memory_gib"], 4),
            "step_time_s": round(measured["step_time_s"], 5),
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sessions", nargs="+", type=Path, help="gpu_session-<GPU>-<commit> folders")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    rows = [r for s in args.sessions for r in session_rows(s.resolve())]
    doc = {"note": "written by benchmarks/runtime_memory_rows.py from gpu_truth's run summaries; the runtime's "
                   "own runs, scored on peak memory (max reserved) by meshplan validate",
           "runs": rows}
    atomic_write_text(args.out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(rows)} runs to {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
