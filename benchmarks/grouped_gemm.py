"""How fast do the routed experts' grouped GEMMs run here, and what does a built-in profile price them at?

    python benchmarks/grouped_gemm.py [--profile h100-80g-dgx] [--quick] [--out DIR]
    python benchmarks/grouped_gemm.py --rows [--profile h200-141g-dgx] [--out DIR]
    (on a CPU, OMP_NUM_THREADS=1 times one rank's core of a 2-process run on 2 cores)

Times profile-cluster's grouped grid (bench/shapes.py grouped_grid) on this machine's device as the
runtime runs it (torch._grouped_mm, or the loop where the device has no grouped kernel), and prints,
per (groups, tokens per expert, n, k): the measured TFLOP/s, what the profile prices without grouped
points (each expert a matmul of its shape, cost_models/compute.py), and their ratio. On a GPU it is
the check of the built-in profiles' MoE expert pricing; a whole profile-cluster run measures the same
points into a profile. No assertions: this prints, it does not judge.

--rows times instead the expert GEMMs the published MoE rows run, as the cost model prices them (row_shapes),
and sets each beside the profile's grouped rate for that shape (compute.grouped_matmul_time: its measured
points and the form forms.py grouped_shape reads between and beyond them) before and after sustained_fraction:
whether the form holds at the shapes the validation rows need, wide experts beyond the measured grid and
more groups than it ran. On a CPU it lists the shapes and the profile's rates without timing them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

from meshplan.bench import compute
from meshplan.bench.env import BenchEnv
from meshplan.bench.progress import Reporter
from meshplan.bench.shapes import grouped_grid
from meshplan.bench.timing import Budget
from meshplan.cost_models.compute import grouped_matmul_time, matmul_time
from meshplan.cost_models.layout import layout_of
from meshplan.cost_models.moe import routing
from meshplan.cost_models.published import moe_blackwell_rows, moe_h100_rows
from meshplan.profiles.registry import load_profile, nearest_builtin
from meshplan.profiles.schema import ClusterProfile


def row_shapes() -> dict[tuple[int, int, int, int], set[str]]:
    """(groups, tokens per expert, n, k) of the scored MoE rows' expert GEMMs as moe.routed_expert_times prices
    them: a rank's local experts' gate and up projections (dim -> width, each its own GEMM) and their down one
    (width -> dim), over the tokens routed to each (rounded); each shape with the models that run it."""
    out: dict[tuple[int, int, int, int], set[str]] = {}
    for row in moe_blackwell_rows() + moe_h100_rows():
        if row.skipped:
            continue
        lay = replace(layout_of(row.plan), **row.layout_overrides)  # as validate.predict_layer_ms builds it
        spec = lay.spec
        r = routing(spec, lay.tokens_per_micro, lay.tp, lay.ep, lay.moe_imbalance)
        m = round(r.tokens_per_expert)
        for n, k in ((r.width, spec.dim), (spec.dim, r.width)):
            out.setdefault((r.local_experts, m, n, k), set()).add(spec.name)
    return out


def rows_table(points: list[dict], shapes: dict, prof: ClusterProfile, title: str) -> str:
    """The rows' shapes, measured where timed, against the profile's grouped rate (bf16)."""
    lines = [title, "", "| groups | tokens per expert | n | k | models | measured TFLOP/s | form TFLOP/s | "
             "priced TFLOP/s | form / measured |", "|---|---|---|---|---|---|---|---|---|"]
    measured = {(p["groups"], p["m"], p["n"], p["k"]): p["tflops"] for p in points}
    for (g, m, n, k), models in sorted(shapes.items(), key=lambda kv: (kv[0][2] * kv[0][3], kv[0][1])):
        priced = 2.0 * m * n * k / grouped_matmul_time(prof.device, g, m, n, k, "bf16") / 1e12
        form = priced / prof.device.sustained_fraction
        got = measured.get((g, m, n, k))
        lines.append(f"| {g} | {m} | {n} | {k} | {', '.join(sorted(models))} | "
                     f"{f'{got:.3g}' if got else 'not timed'} | {form:.3g} | {priced:.3g} | "
                     f"{f'{form / got:.2f}' if got else ''} |")
    lines += ["", f"form: {prof.name}'s grouped rate for the shape (forms.py grouped_shape), best case; priced: the same "
              f"times sustained_fraction {prof.device.sustained_fraction}, as the estimate takes it; measured: "
              "torch._grouped_mm, one process alone"]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default=None, help="built-in profile to compare with (default: the nearest)")
    ap.add_argument("--quick", action="store_true", help="half the grid")
    ap.add_argument("--out", default=None, help="also write the table here as grouped_gemm-<device>.md")
    ap.add_argument("--rows", action="store_true", help="the published MoE rows' expert GEMMs instead of the grid")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    env = BenchEnv(rank=0, world=1, local_rank=0, local_world=1, nnodes=1, backend="nccl" if cuda else "gloo",
                      device=device)
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    prof = load_profile(a.profile or nearest_builtin(name))
    dtype = "bf16" if cuda else "fp32"
    settings = compute.ComputeSettings(target_s=0.05 if a.quick else 0.2, min_reps=3)
    if a.rows:
        return _rows(a, env, name, cuda)
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
    _report("\n".join(lines), a.out, f"grouped_gemm-{name.replace(' ', '_')}.md")
    return 0


def _report(text: str, out: str | None, file_name: str) -> None:
    """Print the table, and write it under `out` when given."""
    print(text)
    if out:
        path = Path(out) / file_name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")


def _rows(a: argparse.Namespace, env: BenchEnv, name: str, cuda: bool) -> int:
    """--rows: the published MoE rows' shapes, timed in bf16 on a GPU, listed on a CPU."""
    prof = load_profile(a.profile or ("h200-141g-dgx" if not cuda else nearest_builtin(name)))
    shapes = row_shapes()
    points = []
    if cuda:
        compute.warm_up(env)
        settings = compute.ComputeSettings(target_s=0.05, min_reps=3)
        points = compute.bench_grouped_matmul(env, sorted(shapes), ["bf16"], settings, Budget(None),
                                              Reporter(enabled=False), {"bf16": 100.0})
    text = rows_table(points, shapes, prof, f"# The published MoE rows' expert GEMMs on {name} (torch "
                                            f"{torch.__version__}) against {prof.name}'s grouped rate")
    _report(text, a.out, f"grouped_gemm_rows-{name.replace(' ', '_')}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
