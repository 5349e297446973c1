"""Does a plan keep its promise on real GPUs? Profile the machine, plan Llama 3.2 1B and 3B (and
Llama 3 8B where it fits), run the planner's top plans and forced variants with `meshplan run`,
and print predicted against measured: step time, memory (allocated and reserved), OOM, MFU, then
Spearman and top-1 regret. Each compiled plan with activation checkpointing is run again with
compile off, so the table shows its compiled step beside the eager one (and the graph breaks
Dynamo logged). Writes CSV and Markdown.

    python benchmarks/gpu_truth.py [--quick] [--out benchmarks/results]

On a CUDA machine with 1-8 GPUs it uses every GPU. The same code runs on CPU with gloo for a smoke
test: `--cluster cpu-gloo --models tiny-4l --gpus 2 --seq-len 128 --global-batch 8`.
Everything goes through the command line (`python -m meshplan ...`), exactly as users run it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import yaml

RUN_TIMEOUT_S = 240


@dataclass
class Result:
    name: str
    model: str
    source: str  # planner rank N | variant: what was forced
    predicted_s: float | None = None
    measured_s: float | None = None
    predicted_gib: float | None = None
    predicted_allocated_gib: float | None = None
    allocated_gib: float | None = None
    reserved_gib: float | None = None
    fits: bool | None = None
    oom: bool = False
    failed: str = ""
    mfu_predicted: float | None = None
    mfu_measured: float | None = None
    eager_s: float | None = None  # the same plan with compile: false, measured
    graph_breaks: int | None = None  # Dynamo's "Graph break" log lines in a compiled run
    # Compiled TP plans: the TP collectives inductor fused with their matmuls (async TP) and those it left,
    # counted in the compiled graphs (runtime/tp_census.py; the summary's measured.compiled_tp_ops).
    tp_fused: int | None = None
    tp_unfused: int | None = None

    @property
    def error(self) -> float | None:
        if self.predicted_s and self.measured_s:
            return self.predicted_s / self.measured_s - 1
        return None


@dataclass
class Setup:
    gpus: int
    cluster: str
    device: str
    notes: list[str] = field(default_factory=list)


def meshplan(*args: str, timeout: float = RUN_TIMEOUT_S, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def detect(args: argparse.Namespace, out: Path) -> Setup:
    """GPUs present and the profile to plan with (measured here unless told otherwise)."""
    try:
        import torch

        cuda = torch.cuda.is_available()
        name = torch.cuda.get_device_name(0) if cuda else "CPU"
        gpus = torch.cuda.device_count() if cuda else args.gpus
    except ImportError:
        cuda, name, gpus = False, "CPU", args.gpus
    setup = Setup(gpus=args.gpus or gpus, cluster=args.cluster or "", device=name)
    if setup.cluster:
        return setup
    from meshplan.profiles.registry import nearest_builtin

    builtin = nearest_builtin(name, gpu=cuda)
    if args.no_profile:
        setup.cluster = builtin
        return setup
    path = out / "profile.yaml"
    res = meshplan("profile-cluster", "--nproc", str(setup.gpus), "--quick", "--out", str(path), timeout=300)
    if res.returncode == 0 and path.is_file():
        setup.cluster = str(path)
        setup.notes.append(f"profile measured here: {path}")
    else:
        setup.cluster = builtin
        last = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        setup.notes.append(f"profile-cluster failed ({last[0]}): planning with the built-in {builtin}")
    return setup


def write_plan(mapping: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(mapping, sort_keys=False))
    return path


def planner_top(model: str, setup: Setup, args: argparse.Namespace, work: Path, top: int) -> list[tuple[str, dict]]:
    """(label, plan mapping) of the planner's top plans, best first."""
    from meshplan.specs.outputs import candidates_path, plan_mapping_of_candidate

    best = work / model / "best.yaml"
    best.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["plan", "--model", model, "--gpus", str(setup.gpus), "--cluster", setup.cluster,
           "--seq-len", str(args.seq_len), "--top", str(top), "--out", str(best), "--json"]
    if args.global_batch:
        cmd += ["--global-batch", str(args.global_batch)]
    res = meshplan(*cmd, timeout=600)
    if res.returncode != 0:
        print(f"{model}: no plan ({(res.stderr or res.stdout).strip().splitlines()[-1:]})", flush=True)
        return []
    with open(candidates_path(best)) as f:
        rows = [r for r in csv.DictReader(f) if r.get("rank")]
    rows.sort(key=lambda r: int(r["rank"]))
    return [(f"planner #{r['rank']}", plan_mapping_of_candidate(r)) for r in rows[:top]]


def with_tp2(plan: dict[str, Any]) -> dict[str, Any] | None:
    """The plan with TP 2 where it has none, the GPUs taken from data parallelism; None where neither
    data-parallel degree halves."""
    p = plan["parallel"]
    if int(p.get("tp", 1)) > 1:
        return plan
    out = json.loads(json.dumps(plan))
    q = out["parallel"]
    for dim in ("dp_shard", "dp_replicate"):
        if int(q.get(dim, 1)) % 2 == 0:
            q[dim], q["tp"] = int(q[dim]) // 2, 2
            return out
    return None


def async_tp_variants(best: dict[str, Any]) -> list[tuple[str, dict]]:
    """Async TP on and off, compiled, on the best plan with TP (issue 26: its TP blocks must show the fused
    all-gather-matmul and matmul-reduce-scatter ops, the run's measured.compiled_tp_ops)."""
    base = with_tp2(best)
    if base is None:
        return []
    out = []
    for on in (True, False):
        plan = json.loads(json.dumps(base))
        plan["compile"] = True  # async TP is an inductor pass over sequence-parallel TP
        plan["parallel"].update(async_tp=on, sequence_parallel=True)
        out.append((f"variant async_tp={on}", plan))
    return out


def variants(best: dict[str, Any], fp8: bool, quick: bool, gpus: int = 1) -> list[tuple[str, dict]]:
    """The best plan with one knob forced at a time: AC (compiled), compile, float8, micro-batch; on 2 or
    more GPUs, async TP on and off."""
    forced: list[tuple[str, str, Any]] = [("memory", "activation_checkpointing", ac) for ac in ("selective", "full", "none")]
    forced += [("compile", "", v) for v in (False, True)]
    if fp8:
        forced += [("memory", "float8", v) for v in (False, True)]
    forced += [("training", "micro_batch", mb) for mb in ((1, 2) if quick else (1, 2, 4))]
    out = []
    for section, key, value in forced:
        plan = json.loads(json.dumps(best))
        if section == "compile":
            plan["compile"] = value
        else:
            plan[section][key] = value
        if key == "activation_checkpointing":
            plan["memory"]["sac_ops"] = None
            plan["compile"] = True  # the compiled plan; measure() runs its eager twin beside it
        out.append((f"variant {key or section}={value}", plan))
    return out + (async_tp_variants(best) if gpus >= 2 else [])


def estimate(path: Path) -> dict[str, Any] | str:
    res = meshplan("estimate", "--plan", str(path), "--json", timeout=300)
    if res.returncode != 0:
        return (res.stderr or res.stdout).strip().splitlines()[-1] if (res.stderr or res.stdout).strip() else "refused"
    return json.loads(res.stdout)


@dataclass
class Ran:
    summary: dict | None
    failed: str
    oom: bool
    graph_breaks: int


def run(path: Path, run_dir: Path, steps: int) -> Ran:
    """One `meshplan run`, with Dynamo's graph breaks logged (TORCH_LOGS=graph_breaks) and counted."""
    try:
        res = meshplan("run", "--plan", str(path), "--steps", str(steps), "--out", str(run_dir), "--quiet",
                       "--no-final-checkpoint",
                       env={"TORCH_LOGS": "graph_breaks"})
    except subprocess.TimeoutExpired:
        return Ran(None, f"timed out after {RUN_TIMEOUT_S} s", False, 0)
    text = res.stdout + res.stderr
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log.txt").write_text(text)  # the whole log, for a failure the table's last line cannot explain
    oom = "out of memory" in text.lower() or "OutOfMemoryError" in text
    breaks = sum("Graph break" in line for line in text.splitlines())
    summary = run_dir / "summary.json"
    if res.returncode != 0 or not summary.is_file():
        last = text.strip().splitlines()[-1:] or [f"exit {res.returncode}"]
        return Ran(None, last[0][:160], oom, breaks)
    return Ran(json.loads(summary.read_text()), "", oom, breaks)


def measure(label: str, model: str, plan: dict, work: Path, steps: int) -> Result:
    name = f"{model}/{label}".replace(" ", "_").replace("#", "")
    path = write_plan(plan, work / "plans" / f"{name.replace('/', '-')}.yaml")
    r = Result(name=name, model=model, source=label)
    est = estimate(path)
    if isinstance(est, str):
        r.failed = f"refused: {est[:140]}"
        return r
    r.predicted_s, r.predicted_gib, r.fits = est["step_time_s"], est["peak_memory_gib"], est["fits"]
    r.mfu_predicted = est.get("mfu")
    if not r.fits:
        r.failed = "estimate: does not fit (not run)"
        return r
    ran = run(path, work / "runs" / name.replace("/", "-"), steps)
    summary, r.failed, r.oom = ran.summary, ran.failed, ran.oom
    r.graph_breaks = ran.graph_breaks if plan.get("compile") else None
    if summary:
        m, p = summary["measured"], summary.get("predicted") or {}
        r.measured_s = m.get("step_time_s")
        r.allocated_gib, r.reserved_gib = m.get("peak_memory_gib"), m.get("peak_memory_reserved_gib")
        r.predicted_allocated_gib = p.get("peak_memory_allocated_gib")
        if tp_ops := m.get("compiled_tp_ops"):
            from meshplan.runtime.tp_census import fused, unfused

            r.tp_fused, r.tp_unfused = fused(tp_ops), unfused(tp_ops)
        if r.mfu_predicted is not None and r.measured_s:
            r.mfu_measured = r.mfu_predicted * r.predicted_s / r.measured_s  # MFU is proportional to 1/step
    return r


def ranks(values: list[float]) -> list[float]:
    """Average ranks (1-based) of `values`, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson of average ranks); None below 3 points or for a constant side."""
    if len(x) < 3:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5


def top1_regret(results: list[Result]) -> float | None:
    """Measured step time of the planner's pick over the best measured, minus 1."""
    ran = [r for r in results if r.measured_s]
    pick = next((r for r in ran if r.source == "planner #1"), None)
    return None if pick is None or not ran else pick.measured_s / min(r.measured_s for r in ran) - 1


def _fmt(v: Any, spec: str) -> str:
    return "" if v is None else format(v, spec)


def eager_twin(plan: dict[str, Any]) -> dict[str, Any] | None:
    """The same plan with compile off, for a compiled plan with activation checkpointing (None otherwise)."""
    if not plan.get("compile") or plan["memory"].get("activation_checkpointing") in (None, "none"):
        return None
    return {**json.loads(json.dumps(plan)), "compile": False}


def table_rows(results: list[Result]) -> list[list[str]]:
    return [[r.name, _fmt(r.predicted_s, ".3f"), _fmt(r.measured_s, ".3f"), _fmt(r.eager_s, ".3f"),
             _fmt(r.graph_breaks, "d"), _fmt(r.error, "+.1%"),
             _fmt(r.predicted_gib, ".2f"), _fmt(r.predicted_allocated_gib, ".2f"), _fmt(r.allocated_gib, ".2f"),
             _fmt(r.reserved_gib, ".2f"), "OOM" if r.oom else "", _fmt(r.mfu_predicted, ".1%"),
             _fmt(r.mfu_measured, ".1%"),
             "" if r.tp_fused is None else f"{r.tp_fused}/{r.tp_unfused}", r.failed] for r in results]


HEADER = ["plan", "pred s/step", "meas s/step", "eager s/step", "graph breaks", "error", "pred GiB", "pred alloc GiB", "meas alloc GiB",
          "meas reserved GiB", "OOM", "pred MFU", "meas MFU", "TP ops fused/left", "note"]


def summary_lines(results: list[Result]) -> list[str]:
    lines = []
    for model in dict.fromkeys(r.model for r in results):
        ran = [r for r in results if r.model == model and r.measured_s and r.predicted_s]
        rho = spearman([1 / r.predicted_s for r in ran], [1 / r.measured_s for r in ran])
        regret = top1_regret([r for r in results if r.model == model])
        oom_fit = sum(1 for r in results if r.model == model and r.oom and r.fits)
        lines.append(f"{model}: {len(ran)} plans measured; Spearman (predicted vs measured throughput) "
                     f"{_fmt(rho, '+.3f') or 'n/a'}; top-1 regret {_fmt(regret, '.1%') or 'n/a'}; "
                     f"OOM among plans the estimate says fit: {oom_fit}")
    return lines


def write_outputs(results: list[Result], setup: Setup, out: Path, elapsed: float) -> tuple[Path, Path]:
    stem = out / f"gpu_truth-{setup.device.replace(' ', '_')}-{date.today().isoformat()}"
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(asdict(results[0]).keys()) + ["error"] if results else ["name"])
    writer.writeheader()
    for r in results:
        writer.writerow({**asdict(r), "error": r.error})
    md = [f"# GPU truth: {setup.gpus} x {setup.device}, profile {setup.cluster}", "", *setup.notes, "",
          "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    md += ["| " + " | ".join(row) + " |" for row in table_rows(results)]
    md += ["", *summary_lines(results), "", f"elapsed {elapsed:.0f} s"]
    out.mkdir(parents=True, exist_ok=True)
    for path, text in ((stem.with_suffix(".csv"), buf.getvalue()), (stem.with_suffix(".md"), "\n".join(md) + "\n")):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return stem.with_suffix(".csv"), stem.with_suffix(".md")


def print_table(results: list[Result]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="predicted vs measured")
    for col in HEADER:
        table.add_column(col, justify="left" if col in ("plan", "note") else "right")
    for row in table_rows(results):
        table.add_row(*row)
    console = Console(width=200)
    console.print(table)
    for line in summary_lines(results):
        console.print(line)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1B only, top 3, fewer variants and steps")
    ap.add_argument("--out", default="benchmarks/results", help="where the CSV and Markdown go")
    ap.add_argument("--models", nargs="+", default=None, help="default: llama3.2-1b llama3.2-3b (+ llama3-8b)")
    ap.add_argument("--cluster", default=None, help="plan with this profile instead of measuring one")
    ap.add_argument("--no-profile", action="store_true", help="use the nearest built-in profile")
    ap.add_argument("--gpus", type=int, default=0, help="processes (default: the GPUs present)")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--global-batch", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 12, 6 with --quick)")
    ap.add_argument("--top", type=int, default=None, help="planner picks to run (default 5, 3 with --quick)")
    ap.add_argument("--variants", nargs="*", default=None,
                    help="only these forced variants, as key=value (e.g. activation_checkpointing=full float8=False)")
    ap.add_argument("--work", default=None, help="keep plans, run logs and summaries here (default: a temp folder)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="no new run starts after this many seconds")
    return ap.parse_args()


def main() -> int:
    args = parse()
    t0 = time.time()
    out = Path(args.out)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu_truth-"))
    setup = detect(args, work)
    models = args.models or (["llama3.2-1b"] if args.quick else ["llama3.2-1b", "llama3.2-3b", "llama3-8b"])
    steps = args.steps or (6 if args.quick else 12)
    print(f"{setup.gpus} x {setup.device}; profile {setup.cluster}; models {', '.join(models)}; {steps} steps per run",
          flush=True)
    for note in setup.notes:
        print(note, flush=True)
    from meshplan.profiles.registry import load_profile

    fp8 = "fp8" in load_profile(setup.cluster).device.peak_tflops  # float8 variants only where it runs
    results: list[Result] = []
    for model in models:
        top = planner_top(model, setup, args, work, args.top or (3 if args.quick else 5))
        if not top:
            continue
        # The pick, its AC x compile variants (each beside its eager twin), then the other picks.
        forced = variants(top[0][1], fp8, args.quick, setup.gpus if setup.device != "CPU" else 1)
        if args.variants is not None:
            forced = [(label, plan) for label, plan in forced if label.split(" ", 1)[1] in args.variants]
        candidates = top[:1] + forced + top[1:]
        seen: dict[str, Result] = {}
        for label, plan in candidates:
            twin = eager_twin(plan)
            for lab, pl in ((label, plan), *(((f"{label} eager", twin),) if twin else ())):
                key = json.dumps(pl, sort_keys=True)
                if key in seen:
                    continue
                if time.time() - t0 > args.budget_s:
                    seen[key] = Result(name=f"{model}/{lab}", model=model, source=lab, failed="skipped: time budget")
                else:
                    seen[key] = measure(lab, model, pl, work, steps)
                    r = seen[key]
                    print(f"  {r.name}: predicted {_fmt(r.predicted_s, '.3f')} s, measured {_fmt(r.measured_s, '.3f')} s "
                          f"{r.failed}", flush=True)
                results.append(seen[key])
            if twin:
                seen[json.dumps(plan, sort_keys=True)].eager_s = seen[json.dumps(twin, sort_keys=True)].measured_s
            write_outputs(results, setup, out, time.time() - t0)  # after every plan: a killed run keeps what ran
    if not results:
        print("nothing was planned")
        return 1
    print_table(results)
    paths = write_outputs(results, setup, out, time.time() - t0)
    print(f"wrote {paths[0]} and {paths[1]} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
