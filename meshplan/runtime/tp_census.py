"""What inductor made of the tensor-parallel collectives in the compiled blocks: a post-grad pass that counts,
in every graph inductor compiles in this process, the TP collectives left as they were and the ones its
micro-pipeline pass (async TP, torch/_inductor/fx_passes/micro_pipeline_tp.py) fused with their matmuls.

A plan that says async TP is priced with part of its TP traffic hidden; this census is how a run proves the
fusion happened (fused ops > 0) rather than that a config flag was set. `meshplan run` writes it into the
summary's `measured.compiled_tp_ops` for compiled TP plans; benchmarks/gpu_truth.py shows it. The pass runs
after micro_pipeline_tp (inductor's post_grad_custom_post_pass), and opts out of inductor's FX graph cache
(uuid None), so a graph loaded from the cache is compiled, and counted, again.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The functional collectives TP's DTensor redistributions trace to, and what micro_pipeline_tp fuses them
# into (bf16; the scaled ones under float8).
TP_COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")
FUSED_TP_OPS = ("fused_all_gather_matmul", "fused_all_gather_scaled_matmul", "fused_matmul_reduce_scatter",
                "fused_scaled_matmul_reduce_scatter")

_SEEN: Counter[str] = Counter()
_INSTALLED: list[bool] = [False]


def op_name(target: object) -> str:
    """The op's name without its namespace or overload: torch.ops.symm_mem.fused_all_gather_matmul.default
    -> fused_all_gather_matmul."""
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0]


def count_graph(graph: torch.fx.Graph) -> Counter[str]:
    """The TP collectives and fused TP ops among a graph's calls."""
    names = (op_name(n.target) for n in graph.nodes if n.op == "call_function")
    return Counter(n for n in names if n in TP_COLLECTIVES or n in FUSED_TP_OPS)


def census_pass():
    """The pass: adds each post-grad graph's counts to the process's census, changing nothing in the graph.
    Built on first use: importing inductor costs a second or more, which an eager run need not pay."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class TPCensus(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            _SEEN.update(count_graph(graph))
            _SEEN["graphs"] += 1

        def uuid(self) -> None:
            return None  # not cacheable: every compiled graph passes through here

    return TPCensus()


def install() -> None:
    """Count from now on (before the blocks are first compiled: compilation is lazy, at the first step)."""
    import torch._inductor.config as inductor_config

    if not _INSTALLED[0]:
        inductor_config.post_grad_custom_post_pass = census_pass()
        _INSTALLED[0] = True


def census() -> dict[str, int] | None:
    """Counts so far, every name present (0 where none was seen), and the graphs counted ("graphs": 0 means
    nothing was compiled); None where no census was installed."""
    return {name: _SEEN[name] for name in ("graphs",) + TP_COLLECTIVES + FUSED_TP_OPS} if _INSTALLED[0] else None


def fused(counts: dict[str, int]) -> int:
    """TP collectives fused with their matmuls, in a census."""
    return sum(counts.get(name, 0) for name in FUSED_TP_OPS)


def unfused(counts: dict[str, int]) -> int:
    """TP collectives left on their own, in a census."""
    return sum(counts.get(name, 0) for name in TP_COLLECTIVES)
