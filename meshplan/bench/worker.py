"""One rank of `profile-cluster` under torchrun: run every benchmark, rank 0 fits and writes the profile."""

from __future__ import annotations

import statistics
import time
from dataclasses import astuple, dataclass, field

import torch
import torch.distributed as dist

from meshplan.errors import InputError

from meshplan.bench import collectives as coll
from meshplan.bench.contention import ContentionResult, measure_contention
from meshplan.bench.host import HostCosts, bench_host_dispatch
from meshplan.bench.in_step import measure_fsdp_steps
from meshplan.bench.pipeline import measure_pipeline_steps
from meshplan.bench import compute
from meshplan.bench.env import BenchEnv, init_env, shutdown
from meshplan.bench.memory import MemoryResult, measure_memory
from meshplan.bench.progress import Reporter
from meshplan.bench.shapes import (attention_dtypes, attention_head_dims, attention_seq_lens, grouped_grid,
                                   grouped_matmul_dtypes, matmul_grid)
from meshplan.bench.timing import Budget

COMPUTE_SHARE = 0.35  # of the time budget, the rest goes to collectives
# first guesses of a GPU's matmul rate, for the time budget only (about 0.4x an H100's dense peaks)
GPU_EST_TFLOPS = {"bf16": 400.0, "fp8": 800.0}


@dataclass
class WorkerOptions:
    out: str
    name: str
    quick: bool
    deadline: float | None
    max_nodes: int | None
    node_link: str | None
    network_link: str
    description: str
    command: str


@dataclass
class RawResults:
    """Everything measured, reduced over ranks (medians of per-rank medians for per-device numbers)."""

    device_name: str
    dtypes: list[str]
    matmul_points: list[dict]
    attention_points: list[dict]
    attention_dtype: str
    copy_gbs: float
    elementwise_efficiency: float
    memory: MemoryResult
    collective_points: list[dict]
    notes: list[str]
    skipped: list[str]
    elapsed_s: float
    host: HostCosts = HostCosts()  # per-op host costs (bench/host.py), medians over ranks
    fsdp_steps: dict | None = None  # a small FSDP2 model's steps, sharded and not (CPU worlds of 2+; in_step.py)
    pipeline_steps: list[dict] = field(default_factory=list)  # CPU worlds of 2+ processes (bench/pipeline.py)
    grouped_points: list[dict] = field(default_factory=list)  # routed experts' grouped GEMMs (compute.py)
    host_link: dict | None = None  # pinned-host copies one way, GB/s each direction (compute.bench_host_link); CUDA only
    contention: ContentionResult | None = None  # matmuls beside all-reduces over the node (bench/contention.py)


def _median_over_ranks(points: list[dict], keys: tuple[str, ...], extra: tuple[str, ...] = ()) -> list[dict]:
    """Gather every rank's points and keep, per key, the median throughput (a slow device shows in spread)."""
    gathered: list[list[dict]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, points)
    merged: dict[tuple, list[dict]] = {}
    for rank_points in gathered:
        for p in rank_points:
            merged.setdefault(tuple(p[k] for k in keys), []).append(p)
    out = []
    for group in merged.values():
        p = dict(group[0])
        for key in ("tflops",) + extra:
            p[key] = statistics.median(q[key] for q in group)
        p["spread"] = max(q["spread"] for q in group)
        out.append(p)
    return out


def _scalar_median(value: float) -> float:
    values = [0.0] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return statistics.median(values)


def _compute_section(env: BenchEnv, opts: WorkerOptions, budget: Budget, rep: Reporter) -> tuple:
    settings = compute.ComputeSettings(target_s=0.05, min_reps=3) if opts.quick else compute.ComputeSettings(0.3, 5)
    compute.warm_up(env)
    dtypes, notes = compute.choose_dtypes(env, settings)
    shapes = matmul_grid(env.is_cuda, opts.quick)
    seqs = attention_seq_lens(env.is_cuda, opts.quick)
    head_dims = attention_head_dims(env.is_cuda, opts.quick)
    est = {dt: GPU_EST_TFLOPS.get(dt, 40.0) if env.is_cuda else (0.05 if dt == "fp32" else 0.01) for dt in dtypes}
    grouped_shapes = grouped_grid(env.is_cuda, opts.quick)
    grouped_dtypes = grouped_matmul_dtypes(dtypes, env.is_cuda)
    total = sum(compute.matmul_cost(m, n, k, est[dt], settings) for dt in dtypes for m, n, k in shapes)
    total += sum(compute.matmul_cost(g * m, n, k, est[dt], settings) for dt in grouped_dtypes
                 for g, m, n, k in grouped_shapes)
    att_dtype, att_dtypes = attention_dtypes(dtypes, env.is_cuda)
    rep.start("matmul + attention", total + len(seqs) * len(head_dims) * len(att_dtypes) * settings.target_s * 3)
    # shares of the compute budget, so a tight budget still leaves attention and bandwidth some points
    matmul = compute.bench_matmul(env, shapes, dtypes, settings, budget.section(0.6), rep, est)
    grouped = compute.bench_grouped_matmul(env, grouped_shapes, grouped_dtypes, settings, budget.section(0.3), rep, est)
    attention, att_budget = [], budget.section(0.75)
    for i, dt in enumerate(att_dtypes):  # each dtype gets an equal share of what is left
        share = att_budget.section(1.0 / (len(att_dtypes) - i))
        attention += compute.bench_attention(env, seqs, head_dims, dt, settings, share, rep, est[dt] * 0.5)
    copy_gbs, _ = compute.bench_copy_bandwidth(env, settings)
    eff = compute.bench_elementwise_efficiency(env, settings, copy_gbs)
    rep.stop()
    return (dtypes, notes, _median_over_ranks(matmul, ("m", "n", "k", "dtype")),
            _median_over_ranks(grouped, ("groups", "m", "n", "k", "dtype")),
            _median_over_ranks(attention, ("seq_len", "head_dim", "dtype"), extra=("bwd_tflops",)), att_dtype, _scalar_median(copy_gbs),
            _scalar_median(eff))


def _collective_section(env: BenchEnv, opts: WorkerOptions, sets: list[coll.GroupSet], budget: Budget,
                        rep: Reporter) -> list[dict]:
    dtype = torch.bfloat16 if env.is_cuda else torch.float32
    settings = (coll.CollectiveSettings(coll.QUICK_SIZES, target_s=0.8, min_reps=16, rounds=8, dtype=dtype)
                if opts.quick else coll.CollectiveSettings(coll.FULL_SIZES, target_s=1.0, min_reps=10, rounds=5, dtype=dtype))
    pr = coll.probe(env, sets[0], dtype)
    settings = coll.fit_to_budget(sets, settings, pr, budget.remaining())
    rep.start("collectives", coll.estimate_total_s(sets, settings, pr))
    points = coll.bench_collectives(env, sets, settings, budget, rep)
    rep.stop()
    return points


def run_benchmarks(env: BenchEnv, opts: WorkerOptions, rep: Reporter) -> RawResults:
    start = time.time()
    budget = Budget(opts.deadline)
    node_link = opts.node_link or ("nvlink" if env.is_cuda else "loopback")
    sets = coll.plan_groups(env, node_link, opts.network_link)
    env.max_over_ranks([0.0])  # first collective on the world: NCCL communicators exist before memory is sized
    memory = measure_memory(env)
    memory = MemoryResult(memory.memory_gib, _scalar_min(memory.usable_gib), _scalar_median(memory.context_gib),
                          memory.source)
    dtypes, notes, mm, grouped, att, att_dtype, copy_gbs, eff = _compute_section(env, opts,
                                                                              budget.section(COMPUTE_SHARE), rep)
    # The cost model adds host time in line with the compute on a CPU, where the host is the device, and
    # where it outlasts the kernels on a GPU, where the host runs ahead of them (cost_models/host.py).
    host = bench_host_dispatch(env, 0.1 if opts.quick else 0.3, 5)
    host = HostCosts(*(_scalar_median(v) for v in astuple(host)))
    host_link = _host_link(env, opts.quick)
    # One process: nothing to communicate with; the builder takes collectives from a built-in profile.
    points = _collective_section(env, opts, sets, budget, rep) if env.world > 1 else []
    contention = _contention(env, sets, node_link, budget, rep)
    in_step = env.world > 1 and not env.is_cuda
    fsdp = measure_fsdp_steps(env, opts.quick) if in_step else None
    pipeline = measure_pipeline_steps(env, opts.quick) if in_step else []
    name = torch.cuda.get_device_name(env.device) if env.is_cuda else _cpu_name()
    return RawResults(name, dtypes, mm, att, att_dtype, copy_gbs, eff, memory, points, notes, rep.skipped,
                      time.time() - start, host, fsdp, pipeline, grouped, host_link, contention)


# seconds measure_contention takes, setup included (5 rounds of a chain alone, then beside all-reduces for 3x its time)
CONTENTION_COST_S = {"cuda": 3.0, "cpu": 8.0}


def _contention(env: BenchEnv, sets: list[coll.GroupSet], node_link: str, budget: Budget,
                rep: Reporter) -> ContentionResult | None:
    """Over the whole node's group, where a node holds two ranks or more; the median over ranks."""
    node = next((gs for gs in sets if gs.level == node_link), None)
    if env.world == 1 or node is None or node.size < 2:
        return None
    if not env.agree(budget.allows(CONTENTION_COST_S[env.device.type])):
        rep.skip("compute beside collectives (comm_compute_slowdown): out of time")
        return None
    r = measure_contention(env, node.handle, node.size)
    ratios = [_scalar_median(x) for x in r.ratios]
    return ContentionResult(_scalar_median(r.alone_s), _scalar_median(r.beside_s), r.matmul_dim, r.chain,
                            r.buffer_bytes, r.group_size, ratios, r.covered)


def _host_link(env: BenchEnv, quick: bool) -> dict | None:
    """Each direction's median over ranks; None on CPU processes (every rank alike, so no collective is left
    waiting)."""
    link = compute.bench_host_link(env, compute.ComputeSettings(0.05, 3) if quick else compute.ComputeSettings(0.3, 5))
    return None if link is None else {k: _scalar_median(v) for k, v in link.items()}


def _scalar_min(value: float) -> float:
    values = [0.0] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return min(values)


def _cpu_name() -> str:
    import platform
    from pathlib import Path

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} (CPU process)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} (CPU process)"


def worker_main(opts: WorkerOptions) -> InputError | None:
    """Entry point on every rank. Rank 0 returns the input error (e.g. too little time) that stopped it,
    after every rank has finished cleanly, so the launcher can report it as one line."""
    from meshplan.bench.builder import build_and_write

    env = init_env()
    rep = Reporter(enabled=env.is_main)
    error = None
    try:
        raw = run_benchmarks(env, opts, rep)
        if env.is_main:
            try:
                build_and_write(env, opts, raw, rep)
            except InputError as exc:
                error = exc
        dist.barrier()
    finally:
        rep.stop()
        shutdown()
    return error
