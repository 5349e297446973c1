"""How busy the GPU was in a profiled step: from a chrome trace (meshplan run --profile-steps), the
union of the GPU kernel and memcpy intervals against the step's span, the kernel count, the CUDA
runtime calls that synchronise or copy ("blocking_calls": the synchronizes and cudaMemcpy, which block
the host, and cudaMemcpyAsync, which blocks it only for a device-to-host read into pageable memory), and
the longest gaps with no GPU work. A step whose busy share is low is bound by the host (eager
launch overhead, syncs), which a per-kernel cost model does not see.

    python benchmarks/trace_busy.py run/profile/rank0_step2.json [more traces]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpyAsync",
            "cudaEventSynchronize")


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intervals (start, end) with the overlapping ones joined, in order."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by intervals (start, end), overlaps counted once."""
    return sum(e - s for s, e in merged(intervals))


def summarise(trace: Path) -> dict:
    events = json.loads(trace.read_text())["traceEvents"]
    gpu = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATS]
    kernels = sum(1 for e in events if e.get("ph") == "X" and e.get("cat") == "kernel")
    runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")]
    blocking = [e for e in runtime if any(e.get("name", "").startswith(b) for b in BLOCKING)]
    host = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    span_s, span_e = min(s for s, _ in host + gpu), max(e for _, e in host + gpu)
    busy = union_length(gpu)
    busy_spans = merged(gpu)
    gaps = sorted((b[0] - a[1] for a, b in zip(busy_spans, busy_spans[1:])), reverse=True)
    return {"trace": trace.name, "span_ms": (span_e - span_s) / 1e3, "gpu_busy_ms": busy / 1e3,
            "busy_share": busy / (span_e - span_s), "kernels": kernels,
            "blocking_calls": len(blocking), "blocking_ms": sum(e["dur"] for e in blocking) / 1e3,
            "gaps_over_50us": sum(1 for g in gaps if g > 50), "gap_ms_total": sum(gaps) / 1e3,
            "top_gaps_ms": [round(g / 1e3, 2) for g in gaps[:5]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    for trace in ap.parse_args().traces:
        print(json.dumps(summarise(trace)))


if __name__ == "__main__":
    main()
