"""Peak TFLOP/s of the device: datasheet table for GPUs, cores x SIMD FMA width x clock for CPUs."""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# package data (meshplan/data/published), found the same way as the cost model's published tables
PEAK_CSV = resources.files("meshplan.data.published").joinpath("hw_peak_dense_tflops.csv")
DTYPE_COLUMNS = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass
class Peaks:
    tflops: dict[str, float]
    source: str  # provenance text


def gpu_datasheet_peaks(device_name: str) -> Peaks | None:
    """Dense peaks for a CUDA device name like 'NVIDIA H100 80GB HBM3' from the shared published table."""
    chip = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", device_name.upper())
    if chip is None or not PEAK_CSV.is_file():
        return None
    form = "PCIE" if "PCIE" in device_name.upper() else "SXM"
    with PEAK_CSV.open() as f:
        for row in csv.DictReader(f):
            acc = row["Accelerator"].upper().split()
            if chip.group(1) in acc and form in acc:
                peaks = {}
                for dt in DTYPE_COLUMNS:
                    try:
                        peaks[dt] = float(row[dt])
                    except (TypeError, ValueError):
                        continue  # 'X' = not supported
                return Peaks(peaks, f"datasheet: {row['Accelerator']} dense peaks (hw_peak_dense_tflops.csv)")
    return None


def _cpuinfo() -> tuple[float | None, set[str]]:
    """Clock (MHz) and feature flags from /proc/cpuinfo (Linux); (None, {}) elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None, set()
    mhz = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return (float(mhz.group(1)) if mhz else None), set(flags.group(1).split() if flags else ())


def cpu_peaks(cores_per_device: float, dtypes: list[str]) -> Peaks | None:
    """cores x fp32 FLOPs/cycle x clock; two FMA pipes per core assumed (Zen 2+, Intel since Haswell)."""
    mhz, flags = _cpuinfo()
    if mhz is None:
        return None
    if "avx512f" in flags:
        per_cycle, isa = 2 * 16 * 2, "AVX-512"
    elif "avx2" in flags and "fma" in flags:
        per_cycle, isa = 2 * 8 * 2, "AVX2+FMA"
    else:
        per_cycle, isa = 2 * 4 * 2, "SSE"
    fp32 = cores_per_device * per_cycle * mhz * 1e6 / 1e12
    peaks = {"fp32": fp32}
    if "bf16" in dtypes:
        # AVX512-BF16 doubles the rate; without it bf16 is converted to fp32 and cannot be faster
        peaks["bf16"] = fp32 * (2 if "avx512_bf16" in flags else 1)
    src = (f"computed: {cores_per_device:g} core(s) per device x {per_cycle} fp32 FLOP/cycle ({isa}, 2 FMA pipes "
           f"assumed) x {mhz:.0f} MHz (/proc/cpuinfo)")
    return Peaks(peaks, src)


def cores_per_device(local_world: int) -> float:
    return max(1, (os.cpu_count() or 1) // local_world)


def resolve_peaks(guess: Peaks | None, best_measured: dict[str, float]) -> Peaks:
    """Use the datasheet / computed peak unless a measurement beats it; then best measured x 1.1."""
    tflops, notes = {}, []
    for dt, best in best_measured.items():
        p = (guess.tflops.get(dt) if guess else None)
        if p is None or p < best:
            tflops[dt] = best * 1.1
            notes.append(f"{dt}: best measured x 1.1" + (" (measured beat the computed peak)" if p else ""))
        else:
            tflops[dt] = p
    # only measured dtypes: a peak without a fitted matmul fraction would leave the cost model guessing
    source = "; ".join(([guess.source] if guess else []) + notes)
    return Peaks(tflops, source)
