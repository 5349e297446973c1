"""How fast is `meshplan plan` cold? Runs the whole command as a subprocess and prints figures.

    python benchmarks/planner_speed.py

For each case: wall time, user+system CPU of the child (resource.getrusage(RUSAGE_CHILDREN)), the
declared space size and the search's own time from --json, and candidates per second
(space / search_time_s). No assertions: this prints, it does not judge.
"""

from __future__ import annotations

import json
import os
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
]


def run(args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "best.yaml"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "meshplan", "plan", *args, "--out", str(out), "--json"],
                              capture_output=True, text=True, timeout=1800)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
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
                           f"x pp {p['pp']} ({p['pp_schedule']} v{p['pp_virtual_stages']}); "
                           f"{b['tokens_per_s_per_gpu']:,.0f} tok/s/GPU, MFU {b['mfu']:.1%}, "
                           f"{b['peak_memory_gib']:.1f} GiB")
        return row


def main() -> None:
    print(f"python {sys.version.split()[0]}; cold subprocess per case (imports, profile load, search, writing); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for args in CASES:
        r = run(args)
        print(f"\nmeshplan plan {r['args']}")
        if "error" in r:
            print(f"  exit {r['rc']}: {r['error']}")
            continue
        print(f"  exit {r['rc']}   wall {r['wall_s']:.2f} s   user {r['user_s']:.2f} s   sys {r['sys_s']:.2f} s")
        print(f"  space {r['space']:,} plans; search {r['search_s']:.2f} s -> {r['candidates_per_s']:,.0f} candidates/s")
        print(f"  scored exactly {r['scored']:,} ({r['simulated']:,} simulated, {r['stopped']:,} of them "
              f"stopped early: no fit), dominated {r['dominated']:,}, "
              f"pruned {r['pruned']:,}, rejected {r['rejected']:,}; every leaf accounted: {r['accounted_ok']}")
        if r.get("best"):
            print(f"  best: {r['best']}")


if __name__ == "__main__":
    main()
