"""Per-step metrics, peak memory measurement, and the run summary (measured vs predicted).

Peak memory
-----------
Two figures per step, each the max over ranks:
  - allocated (`peak_memory_gib`): bytes of live tensors;
  - reserved (`peak_memory_reserved_gib`): what the process holds for tensors, live or cached.
CUDA: torch.cuda.max_memory_allocated() and max_memory_reserved() over the step (the caching
allocator's live bytes, and the segments it holds from the driver, which is what can run out).
CPU: reserved is None: the CPU allocator keeps no cache (freed tensors go back to the system
allocator), so there is no pool beyond the live tensors to report, and the process's resident
size would mostly count Python and libraries.

CPU allocated (no allocator statistics): `LiveTensorMemory` counts the bytes of every live tensor *storage*
on the rank's device, and keeps the maximum over the step:
  - at the start of the step it finds every live tensor reachable from Python (gc scan): parameters
    (for DTensor / FSDP2 the local shard's whole storage, including FSDP2's padding), gradients,
    optimizer state (exp_avg, exp_avg_sq, step), pipeline-stage buffers, the data batch;
  - during the step it is a TorchDispatchMode that registers the storage of every op output
    (activations, saved tensors, all-gathered parameters, communication buffers, recomputed
    activations, optimizer temporaries); tensor subclasses (DTensor, float8) count their inner
    plain tensors;
  - after every op it sums storage.nbytes() over the live storages (weakly referenced, so a freed
    storage drops out; FSDP2 frees unsharded parameters by resizing their storage to 0, which
    nbytes() sees), and keeps the maximum.
Storages are counted once however many views share them. Not counted: memory that is not a torch
tensor (gloo's internal buffers, Python objects), and tensors allocated and freed inside a single
op's kernel or inside a tensor subclass's own dispatch (e.g. DTensor's local temporaries), which
are transient. The per-rank peak is reduced with MAX over all ranks.
Compiled blocks are not counted: under a dispatch mode dynamo runs them uncompiled, op by op, so the
count would be eager memory (runtime/train.py counts_live_tensors); such CPU runs report null.
Tracking costs a Python sum per op, so by default it runs only on the timing warm-up steps (which
are excluded from the timing medians) and later rows repeat the largest peak seen; rows say
`memory_tracked`. `--track-memory all` tracks every step.
"""

from __future__ import annotations

import gc
import json
import statistics
import warnings
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten



def saved_activations(module: Any, x: torch.Tensor) -> list[torch.Tensor]:
    """What autograd saves for backward while `module` runs forward on `x` (batch, seq, dim): one tensor per
    storage, the module's parameters aside, and only activation-sized ones (two dimensions or more, at least
    an element per token), not RoPE's (seq, d/2) tables. A compiled module should have compiled already:
    the hooks would see the tracing too. Read by the activation inventory's checks and by
    benchmarks/saved_tensors.py."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    tokens = x.numel() // x.shape[-1]
    seen: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params and t.dim() >= 2 and t.numel() >= tokens:
            seen[ptr] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return list(seen.values())


def plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `t`'s data (recursing through DTensor / float8 subclasses)."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        out = []
        for name in names:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):
                out += plain_tensors(inner)
        return out
    return [t]


class LiveTensorMemory(TorchDispatchMode):
    """Peak bytes of live tensor storages on one device during a `with` block (see module doc)."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = torch.device(device)
        self.live: dict[int, weakref.ref] = {}
        self.peak = 0

    def _add(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            return
        for plain in plain_tensors(t):
            # Meta and fake tensors hold no memory: torch.compile's tracing leaves fake ones alive, whose
            # sizes may be symbolic (a later `with` would otherwise sum SymInts).
            if plain.device.type != self.device.type or plain.is_meta or isinstance(plain, FakeTensor):
                continue
            st = plain.untyped_storage()
            key = st._cdata
            if key not in self.live:
                self.live[key] = weakref.ref(st, lambda _, key=key: self.live.pop(key, None))

    def current(self) -> int:
        total = 0
        for ref in list(self.live.values()):
            st = ref()
            if st is not None:
                total += st.nbytes()
        return total

    def __enter__(self) -> "LiveTensorMemory":
        gc.collect()
        with warnings.catch_warnings():  # isinstance on some lazily-imported objects warns
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():
                if isinstance(obj, torch.Tensor):
                    self._add(obj)
        self.peak = self.current()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self._add(t)
        # Inputs too: covers storages that FSDP2 resized up outside any op before writing to them.
        for t in tree_flatten((args, kwargs))[0]:
            self._add(t)
        self.peak = max(self.peak, self.current())
        return out


@dataclass
class StepMetrics:
    step: int
    loss: float
    grad_norm: float
    lr: float
    step_time_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    peak_memory_gib: float | None  # allocated
    memory_tracked: bool
    peak_memory_reserved_gib: float | None = None  # None on CPU (see the module doc)
    # MoE models only (runtime/moe.py RoutingStats): routed token-expert pairs per expert over the global
    # batch (min, mean, max over layers and experts), the busiest EP rank's load over the mean rank's,
    # and the router's aux loss (per micro-batch, summed over layers, before its coefficient).
    tokens_per_expert: list[float] | None = None
    moe_imbalance: float | None = None
    aux_loss: float | None = None

    def line(self) -> str:
        mfu = f"{self.mfu:.1%}" if self.mfu is not None else "n/a"
        mem = f"{self.peak_memory_gib * 1024:.2f} MiB" if self.peak_memory_gib is not None else "n/a"
        moe = (f"  experts {self.tokens_per_expert[0]:.0f}/{self.tokens_per_expert[1]:.0f}/{self.tokens_per_expert[2]:.0f} "
               f"tok (min/mean/max)  aux {self.aux_loss:.4f}" if self.tokens_per_expert is not None else "")
        return (f"step {self.step:5d}  loss {self.loss:.5f}  grad_norm {self.grad_norm:.3f}  lr {self.lr:.2e}  "
                f"step {self.step_time_s * 1000:.1f} ms  {self.tokens_per_s_per_gpu:,.0f} tok/s/gpu  "
                f"mfu {mfu}  peak {mem}{moe}")


def step_mfu(plan: Any, tokens_per_s_per_device: float) -> float | None:
    """MFU of one step by the cost model's one definition (cost_models/mfu.py); None without a profile."""
    from meshplan.cost_models.mfu import mfu

    profile = load_profile_or_none(plan.cluster)
    return None if profile is None else mfu(plan.model, plan.training.seq_len, tokens_per_s_per_device, profile)


def predicted(plan: Any) -> tuple[dict | None, str | None]:
    """What `meshplan estimate --plan P` predicts for the plan that ran (its dtype, its cluster
    profile), or (None, why not). A runnable plan is complete, and for a complete plan the
    estimate command is estimate_plan(plan, its profile): the same call, not a second model."""
    try:
        from meshplan.cost_models.estimate import estimate_plan
        from meshplan.profiles import load_profile

        est = estimate_plan(plan, load_profile(plan.cluster))
        return {"step_time_s": est.step_time_s, "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu, "mfu": est.mfu,
                "peak_memory_gib": est.peak_memory_gib, "peak_memory_allocated_gib": est.allocated_peak_gib,
                "peak_memory_reserved_gib": est.reserved_peak_gib,
                "memory_gib": dict(getattr(est, "memory_gib", {}) or {}),
                "moe": getattr(est, "moe", None),
                "dtype": str(plan.training.dtype), "cluster": str(plan.cluster)}, None
    except Exception as exc:
        return None, f"{exc.__class__.__name__}: {exc}"


def load_profile_or_none(cluster: str) -> Any:
    try:
        from meshplan.profiles import load_profile

        return load_profile(cluster)
    except Exception:
        return None


class MetricsLog:
    """Rank 0 only: appends rows to DIR/metrics.jsonl and prints them."""

    def __init__(self, out: str | None, quiet: bool, append: bool):
        self.path = Path(out) / "metrics.jsonl" if out else None
        self.quiet = quiet
        self.rows: list[StepMetrics] = []
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not append:
                self.path.write_text("")

    def log(self, row: StepMetrics) -> None:
        self.rows.append(row)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps(asdict(row)) + "\n")
        if not self.quiet:
            print(row.line(), flush=True)


def measured_summary(rows: list[StepMetrics], warmup: int) -> dict[str, Any]:
    """Medians over the steps after `warmup` (all steps if there are no others); peak memory
    (allocated and reserved) is the max over the steps where it was tracked."""
    timed = rows[warmup:] or rows
    mem = [r.peak_memory_gib for r in rows if r.memory_tracked and r.peak_memory_gib is not None]
    reserved = [r.peak_memory_reserved_gib for r in rows if r.memory_tracked and r.peak_memory_reserved_gib is not None]
    out = {
        "step_time_s": statistics.median(r.step_time_s for r in timed),
        "tokens_per_s_per_gpu": statistics.median(r.tokens_per_s_per_gpu for r in timed),
        "peak_memory_gib": max(mem) if mem else None,
        "peak_memory_reserved_gib": max(reserved) if reserved else None,
        "steps_in_median": [r.step for r in timed],
        "final_loss": rows[-1].loss,
    }
    if rows[-1].tokens_per_expert is not None:
        # Over every step: the router is what it is from the first step, and an MoE run's warm-up is short.
        out["tokens_per_expert"] = {name: statistics.mean(r.tokens_per_expert[i] for r in rows)
                                    for i, name in enumerate(("min", "mean", "max"))}
        out["moe_imbalance"] = statistics.mean(r.moe_imbalance for r in rows)
        out["aux_loss"] = rows[-1].aux_loss
    return out


def ratios(measured: dict[str, Any], pred: dict[str, Any] | None) -> dict[str, float | None]:
    """measured / predicted per metric."""
    out: dict[str, float | None] = {}
    for key in ("step_time_s", "tokens_per_s_per_gpu", "peak_memory_gib"):
        m, p = measured.get(key), (pred or {}).get(key)
        if key == "peak_memory_gib":  # measured allocated against predicted tensors: the same quantity
            p = (pred or {}).get("peak_memory_allocated_gib", p)
        out[key] = (m / p) if (m is not None and p) else None
    return out
