"""How fast do the routed experts' grouped GEMMs run here, and what does a built-in profile price them at?

    python benchmarks/grouped_gemm.py [--profile h100-80g-dgx] [--quick] [--out DIR]
    (on a CPU, OMP_NUM_THREADS=1 times one rank's core of a 2-process run on 2 cores)

Times profile-cluster's grouped grid (bench/shapes.py grouped_grid) on this machine's device as the
runtime runs it (torch._grouped_mm, or the loop where the device has no grouped kernel), and prints,
per (groups, tokens per expert, n, k): the measured TFLOP/s, what the profile prices without grouped
points (each expert a matmul of its shape, cost_models/compute.py), and their ratio. On a GPU it is
the check of the built-in profiles' MoE expert pricing; a whole profile-cluster run measures the same
points into a profile. No assertions: this prints, it does not judge.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from meshplan.bench import compute
from meshplan.bench.env import BenchEnv
from meshplan.bench.progress import Reporter
from meshplan.bench.shapes import grouped_grid
from meshplan.bench.timing import Budget
from meshplan.cost_models.compute import matmul_time
from meshplan.profiles.registry import load_profile, nearest_builtin


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=None, help="built-in profile to compare with (default: the nearest)")
    ap.add_argument("--quick", action="store_true", help="half the grid")
    ap.add_argument("--out", default=None, help="also write the table here as grouped_gemm-<device>.md")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    env = BenchEnv(rank=0, world=1, local_rank=0, local_world=1, nnodes=1, backend="nccl" if cuda else "gloo",
                      device=device)
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    prof = load_profile(a.profile or nearest_builtin(name))
    dtype = "bf16" if cuda else "fp32"
    settings = compute.ComputeSettings(target_s=0.05 if a.quick else 0.2, min_reps=3)
    compute.warm_up(env)
    rep = Reporter(enabled=False)
    points = compute.bench_grouped_matmul(env, sorted(grouped_grid(cuda, a.quick), key=lambda s: (s[2], s[3], s[1])),
                                          [dtype], settings, Budget(None), rep, {dtype: 100.0 if cuda else 0.05})
    for what in rep.skipped:
        print(f"skipped: {what}")
    threads = "" if cuda else f", {torch.get_num_threads()} CPU threads"
    lines = [f"# Grouped GEMMs on {name} ({dtype}, torch {torch.__version__}{threads}) against {prof.name}'s "
             "per-expert matmuls",
             "", "| groups | tokens per expert | n | k | kernel | measured TFLOP/s | priced TFLOP/s | priced / measured |",
             "|---|---|---|---|---|---|---|---|"]
    for p in points:
        g, m, n, k = p["groups"], p["m"], p["n"], p["k"]
        priced = 2.0 * m * n * k / matmul_time(prof.device, m, n, k, dtype) / 1e12
        lines.append(f"| {g} | {m} | {n} | {k} | {p['kernel']} | {p['tflops']:.3g} | {priced:.3g} | "
                     f"{priced / p['tflops']:.2f} |")
    lines.append("")
    lines.append(f"priced: {prof.name}'s matmul rate for one expert's shape, sustained_fraction "
                 f"{prof.device.sustained_fraction} included; measured: best-case kernel rate, not derated, one "
                 "process alone (profile-cluster times every rank at once)")
    text = "\n".join(lines)
    print(text)
    if a.out:
        path = Path(a.out) / f"grouped_gemm-{name.replace(' ', '_')}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
