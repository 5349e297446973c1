"""Rank 0: fit the raw measurements, assemble the ClusterProfile, write it atomically, print the fit errors."""

from __future__ import annotations

import datetime as _dt
import statistics
import sys
from dataclasses import asdict, replace
from typing import Any

import torch

from meshplan.errors import InputError
from meshplan.cost_models.comm import bus_factor, p2p_time
from meshplan.profiles import fit
from meshplan.profiles.fit import TARGET, collective_entry, sig, written_error
from meshplan.profiles.registry import load_profile, nearest_builtin
from meshplan.bench.compute import HOST_LINK_BYTES
from meshplan.bench.contention import contention_source
from meshplan.bench.env import BenchEnv
from meshplan.bench.in_step import sync_per_call
from meshplan.bench.pipeline import action_seconds, payload_bytes as pipeline_payload_bytes
from meshplan.bench.peaks import cores_per_device, cpu_peaks, gpu_datasheet_peaks, resolve_peaks
from meshplan.bench.progress import Reporter
from meshplan.bench.unmeasured import take_unmeasured
from meshplan.bench.worker import RawResults, WorkerOptions
from meshplan.profiles.schema import COLLECTIVES, ClusterProfile, profile_from_dict
from meshplan.profiles.versions import installed_versions
from meshplan.yamlio import atomic_write_yaml


def fit_group_size(collective: str, level_sizes: list[int], in_node: bool) -> int:
    """The group a level's fit describes.

    In a node: the whole node (TP / FSDP groups fill it), pairs for send_recv (pipeline neighbours).
    Across nodes: one rank per node, all such groups at once, which is the per-device network figure the
    cost model scales by ranks per node (cost_models/comm.py); the whole-world points stay as raw data.
    """
    if in_node and collective != "send_recv":
        return max(level_sizes)
    return min(level_sizes)


def fit_collectives(points: list[dict], levels: list[str]) -> tuple[dict, dict]:
    """Per level (the first is the node level) and collective: the fit (with two size ranges where one
    line misses TARGET) and its error over >= 1 MiB."""
    fits: dict[str, dict[str, dict]] = {}
    errors: dict[str, dict[str, fit.FitError]] = {}
    for level in levels:
        fits[level], errors[level] = {}, {}
        for c in COLLECTIVES:
            ps = [p for p in points if p["level"] == level and p["collective"] == c]
            sizes = sorted({p["group_size"] for p in ps})
            if not sizes:
                raise InputError("--time-budget", f"no {c} measurement on {level}: allow more time")
            n = fit_group_size(c, sizes, in_node=level == levels[0])
            ps = sorted((p for p in ps if p["group_size"] == n), key=lambda p: p["bytes"])
            large = sum(p["bytes"] >= fit.LARGE_BYTES for p in ps)
            if len(ps) < 2 or large < 2:
                raise InputError("--time-budget", f"{c} on {level} reached {large} size(s) >= 1 MiB, the fit needs 2: "
                                                  "allow more time")
            b = [p["bytes"] for p in ps]
            x = [p["bytes"] * bus_factor(c, n) for p in ps]
            t = [p["time_s"] for p in ps]
            fits[level][c], one_line = collective_entry(b, x, t)
            noise = [p["median_se"] for p in ps if p["bytes"] >= fit.LARGE_BYTES and p.get("median_se") is not None]
            # errors of the model as written (rounded, with its segments), over the group it describes
            errors[level][c] = replace(written_error(fits[level][c], b, x, t), group_size=n,
                                       noise=statistics.mean(noise) if noise else None,
                                       one_line_max_rel=one_line.max_rel)
    return fits, errors


def _dtypes_of(points: list[dict]) -> str:
    return " and ".join(sorted({p["dtype"] for p in points}, key=lambda d: (d != "fp32", d)))


def _device_section(raw: RawResults, env: BenchEnv) -> tuple[dict, dict]:
    best = {dt: max(p["tflops"] for p in raw.matmul_points if p["dtype"] == dt)
            for dt in raw.dtypes if any(p["dtype"] == dt for p in raw.matmul_points)}
    if not best:
        raise InputError("--time-budget", "no matmul measurement finished: allow more time")
    if not any(p["dtype"] == raw.attention_dtype for p in raw.attention_points):
        raise InputError("--time-budget", "no attention measurement finished: allow more time")
    guess = gpu_datasheet_peaks(raw.device_name) if env.is_cuda else cpu_peaks(cores_per_device(env.local_world), list(best))
    peaks = resolve_peaks(guess, best)
    mm_fit = fit.fit_matmul(raw.matmul_points, peaks.tflops)
    same_part = nearest_builtin(raw.device_name, env.is_cuda)  # the built-in whose hardware ratios this one takes
    att_peak = peaks.tflops[raw.attention_dtype]
    # max_fraction describes the kernel at its largest head measured (128 on GPUs, like the models)
    primary = [p for p in raw.attention_points if p["dtype"] == raw.attention_dtype]
    fitted = [p for p in primary if p["head_dim"] == max(q["head_dim"] for q in primary)]
    lengths = sorted({p["seq_len"] for p in fitted})
    if len(lengths) < 2:
        # One length says nothing of the others: an H200 profile cut at seq 512 (a noisy 59 TFLOP/s)
        # priced every 4k-token plan 2.6x slow (benchmarks/results/profile-h200-quick-60s-a778b82.yaml).
        raise InputError("--time-budget", f"attention was measured at one sequence length only ({lengths[0]}, head_dim "
                                          f"{fitted[0]['head_dim']}), which cannot price other lengths: allow more time")
    fractions = [p["tflops"] / att_peak for p in fitted]
    att_fit = fit.fit_attention([p["seq_len"] for p in fitted], fractions)
    ratios = [p["bwd_tflops"] / p["tflops"] for p in fitted]
    bwd_ratio = min(1.0, statistics.median(ratios))  # the schema keeps it a fraction
    round_pt = lambda p: {k: (sig(v) if isinstance(v, float) else v) for k, v in p.items()}  # noqa: E731
    device = {
        "name": raw.device_name,
        "memory_gib": sig(raw.memory.memory_gib),
        "usable_memory_gib": sig(min(raw.memory.usable_gib, raw.memory.memory_gib)),
        "peak_tflops": {dt: sig(v) for dt, v in peaks.tflops.items()},
        "memory_bandwidth_gbs": sig(raw.copy_gbs),
        "matmul": {"max_fraction": {dt: sig(v) for dt, v in mm_fit.max_fraction.items()},
                   "half_dim": sig(mm_fit.half_dim) if mm_fit.half_dim >= 0.01 else 0.0,  # no small-dim drop
                   "points": [round_pt(p) for p in sorted(raw.matmul_points, key=lambda p: (p["dtype"], p["m"], p["n"], p["k"]))],
                   "grouped_points": [round_pt(p) for p in sorted(raw.grouped_points,
                                                                  key=lambda p: (p["dtype"], p["n"], p["k"], p["m"]))]},
        "attention": {"max_fraction": sig(att_fit.max_fraction), "half_seq": sig(att_fit.half_seq) if att_fit.half_seq >= 0.01 else 0.0,
                      "backward_ratio": sig(bwd_ratio),
                      "points": [round_pt(p) for p in sorted(raw.attention_points, key=lambda p: (p["dtype"], p["head_dim"], p["seq_len"]))],
                      # a hardware ratio, not measured here: the same part's built-in profile's (none for a CPU)
                      "flops_per_exp": load_profile(same_part).device.attention.flops_per_exp},
        "memory_bound_efficiency": sig(raw.elementwise_efficiency),
    }
    prov = {
        "device.peak_tflops": peaks.source,
        "device.memory_gib": raw.memory.source,
        "device.memory_bandwidth_gbs": "measured: copy of a buffer far larger than the last-level cache, "
                                       "(read + write bytes) / time, median over ranks",
        "device.memory_bound_efficiency": "measured: eager c = a * b bandwidth / copy bandwidth",
        "device.matmul": f"measured: {_matmul_ops(raw.dtypes)} over {len(raw.matmul_points)} (shape, dtype) points from transformer "
                         f"projections at TP degrees; median over ranks run concurrently; fit rms log error "
                         f"{mm_fit.rms_log_error:.3f}" + ("; " + "; ".join(raw.notes) if raw.notes else ""),
        "device.matmul.grouped_points": _grouped_source(raw.grouped_points),
        "device.attention": f"measured: F.scaled_dot_product_attention(is_causal=True) in {_dtypes_of(raw.attention_points)}; "
                            "points' tflops = forward rate, forward FLOPs = 2*b*h*s^2*d (causal half of 4*b*h*s^2*d); "
                            "backward FLOPs = 2.5 x forward, timed as (fwd+bwd) - fwd; backward_ratio = median "
                            f"backward / forward rate over lengths{' (capped at 1)' if min(ratios) > 1 else ''}; "
                            f"max_fraction and backward_ratio of the {raw.attention_dtype} points at the largest head_dim "
                            "and peak; the estimate uses each dtype's points (by seq_len and head_dim), forward "
                            "and backward, where measured",
        "device.attention.flops_per_exp": (f"from the built-in {same_part} (tensor FLOPs a clock "
                                           "per SM over the 16 exponentials of its special-function units; not measured)"
                                           if env.is_cuda else "none on a CPU (not measured)"),
        "overheads.context_gib": raw.memory.source.split(";")[-1].strip(),
        "overheads.host": "measured (bench/host.py): op_dispatch_s = host time per aten op of a chain of tiny "
                          "multiplies, forward and backward; python_dispatch_s = the extra per op of the same chain "
                          "on replicated DTensors; checkpoint_op_s = the extra per forward op of a chain of tanh ops "
                          "under checkpoint_wrapper (hooks and replay) over the same chain bare; sac_op_s = the "
                          "further extra per forward op of a selective policy; medians over ranks; on a GPU the "
                          "estimate prices them where they outlast the kernels (the host runs ahead)",
    }
    prov["overheads.in_step"] = _in_step_source(raw)
    if raw.host_link is not None:
        # Activation offloading writes one way in the forward and reads the other in the backward; the profile
        # keeps one rate for both, the slower.
        device["host_link_gbs"] = sig(min(raw.host_link.values()))
        prov["device.host_link_gbs"] = (f"measured: {HOST_LINK_BYTES >> 20} MiB copies between the device and pinned "
                                        f"host memory, every rank at once, median over ranks: device to host "
                                        f"{raw.host_link['d2h_gbs']:.1f} GB/s, host to device {raw.host_link['h2d_gbs']:.1f}"
                                        f" GB/s; the slower kept")
    return device, prov


def _grouped_source(points: list[dict]) -> str:
    if not points:
        return "not measured (time budget): routed experts priced as one matmul per expert"
    kernels = " and ".join(sorted({p["kernel"] for p in points}))
    return (f"measured: the routed experts' GEMMs as the runtime runs them ({kernels}: torch._grouped_mm, or a "
            f"loop of matmuls where the device has no grouped kernel), {len(points)} (groups, tokens per group, "
            "n, k, dtype) points at MoE models' expert widths; median over ranks run concurrently")


def _matmul_ops(dtypes: list[str]) -> str:
    if "fp8" not in dtypes:
        return "torch.mm"
    return ("torch.mm (fp8: torch._scaled_mm, float8_e4m3fn operands with per-tensor float32 scales, bf16 "
            "out, casts not timed)")


def matmul_summary(points: list[dict], notes: list[str]) -> str:
    """One line for the printed summary: the best measured rate per dtype, then what was not measured."""
    best: dict[str, float] = {}
    for p in points:
        best[p["dtype"]] = max(best.get(p["dtype"], 0.0), p["tflops"])
    rates = ", ".join(f"{dt} {v:.4g}" for dt, v in best.items())
    return f"matmul best TFLOP/s: {rates}" + "".join(f"; {n}" for n in notes if "matmul not measured" in n)


def _links_section(fits: dict, measured_levels: list[str], node_link: str, network_link: str,
                   copy_network: bool) -> list[dict]:
    links = []
    for level in measured_levels:
        sr = fits[level]["send_recv"]
        top = (sr.get("segments") or [sr])[-1]  # the link's bandwidth: the line of the largest messages
        links.append({"name": level, "scope": "node" if level == node_link else "cluster",
                      "bandwidth_gbs": top["bus_bandwidth_gbs"], "latency_us": sr["latency_us"]})
    if copy_network:
        links.append(dict(links[0], name=network_link, scope="cluster"))
        fits[network_link] = {c: dict(v) for c, v in fits[node_link].items()}
    return links


def _versions() -> dict[str, Any]:
    nccl = None
    if torch.cuda.is_available():
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return {**installed_versions(), "torch_runtime": str(torch.__version__),
            "cuda": None if torch.version.cuda is None else str(torch.version.cuda), "nccl": nccl,
            "gloo": None if torch.cuda.is_available() else f"bundled with torch {torch.__version__}"}


def build_profile(env: BenchEnv, opts: WorkerOptions, raw: RawResults) -> tuple[ClusterProfile, dict, dict]:
    """(profile, the dict it was built from, fit errors per level and collective)."""
    node_link = opts.node_link or ("nvlink" if env.is_cuda else "loopback")
    measured = [node_link] + ([opts.network_link] if env.nnodes >= 2 else [])
    device, prov = _device_section(raw, env)
    if env.world == 1:
        return _single_process_profile(env, opts, raw, device, prov)
    fits, errors = fit_collectives(raw.collective_points, measured)
    max_nodes = opts.max_nodes or env.nnodes
    copy_network = env.nnodes < 2 and max_nodes > 1
    links = _links_section(fits, measured, node_link, opts.network_link, copy_network)
    prov.update({
        "source": "measured by meshplan profile-cluster",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": opts.command,
        "hosts": sorted(set(env.hosts)),
        "world": {"world_size": env.world, "nnodes": env.nnodes, "local_world_size": env.local_world,
                  "backend": env.backend, "device_type": env.device.type},
        "versions": _versions(),
        "collectives": "measured: median of timed batches after a barrier, max over ranks; fitted "
                       "time = latency + bus_factor * bytes / busbw in relative error, sizes >= 1 MiB weighted "
                       "up to 10 %; node level fitted on the whole node (pairs for send_recv), network level on "
                       "one rank per node (per-device figure)",
        "collectives.fit_error_ge_1MiB": {lv: {c: {"group_size": e.group_size, "points": e.n_points,
                                                   "max_rel": sig(e.max_rel, 3), "mean_rel": sig(e.mean_rel, 3),
                                                   "median_se": None if e.noise is None else sig(e.noise, 3)}
                                               for c, e in errs.items()} for lv, errs in errors.items()},
        "links": "bandwidth and latency of each level = its send_recv fit",
        "elapsed_s": round(raw.elapsed_s, 1),
    })
    prov["collectives.segments_note"] = (f"where one latency + bandwidth line misses {TARGET:.0%} at >= 1 MiB, the "
                                         "fit has two size ranges (segments), each with its own line, and the line below them is "
                                         "refitted to the smaller messages")
    if copy_network:
        prov[f"links.{opts.network_link}"] = (f"not measured (single-node run): copied from {node_link}; "
                                              "processes on one host talk over the same link")
    if raw.skipped:
        prov["skipped"] = list(raw.skipped)
    data = {
        "name": opts.name,
        "description": opts.description or f"{env.nnodes} node(s) x {env.local_world} {device['name']}, "
                                           f"{env.backend}, measured by meshplan profile-cluster",
        "device": device,
        "devices_per_node": env.local_world,
        "max_nodes": max_nodes,
        "links": links,
        "collectives": fits,
        "overheads": {"context_gib": sig(raw.memory.context_gib, 3), **_host_overheads(raw)},
        "provenance": prov,
        "collective_points": [{k: (sig(v) if isinstance(v, float) else v) for k, v in p.items()}
                              for p in raw.collective_points],
    }
    if raw.contention is not None:
        data["overheads"]["comm_compute_slowdown"] = sig(raw.contention.slowdown, 3)
        prov["overheads.comm_compute_slowdown"] = contention_source(raw.contention, "bf16" if env.is_cuda else "fp32")
    _take_unmeasured(env, raw, data)
    # In-step terms are what a measured step leaves after what the estimate prices from this profile.
    if raw.fsdp_steps is not None:
        data["overheads"].update(_in_step_overheads(raw, profile_from_dict(data, "measured profile")))
    if raw.pipeline_steps:
        data["overheads"].update(_pipeline_overheads(raw, profile_from_dict(data, "measured profile")))
        prov["overheads.pipeline"] = _pipeline_source(raw)
    return profile_from_dict(data, "measured profile"), data, errors


def _single_process_profile(env: BenchEnv, opts: WorkerOptions, raw: RawResults, device: dict,
                            prov: dict) -> tuple[ClusterProfile, dict, dict]:
    """One process measures the device alone: links and collectives come from the built-in
    profile of the same part, and the provenance says so."""
    donor_name = nearest_builtin(raw.device_name, env.is_cuda)
    donor = load_profile(donor_name).to_dict()
    prov.update({
        "source": "measured by meshplan profile-cluster (1 process)",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": opts.command,
        "hosts": sorted(set(env.hosts)),
        "world": {"world_size": 1, "nnodes": 1, "local_world_size": 1, "backend": env.backend,
                  "device_type": env.device.type},
        "versions": _versions(),
        "collectives": f"not measured (1 process): links and collectives taken from the built-in {donor_name}",
        "elapsed_s": round(raw.elapsed_s, 1),
    })
    data = {
        "name": opts.name,
        "description": opts.description or f"1 x {device['name']}, measured alone by meshplan profile-cluster; "
                                           f"links and collectives from {donor_name}",
        "device": device,
        "devices_per_node": donor["devices_per_node"],
        "max_nodes": opts.max_nodes or donor["max_nodes"],
        "links": donor["links"],
        "collectives": donor["collectives"],
        "overheads": {"context_gib": sig(raw.memory.context_gib, 3), **_host_overheads(raw)},
        "provenance": prov,
    }
    _take_unmeasured(env, raw, data)
    return profile_from_dict(data, "measured profile"), data, {}


def _take_unmeasured(env: BenchEnv, raw: RawResults, data: dict) -> None:
    """On a GPU, the step's fitted and sourced terms from the built-in of the same part (bench/unmeasured.py)."""
    if env.is_cuda:
        donor = nearest_builtin(raw.device_name, gpu=True)
        take_unmeasured(data, donor, same_part=donor == nearest_builtin(raw.device_name))


def _host_overheads(raw: RawResults) -> dict[str, float]:
    return {k: sig(v, 3) for k, v in asdict(raw.host).items()}


def _pipeline_overheads(raw: RawResults, prof: ClusterProfile) -> dict[str, float]:
    """Per-action host time of each pipelining runtime, read through the estimate's own schedule simulation
    and p2p time (bench/pipeline.py)."""
    p2p = p2p_time(prof, pipeline_payload_bytes(), crosses_node=False)
    names = {1: "pipeline_action_s", 2: "pipeline_multi_action_s"}
    return {names[r["v"]]: sig(action_seconds(r, p2p), 3) for r in raw.pipeline_steps}


def _pipeline_source(raw: RawResults) -> str:
    steps = ", ".join(f"{r['schedule']} ({r['v']} stage(s) per rank) {r['step_s'] * 1e3:.2f} ms"
                      for r in raw.pipeline_steps)
    r = raw.pipeline_steps[0]
    return (f"measured (bench/pipeline.py): the world as one pipeline of one-linear stages, {r['m']} micro-batches: "
            f"{steps} per step (slowest rank, median over rounds); per action = the time at which the estimate's "
            "schedule simulation, with the profile's p2p time, gives that step")


def _in_step_overheads(raw: RawResults, prof: ClusterProfile) -> dict[str, float]:
    """CPU: nothing hides a collective (bench/in_step.py), and what each FSDP2 call costs in a step."""
    sync = sync_per_call(raw.fsdp_steps, raw.host.op_dispatch_s, prof)
    return {"fsdp_overlap": 0.0, "cp_overlap": 0.0, "collective_sync_s": sig(sync, 3)}


def _in_step_source(raw: RawResults) -> str:
    if raw.fsdp_steps is None:
        return ("not measured (GPU, or one process): fsdp_overlap, cp_overlap and collective_sync_s are, on a GPU, the "
                "built-in's of the same part (transferred), and on one CPU process the schema's defaults")
    return ("fsdp_overlap = cp_overlap = 0: on a CPU, FSDP2's collective streams are the one CPU stream and gloo "
            "work is waited in line (torch fsdp/_fully_shard/_fsdp_param_group.py, get_all_gather_streams); "
            "collective_sync_s measured (bench/in_step.py): per FSDP2 call of a 4-block model, its step less the "
            "unsharded step, the hook ops at op_dispatch_s and the transfers at this profile's collective fits; "
            "slowest rank per round, median over rounds")


def format_fit_table(errors: dict) -> str:
    lines = [f"{'level':<10} {'collective':<15} {'group':>5} {'points>=1MiB':>12} {'lines':>5} {'max err':>8} "
             f"{'mean err':>9} {'median se':>10} {'one line':>9}"]
    for level, errs in errors.items():
        for c, e in errs.items():
            noise = "n/a" if e.noise is None else f"{e.noise:.1%}"
            ranges = 1 if e.one_line_max_rel is None or e.one_line_max_rel == e.max_rel else 2
            one = "-" if ranges == 1 else f"{e.one_line_max_rel:.1%}"
            lines.append(f"{level:<10} {c:<15} {e.group_size:>5} {e.n_points:>12} {ranges:>5} {e.max_rel:>8.1%} "
                         f"{e.mean_rel:>9.1%} {noise:>10} {one:>9}")
    lines.append("(error of the profile's model as written; lines: 2 where one latency + bandwidth line missed "
                 "10 % and each size range got its own, 'one line' giving that line's worst error; median se: "
                 "standard error of the measured medians)")
    return "\n".join(lines)


def build_and_write(env: BenchEnv, opts: WorkerOptions, raw: RawResults, rep: Reporter) -> ClusterProfile:
    profile, data, errors = build_profile(env, opts, raw)
    atomic_write_yaml(opts.out, profile.to_dict())
    if errors:
        print(f"\nfit error of time = latency + bytes/busbw, sizes >= 1 MiB:\n{format_fit_table(errors)}")
    else:
        print(f"\ncollectives: {data['provenance']['collectives']}")
    print(f"\n{'level':<10} {'collective':<15} {'busbw GB/s':>10} {'latency us':>10}  (large messages; small)")
    for level, table in profile.collectives.items():
        for c, f in table.items():
            bw, _ = f.line_for(float("inf"))
            print(f"{level:<10} {c:<15} {bw:>10.3g} {f.latency_us:>10.4g}")
    d = profile.device
    print(f"\n{matmul_summary(raw.matmul_points, raw.notes)}")
    print(f"\ndevice {d.name}: peak {d.peak_tflops} TFLOP/s, matmul max_fraction {d.matmul.max_fraction} "
          f"half_dim {d.matmul.half_dim:g}, attention {d.attention.max_fraction:g} half_seq {d.attention.half_seq:g}, "
          f"copy {d.memory_bandwidth_gbs:g} GB/s, usable {d.usable_memory_gib:g} / {d.memory_gib:g} GiB")
    for s in raw.skipped:
        print(f"skipped: {s}", file=sys.stderr)
    print(f"wrote {opts.out} ({raw.elapsed_s:.0f} s of benchmarks)")
    sys.stdout.flush()
    return profile
