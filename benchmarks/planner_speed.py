"""How fast is `meshplan plan` cold? Runs the whole command as a subprocess and prints figures.

    python benchmarks/planner_speed.py [--repeats 5] [--save-candidates DIR] [--profile]

For each case, over `--repeats` cold runs: the median wall time and its spread (min-max), the
machine's 1-minute load average before the case, user+system CPU of the median run's child
(resource.getrusage(RUSAGE_CHILDREN)), the declared space size and the search's own time from
--json, and candidates per second (space / search_time_s). `--save-candidates DIR` keeps each
case's candidates CSV, so two commits' results can be diffed (a speed-up must not change them).
`--profile` prints, for the first case, where a single-process search (--jobs 1) spends its time
(cProfile, cumulative). No assertions: this prints, it does not judge.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Every planner time the README quotes.
CASES = [
    ["--model", "llama70b", "--gpus", "256"],
    ["--model", "llama3-405b", "--gpus", "16384", "--cluster", "h100-80g-dgx", "--seq-len", "8192",
     "--global-batch", "2048"],
    ["--model", "llama70b", "--gpus", "384"],
    ["--model", "llama3-405b", "--gpus", "4096"],
    ["--model", "tiny-4l", "--gpus", "2", "--cluster", "cpu-gloo"],
    # Mixture-of-experts (issue 28's targets: at most 3 s each).
    ["--model", "qwen3-235b-a22b", "--gpus", "256"],
    ["--model", "deepseek-v3", "--gpus", "2048"],
]


def run(args: list[str], keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "best.yaml"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "meshplan", "plan", *args, "--out", str(out), "--json"],
                              capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if keep is not None and (Path(tmp) / "best.candidates.csv").is_file():
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(tmp) / "best.candidates.csv", keep)
        row = {"args": " ".join(args), "rc": proc.returncode, "wall_s": wall,
               "user_s": after.ru_utime - before.ru_utime, "sys_s": after.ru_stime - before.ru_stime}
        try:
            data = json.loads(proc.stdout)
        except json.JSONDecodeError:
            row["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return row
        s = data["search"]
        n = s["counts"]
        row.update(space=n["space"], search_s=s["search_time_s"], scored=n["scored_exactly"],
                   simulated=n["simulated"], stopped=n["simulations_stopped"], pruned=n["pruned_by_bound"],
                   rejected=n["rejected"],
                   dominated=n["dominated"], accounted_ok=n["accounted"] == n["space"])
        row["candidates_per_s"] = n["space"] / s["search_time_s"] if s["search_time_s"] else float("inf")
        if data.get("best"):
            b = data["best"]
            p = b["plan"]["parallel"]
            row["best"] = (f"dp_rep {p['dp_replicate']} x dp_shard {p['dp_shard']} x cp {p['cp']} x tp {p['tp']} "
                           f"x pp {p['pp']} ({p['pp_schedule']} v{p['pp_virtual_stages']})"
                           + (f", ep {p['ep']}" if "ep" in p else "") + "; "
                           f"{b['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, MFU {b['mfu']:.1%}, "
                           f"{b['peak_memory_gib']:.1f} GiB")
        return row


def case_name(args: list[str]) -> str:
    return "_".join(a.lstrip("-") for a in args).replace("/", "-")


def timed(args: list[str], repeats: int, save: Path | None) -> dict:
    """`repeats` cold runs of one case: the median run's figures, with the wall times' median and spread."""
    load = os.getloadavg()[0]
    rows = [run(args, save / f"{case_name(args)}.csv" if save and i == 0 else None) for i in range(repeats)]
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return rows[0]
    walls = sorted(r["wall_s"] for r in ok)
    median = statistics.median(walls)
    row = min(ok, key=lambda r: abs(r["wall_s"] - median))
    return {**row, "wall_s": median, "wall_min": walls[0], "wall_max": walls[-1], "runs": len(ok), "load": load}


def profile(args: list[str]) -> str:
    """cProfile of one in-process `meshplan plan` on one process (--jobs 1), top 30 by cumulative time."""
    from meshplan.cli import main as cli_main

    with tempfile.TemporaryDirectory() as tmp:
        prof = cProfile.Profile()
        prof.enable()
        cli_main(["plan", *args, "--out", str(Path(tmp) / "best.yaml"), "--jobs", "1", "--json"])
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(30)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="cold runs per case (default 5)")
    ap.add_argument("--save-candidates", type=Path, default=None, help="keep each case's candidates CSV here")
    ap.add_argument("--profile", action="store_true", help="also profile the first case in-process (--jobs 1)")
    a = ap.parse_args()
    print(f"python {sys.version.split()[0]}; cold subprocess per run (imports, profile load, search, writing); "
          f"{a.repeats} runs per case; {os.cpu_count()} cores")
    for args in CASES:
        r = timed(args, a.repeats, a.save_candidates)
        print(f"\nmeshplan plan {r['args']}")
        if "error" in r:
            print(f"  exit {r['rc']}: {r['error']}")
            continue
        print(f"  exit {r['rc']}   wall median {r['wall_s']:.2f} s (min {r['wall_min']:.2f}, max {r['wall_max']:.2f}, "
              f"{r['runs']} runs; load average before {r['load']:.2f})   median run: user {r['user_s']:.2f} s   "
              f"sys {r['sys_s']:.2f} s")
        print(f"  space {r['space']:,} plans; search {r['search_s']:.2f} s -> {r['candidates_per_s']:,.0f} candidates/s")
        print(f"  scored exactly {r['scored']:,} ({r['simulated']:,} simulated, {r['stopped']:,} of them "
              f"stopped early: no fit), dominated {r['dominated']:,}, "
              f"pruned {r['pruned']:,}, rejected {r['rejected']:,}; every leaf accounted: {r['accounted_ok']}")
        if r.get("best"):
            print(f"  best: {r['best']}")
    if a.profile:
        print(f"\nprofile of meshplan plan {' '.join(CASES[0])} --jobs 1 (in-process, cProfile):")
        print(profile(CASES[0]))


if __name__ == "__main__":
    main()
