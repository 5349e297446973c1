"""Matmul shapes the cost model asks about: a transformer layer's projections at TP degrees and token counts."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Width:
    """The widths of one model that set its GEMM shapes."""

    dim: int
    ffn_dim: int
    n_heads: int
    n_kv_heads: int

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * (self.dim // self.n_heads)


# Llama 3.1 8B / 70B / 405B (Meta params.json) for GPUs; the small CPU models of the registry and two
# widths between them for CPUs, where a 4096-wide layer takes seconds per GEMM.
GPU_WIDTHS = (Width(4096, 14336, 32, 8), Width(8192, 28672, 64, 8), Width(16384, 53248, 128, 8))
CPU_WIDTHS = (Width(256, 704, 8, 4), Width(512, 1408, 8, 4), Width(1024, 2816, 16, 8))
GPU_TP, CPU_TP = (1, 2, 4, 8), (1, 2)
GPU_TOKENS, CPU_TOKENS = (2048, 8192), (256, 1024)  # micro-batch x sequence length


def layer_gemms(w: Width, tp: int, tokens: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of the forward projections of one layer with TP degree `tp` (column then row parallel)."""
    return [
        (tokens, (w.dim + 2 * w.kv_dim) // tp, w.dim),  # fused QKV
        (tokens, w.dim, w.dim // tp),  # attention output
        (tokens, w.ffn_dim // tp, w.dim),  # FFN up (and gate)
        (tokens, w.dim, w.ffn_dim // tp),  # FFN down
    ]


def matmul_grid(cuda: bool, quick: bool) -> list[tuple[int, int, int]]:
    """Distinct shapes in a fixed shuffled order, so a budget cut keeps small and large ones alike."""
    widths, tps, tokens = (GPU_WIDTHS, GPU_TP, GPU_TOKENS) if cuda else (CPU_WIDTHS, CPU_TP, CPU_TOKENS)
    shapes = {s for w in widths for tp in tps for t in tokens for s in layer_gemms(w, tp, t)}
    big = (8192, 8192, 8192) if cuda else (1024, 1024, 1024)  # square anchor near the device's best rate
    ordered = sorted(shapes - {big})
    random.Random(0).shuffle(ordered)
    if quick:
        ordered = ordered[: len(ordered) // 3]
    return [big] + ordered


# Routed experts' grouped GEMMs (runtime/moe.py GroupedExperts): (experts on a rank, tokens per expert,
# out, in) for gate/up (in = hidden) and down (out = hidden). GPUs: Qwen3-30B-A3B (2048, 768),
# Qwen3-235B-A22B (4096, 1536) and DeepSeek-V3 (7168, 2048) widths (their config.json); CPUs: the
# tiny MoE models' widths (256, 512).
GPU_EXPERT_WIDTHS, CPU_EXPERT_WIDTHS = ((2048, 768), (4096, 1536), (7168, 2048)), ((256, 512),)
GPU_EXPERT_TOKENS, CPU_EXPERT_TOKENS = (64, 256, 1024, 4096), (16, 64, 256)
GPU_GROUPS, CPU_GROUPS = 8, 4


def grouped_grid(cuda: bool, quick: bool) -> list[tuple[int, int, int, int]]:
    """(groups, tokens per group, n, k) of the routed experts' GEMMs, in a fixed shuffled order (a budget
    cut keeps thin and thick groups alike); --quick keeps about half."""
    widths, tokens, groups = ((GPU_EXPERT_WIDTHS, GPU_EXPERT_TOKENS, GPU_GROUPS) if cuda
                              else (CPU_EXPERT_WIDTHS, CPU_EXPERT_TOKENS, CPU_GROUPS))
    shapes = sorted({(groups, m, n, k) for d, w in widths for m in tokens for n, k in ((w, d), (d, w))})
    random.Random(0).shuffle(shapes)
    return shapes[: (len(shapes) + 1) // 2] if quick else shapes


def grouped_matmul_dtypes(dtypes: list[str], cuda: bool) -> list[str]:
    """The dtypes MoE layers train in where measured: bf16 on a GPU (float8 grouped GEMMs are refused,
    specs/rules.py), every measured dtype but fp8 on a CPU."""
    if cuda:
        return [dt for dt in dtypes if dt == "bf16"]
    return [dt for dt in dtypes if dt != "fp8"]


def attention_dtypes(dtypes: list[str], cuda: bool) -> tuple[str, list[str]]:
    """(the dtype attention's max_fraction is fitted in, every dtype it is measured in). A GPU trains
    attention in bf16; a CPU run may train in fp32 or bf16, and its bf16 attention kernels do not
    follow the bf16 GEMM's speed-up (cost_models/compute.py attention_tflops), so both are measured."""
    if cuda:
        primary = "bf16" if "bf16" in dtypes else "fp32"
        return primary, [primary]
    return "fp32", ["fp32"] + [dt for dt in ("bf16",) if dt in dtypes]


def attention_head_dims(cuda: bool, quick: bool) -> list[int]:
    """Head sizes attention is timed at: 128 on GPUs (every Llama); on CPUs the small models trained
    there too (16: tiny-4l), whose kernels run at about half the FLOP rate of 64."""
    if cuda:
        return [128]
    return [16, 64] if quick else [16, 64, 128]


def attention_seq_lens(cuda: bool, quick: bool) -> list[int]:
    if cuda:
        return [512, 1024, 2048, 4096, 8192] if quick else [512, 1024, 2048, 4096, 8192, 16384]
    return [128, 256, 512, 1024] if quick else [128, 256, 512, 1024, 2048]
