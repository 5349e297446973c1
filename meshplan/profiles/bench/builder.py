"""Rank 0: fit the raw measurements, assemble the ClusterProfile, write it atomically, print the fit errors."""

from __future__ import annotations

import datetime as _dt
import sys
from dataclasses import replace
from typing import Any

import torch

from meshplan.errors import InputError
from meshplan.profiles import fit
from meshplan.profiles.bench.collectives import bus_factor
from meshplan.profiles.bench.env import BenchEnv
from meshplan.profiles.bench.peaks import cores_per_device, cpu_peaks, gpu_datasheet_peaks, resolve_peaks
from meshplan.profiles.bench.progress import Reporter
from meshplan.profiles.bench.worker import RawResults, WorkerOptions
from meshplan.profiles.schema import COLLECTIVES, ClusterProfile, profile_from_dict
from meshplan.profiles.versions import installed_versions
from meshplan.yamlio import atomic_write_yaml


def sig(x: float, digits: int = 4) -> float:
    """Round to significant digits: the profile stays readable and round-trips exactly through YAML."""
    return float(f"{float(x):.{digits}g}")


def fit_collectives(points: list[dict], levels: list[str]) -> tuple[dict, dict]:
    """Per level and collective: the fit over the largest group (pairs for send_recv), and its error."""
    fits: dict[str, dict[str, dict]] = {}
    errors: dict[str, dict[str, fit.FitError]] = {}
    for level in levels:
        fits[level], errors[level] = {}, {}
        for c in COLLECTIVES:
            ps = [p for p in points if p["level"] == level and p["collective"] == c]
            sizes = sorted({p["group_size"] for p in ps})
            if not sizes:
                raise InputError("time-budget", f"no {c} measurement on {level}: allow more time")
            n = sizes[0] if c == "send_recv" else sizes[-1]
            ps = sorted((p for p in ps if p["group_size"] == n), key=lambda p: p["bytes"])
            if len(ps) < 2:
                raise InputError("time-budget", f"only {len(ps)} {c} size(s) on {level}: allow more time")
            b = [p["bytes"] for p in ps]
            x = [p["bytes"] * bus_factor(c, n) for p in ps]
            t = [p["time_s"] for p in ps]
            f = fit.fit_latency_bandwidth(b, x, t)
            fits[level][c] = {"bus_bandwidth_gbs": sig(f.busbw_gbs), "latency_us": sig(f.latency_s * 1e6)}
            # errors of the fit as written (rounded), over the group the fit describes
            written = fit.LinearFit(fits[level][c]["latency_us"] * 1e-6, 1e-9 / fits[level][c]["bus_bandwidth_gbs"])
            errors[level][c] = replace(fit.fit_error(written, b, x, t), group_size=n)
    return fits, errors


def _device_section(raw: RawResults, env: BenchEnv) -> tuple[dict, dict]:
    best = {dt: max(p["tflops"] for p in raw.matmul_points if p["dtype"] == dt)
            for dt in raw.dtypes if any(p["dtype"] == dt for p in raw.matmul_points)}
    if not best:
        raise InputError("time-budget", "no matmul measurement finished: allow more time")
    guess = gpu_datasheet_peaks(raw.device_name) if env.is_cuda else cpu_peaks(cores_per_device(env.local_world), list(best))
    peaks = resolve_peaks(guess, best)
    mm_fit = fit.fit_matmul(raw.matmul_points, peaks.tflops)
    att_peak = peaks.tflops[raw.attention_dtype]
    fractions = [p["tflops"] / att_peak for p in raw.attention_points]
    att_fit = fit.fit_attention([p["seq_len"] for p in raw.attention_points], fractions)
    round_pt = lambda p: {k: (sig(v) if isinstance(v, float) else v) for k, v in p.items()}  # noqa: E731
    device = {
        "name": raw.device_name,
        "memory_gib": sig(raw.memory.memory_gib),
        "usable_memory_gib": sig(min(raw.memory.usable_gib, raw.memory.memory_gib)),
        "peak_tflops": {dt: sig(v) for dt, v in peaks.tflops.items()},
        "memory_bandwidth_gbs": sig(raw.copy_gbs),
        "matmul": {"max_fraction": {dt: sig(v) for dt, v in mm_fit.max_fraction.items()},
                   "half_dim": sig(mm_fit.half_dim),
                   "points": [round_pt(p) for p in sorted(raw.matmul_points, key=lambda p: (p["dtype"], p["m"], p["n"], p["k"]))]},
        "attention": {"max_fraction": sig(att_fit.max_fraction), "half_seq": sig(att_fit.half_seq),
                      "points": [round_pt(p) for p in sorted(raw.attention_points, key=lambda p: p["seq_len"])]},
        "memory_bound_efficiency": sig(raw.elementwise_efficiency),
    }
    prov = {
        "device.peak_tflops": peaks.source,
        "device.memory_gib": raw.memory.source,
        "device.memory_bandwidth_gbs": "measured: copy of a buffer far larger than the last-level cache, "
                                       "(read + write bytes) / time, median over ranks",
        "device.memory_bound_efficiency": "measured: eager c = a * b bandwidth / copy bandwidth",
        "device.matmul": f"measured: torch.mm over {len(raw.matmul_points)} (shape, dtype) points from transformer "
                         f"projections at TP degrees; median over ranks run concurrently; fit rms log error "
                         f"{mm_fit.rms_log_error:.3f}" + ("; " + "; ".join(raw.notes) if raw.notes else ""),
        "device.attention": f"measured: F.scaled_dot_product_attention(is_causal=True) fwd+bwd in {raw.attention_dtype}; "
                            "FLOPs = 3.5 x causal forward (2*b*h*s^2*d), FlashAttention convention; "
                            f"fraction of the {raw.attention_dtype} peak",
        "overheads.context_gib": raw.memory.source.split(";")[-1].strip(),
    }
    return device, prov


def _links_section(fits: dict, measured_levels: list[str], node_link: str, network_link: str,
                   copy_network: bool) -> list[dict]:
    links = []
    for level in measured_levels:
        sr = fits[level]["send_recv"]
        links.append({"name": level, "scope": "node" if level == node_link else "cluster",
                      "bandwidth_gbs": sr["bus_bandwidth_gbs"], "latency_us": sr["latency_us"]})
    if copy_network:
        links.append(dict(links[0], name=network_link, scope="cluster"))
        fits[network_link] = {c: dict(v) for c, v in fits[node_link].items()}
    return links


def _versions() -> dict[str, Any]:
    nccl = None
    if torch.cuda.is_available():
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return {**installed_versions(), "torch_runtime": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
            "gloo": f"bundled with torch {torch.__version__}" if not torch.cuda.is_available() else None}


def build_profile(env: BenchEnv, opts: WorkerOptions, raw: RawResults) -> tuple[ClusterProfile, dict, dict]:
    """(profile, the dict it was built from, fit errors per level and collective)."""
    node_link = opts.node_link or ("nvlink" if env.is_cuda else "loopback")
    measured = [node_link] + ([opts.network_link] if env.nnodes >= 2 else [])
    fits, errors = fit_collectives(raw.collective_points, measured)
    max_nodes = opts.max_nodes or env.nnodes
    copy_network = env.nnodes < 2 and max_nodes > 1
    links = _links_section(fits, measured, node_link, opts.network_link, copy_network)
    device, prov = _device_section(raw, env)
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
                       "up to 10 %; fit over the largest group per level (pairs for send_recv)",
        "collectives.fit_error_ge_1MiB": {lv: {c: {"group_size": e.group_size, "points": e.n_points,
                                                   "max_rel": sig(e.max_rel, 3), "mean_rel": sig(e.mean_rel, 3)}
                                               for c, e in errs.items()} for lv, errs in errors.items()},
        "links": "bandwidth and latency of each level = its send_recv fit",
        "elapsed_s": round(raw.elapsed_s, 1),
    })
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
        "overheads": {"context_gib": sig(raw.memory.context_gib, 3)},
        "provenance": prov,
        "collective_points": [{k: (sig(v) if isinstance(v, float) else v) for k, v in p.items()}
                              for p in raw.collective_points],
    }
    return profile_from_dict(data, "measured profile"), data, errors


def format_fit_table(errors: dict) -> str:
    lines = [f"{'level':<10} {'collective':<15} {'group':>5} {'points>=1MiB':>12} {'max err':>8} {'mean err':>9}"]
    for level, errs in errors.items():
        for c, e in errs.items():
            lines.append(f"{level:<10} {c:<15} {e.group_size:>5} {e.n_points:>12} {e.max_rel:>8.1%} {e.mean_rel:>9.1%}")
    return "\n".join(lines)


def build_and_write(env: BenchEnv, opts: WorkerOptions, raw: RawResults, rep: Reporter) -> ClusterProfile:
    profile, _, errors = build_profile(env, opts, raw)
    atomic_write_yaml(opts.out, profile.to_dict())
    print(f"\nfit error of time = latency + bytes/busbw, sizes >= 1 MiB:\n{format_fit_table(errors)}")
    print(f"\n{'level':<10} {'collective':<15} {'busbw GB/s':>10} {'latency us':>10}")
    for level, table in profile.collectives.items():
        for c, f in table.items():
            print(f"{level:<10} {c:<15} {f.bus_bandwidth_gbs:>10.3g} {f.latency_us:>10.4g}")
    d = profile.device
    print(f"\ndevice {d.name}: peak {d.peak_tflops} TFLOP/s, matmul max_fraction {d.matmul.max_fraction} "
          f"half_dim {d.matmul.half_dim:g}, attention {d.attention.max_fraction:g} half_seq {d.attention.half_seq:g}, "
          f"copy {d.memory_bandwidth_gbs:g} GB/s, usable {d.usable_memory_gib:g} / {d.memory_gib:g} GiB")
    for s in raw.skipped:
        print(f"skipped: {s}", file=sys.stderr)
    print(f"wrote {opts.out} ({raw.elapsed_s:.0f} s of benchmarks)")
    sys.stdout.flush()
    return profile
