"""Run several plans in one torchrun world (one process group, a fresh DeviceMesh per plan) and
write each plan's per-step losses to a JSON file (rank 0). Used by test_layouts.py.

usage: torchrun ... layouts_worker.py CASES.json RESULTS.json
CASES.json: [{"name": str, "plan": {...plan mapping...}, "steps": int}, ...]
"""

import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

from meshplan.runtime.options import RunOptions
from meshplan.runtime.train import run_training
from meshplan.specs.plan import plan_from_dict


def main() -> None:
    cases_path, results_path = sys.argv[1], sys.argv[2]
    cases = json.load(open(cases_path))
    dist.init_process_group("gloo")
    results = {}
    for case in cases:
        t0 = time.perf_counter()
        try:
            plan = plan_from_dict(case["plan"])
            opts = RunOptions(steps=case.get("steps", 5), seed=case.get("seed", 0), quiet=True,
                              track_memory=case.get("track_memory", "off"), timing_warmup=2)
            rows = run_training(plan, opts, torch.device("cpu"))
            results[case["name"]] = {"losses": [r.loss for r in rows],
                                     "peak_memory_gib": [r.peak_memory_gib for r in rows],
                                     "seconds": time.perf_counter() - t0}
        except Exception:
            results[case["name"]] = {"error": traceback.format_exc()}
            print(f"[rank {dist.get_rank()}] case {case['name']} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if dist.get_rank() == 0:  # after every case, so a world that hangs later keeps what ran
            _write(results, results_path)
        dist.barrier()
    dist.destroy_process_group()


def _write(results: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
