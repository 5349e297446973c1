"""The README's first loop on a CPU, exactly as a user types it, timed: profile this machine, plan
tiny-4l on two gloo processes, run the plan, report. Prints each command's seconds, the total, and
whether the run matched its plan; exits 1 if it did not (or a command failed).

    python benchmarks/first_loop.py [--steps 8] [--workdir DIR] [--out benchmarks/results/first_loop.txt]

CI runs it with fewer steps (tests/benchmarks/test_first_loop.py). The README quotes its committed output.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = [
    "meshplan profile-cluster --nproc 2 --quick --out mine.yaml",
    "meshplan plan --model tiny-4l --gpus 2 --cluster mine.yaml",
    "meshplan run --plan best.yaml --steps {steps} --out runs/cpu",
    "meshplan report best.yaml runs/cpu -o report.html",
]


def pick(work: Path) -> str:
    """The planner's pick as its candidates CSV writes it: layout, workload and predicted step."""
    import csv

    with open(work / "best.candidates.csv") as f:
        best = next(r for r in csv.DictReader(f) if r["rank"] == "1")
    return (f"{best['layout']}, {best['training.dtype']}, seq {best['training.seq_len']}, global batch "
            f"{best['training.global_batch']}: {float(best['step_time_s']):.3f} s/step predicted")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--workdir", default=None, help="where the commands run (default: a fresh temporary folder)")
    ap.add_argument("--out", default=None, help="also write the printed lines here")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="first_loop-"))
    work.mkdir(parents=True, exist_ok=True)
    lines, total, ok = [], 0.0, True
    verdict = "no verdict"
    for template in COMMANDS:
        cmd = template.format(steps=args.steps)
        t0 = time.perf_counter()
        # `python -m meshplan` is the `meshplan` script of this environment (same code, no PATH lookup).
        res = subprocess.run([sys.executable, "-m", "meshplan", *cmd.split()[1:]], cwd=work, capture_output=True,
                             text=True)
        dt = time.perf_counter() - t0
        total += dt
        lines.append(f"{dt:6.1f} s  {cmd}" + ("" if res.returncode == 0 else f"  FAILED (exit {res.returncode})"))
        if res.returncode != 0:
            lines.append((res.stderr or res.stdout).strip().splitlines()[-1] if (res.stderr or res.stdout).strip() else "")
            ok = False
            break
        for line in res.stdout.splitlines():
            if line.startswith("the run "):
                verdict = line
        if template.startswith("meshplan plan"):
            lines.append("          pick: " + pick(work))
    lines.append(f"{total:6.1f} s  in all")
    lines.append(verdict)
    ok = ok and verdict.startswith("the run matched its plan")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
