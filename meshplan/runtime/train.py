"""The training loop of one rank: mesh -> model parts -> AdamW + warm-up/cosine LR -> steps
(gradient accumulation or a pipeline schedule) -> clipped update -> metrics and checkpoints."""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from meshplan.runtime import checkpoint
from meshplan.runtime.context_parallel import shard_sequence
from meshplan.runtime.data import BatchSpec, local_rows, make_source
from meshplan.runtime.faults import maybe_fail
from meshplan.runtime.float8 import register_precompute
from meshplan.runtime.mesh import ParallelDims, build_mesh
from meshplan.runtime.moe import RoutingStats, combine_over_stages, finish_step, moe_layers, routing_stats
from meshplan.cost_models.memory import GIB
from meshplan.runtime.metrics import LiveTensorMemory, MetricsLog, StepMetrics, step_mfu
from meshplan.runtime.options import RunOptions, check_device, check_runnable
from meshplan.runtime.parallelize import ModelParts, parallelize_model
from meshplan.runtime.pipeline import build_schedule
from meshplan.runtime.profiling import profiled_steps, save_profile, step_profiler
from meshplan.specs.plan import Plan
from meshplan.specs.rules import loss_compiled
from meshplan.yamlio import atomic_write_text


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one micro-batch (fp32 logits)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def step_loss(plan: Plan):
    """The loss the plan runs: compiled with the blocks where specs/rules.py loss_compiled says so, which
    the estimate prices (memory.loss_buffer_bytes)."""
    return torch.compile(loss_fn) if loss_compiled(bool(plan.compile), plan.parallel.tp) else loss_fn


def lr_lambda(warmup: int, total: int, min_ratio: float):
    """Linear warm-up to 1 over `warmup` steps, then cosine decay to `min_ratio` at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def param_groups(part: nn.Module) -> list[dict[str, Any]]:
    """A part's parameters, DTensors apart from plain tensors: AdamW steps each group with one foreach
    call, which cannot mix the two (TP without FSDP leaves the norms plain). Checkpoints key optimizer
    state by parameter name (checkpoint.OPTIONS), so the grouping does not tie them to a layout."""
    params = list(part.parameters())
    kinds = [[p for p in params if isinstance(p, DTensor)], [p for p in params if not isinstance(p, DTensor)]]
    return [{"params": group} for group in kinds if group]


def build_optimizers(parts: list[nn.Module], opts: RunOptions) -> tuple[list, list]:
    """One AdamW + LambdaLR per model part (DCP's optimizer state dict is per module). The foreach
    implementation on every device, as TorchTitan's default: its step's temporary is what the estimate
    prices (memory.OPTIMIZER_STEP_TEMP_BYTES); torch would take the per-tensor loop on a CPU."""
    optimizers = [torch.optim.AdamW(param_groups(p), lr=opts.lr, betas=(0.9, 0.95), eps=1e-8,
                                    weight_decay=opts.weight_decay, foreach=True) for p in parts]
    factor = lr_lambda(opts.lr_warmup_steps(), opts.steps, opts.min_lr_ratio)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, factor) for o in optimizers]
    return optimizers, schedulers


def clip_grad_norm(params: list[nn.Parameter], max_norm: float, pp_group: dist.ProcessGroup | None,
                   device: torch.device) -> torch.Tensor:
    """Clip by the global L2 norm over every parameter of the model, wherever it lives; returns the
    norm as a tensor on `device`, read by the host only with the step's log line (no sync here).

    DTensor gradients (TP/FSDP shards) give their full-tensor norm per mesh; pipeline ranks hold
    disjoint parameters, so squared norms are summed over the pp group (on `device`, so that a
    rank without gradients still joins the all-reduce with a tensor its backend can send). The
    gradients are scaled by min(1, max_norm / norm) on the device, as torch's clip_grad_norm_ does.
    """
    grads = [p.grad for p in params if p.grad is not None]
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    sq = torch.zeros((), dtype=torch.float32, device=device)
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        sq = sq + norm.float() ** 2
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    total = sq.sqrt()
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for group in by_mesh.values():
        torch._foreach_mul_([g.to_local() if isinstance(g, DTensor) else g for g in group], coef.to(group[0].dtype))
    return total


@dataclass
class StepResult:
    loss: float  # mean over the global batch
    grad_norm: float  # before clipping
    routing: RoutingStats | None  # the MoE layers' routing over the step (None for a dense model)


@dataclass
class Trainer:
    plan: Plan
    opts: RunOptions
    device: torch.device

    def __post_init__(self) -> None:
        check_runnable(self.plan, self.device.type)
        if self.device.type == "cuda":
            check_device(self.plan, self.device)
        self.dims = ParallelDims.from_plan(self.plan)
        if dist.get_world_size() != self.dims.world_size:
            from meshplan.errors import InputError

            raise InputError("gpus", f"the plan needs {self.dims.world_size} processes, this world has {dist.get_world_size()}")
        self.mesh = build_mesh(self.dims, self.device.type, moe=self.plan.model.is_moe)
        self.model: ModelParts = parallelize_model(self.plan, self.mesh, self.dims, self.device, self.opts.seed,
                                                   float8_emulate=self.device.type == "cpu",
                                                   balanced_routing=self.opts.balanced_routing)
        self.optimizers, self.schedulers = build_optimizers(self.model.parts, self.opts)
        register_precompute(self.optimizers, self.model.parts)  # float8 FSDP all-gather scales
        t = self.plan.training
        self.local_batch = t.global_batch // self.dims.dp
        self.n_micro = self.local_batch // t.micro_batch
        self.loss_fn = step_loss(self.plan)
        self.moe = moe_layers(self.model.parts)
        for layer in self.moe:  # the aux loss's gradient is scaled as the training loss's is
            layer.aux_grad_scale = 1.0 if self.dims.pp > 1 else 1.0 / self.n_micro
        self.schedule = None
        if self.dims.pp > 1:
            self.schedule = build_schedule(self.model.parts, self.model.stage_ids, self.model.n_stages, self.mesh["pp"],
                                           self.device, self.plan.parallel.pp_schedule, self.n_micro, self.loss_fn)
        self.source = make_source(self.opts.data, BatchSpec(t.global_batch, t.seq_len, self.plan.model.vocab_size),
                                  self.opts.seed, self.opts.data_dtype)
        self.dp_rank = self.mesh["dp"].get_local_rank()
        self.tp_rank = self.mesh["tp"].get_local_rank()
        self.params = [p for m in self.model.parts for p in m.parameters()]

    def _loss_ctx(self):
        return loss_parallel() if self.model.loss_parallel else contextlib.nullcontext()

    def _forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Sum over micro-batches of their mean loss (None on ranks without the last stage)."""
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            # The trainer only needs the losses: returning outputs would keep every micro-batch's
            # logits alive on the last stage until the step ends.
            kwargs: dict[str, Any] = {"return_outputs": False}
            if self.model.has_last:
                kwargs.update(target=targets, losses=losses)
            args = (inputs,) if self.model.has_first else ()
            with self._loss_ctx():
                self.schedule.step(*args, **kwargs)
            if not self.model.has_last:
                return None
            return sum(_local(l) for l in losses)
        model, mb = self.model.parts[0], self.plan.training.micro_batch
        # On the model's device: a CPU accumulator plus a CUDA loss fails at the first step.
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for i in range(self.n_micro):
            sl = slice(i * mb, (i + 1) * mb)
            with self._loss_ctx():
                loss = self.loss_fn(model(inputs[sl]), targets[sl])
                (loss / self.n_micro).backward()
            total += _local(loss.detach())
        return total

    def step(self, step: int) -> StepResult:
        """One optimizer step on global batch `step`: its mean loss, gradient norm and MoE routing."""
        inputs, targets = local_rows(self.source, step, self.dp_rank, self.dims.dp)
        inputs = shard_sequence(inputs, self.model.seq_layout).to(self.device)
        targets = shard_sequence(targets, self.model.seq_layout).to(self.device)
        loss_sum = self._forward_backward(inputs, targets)
        pp_group = self.mesh["pp"].get_group() if self.dims.pp > 1 else None
        grad_norm = clip_grad_norm(self.params, self.opts.max_grad_norm, pp_group, self.device)
        for opt in self.optimizers:
            opt.step()
            opt.zero_grad(set_to_none=True)
        for sched in self.schedulers:
            sched.step()
        routing = self._routing() if self.plan.model.is_moe else None
        # Mean over micro-batches and over the ranks that own a loss (last stage, tp rank 0):
        # equal token counts everywhere, so this is the mean over the global batch. The one read
        # the host waits for in a step: the log line's loss and gradient norm, together (and the
        # MoE layers' routing).
        owner = loss_sum is not None and self.tp_rank == 0
        loss = loss_sum.detach().to(torch.float64) if owner else torch.zeros((), dtype=torch.float64, device=self.device)
        buf = torch.stack([loss, torch.ones_like(loss) if owner else torch.zeros_like(loss)])
        dist.all_reduce(buf)
        parts = [buf, grad_norm.to(torch.float64).reshape(1)] + ([routing] if routing is not None else [])
        values = torch.cat(parts).tolist()
        loss_total, owners, norm = values[:3]
        stats = routing_stats(values[3:], self.dims.dp * self.n_micro) if routing is not None else None
        return StepResult(loss_total / owners / self.n_micro, norm, stats)

    def _routing(self) -> torch.Tensor:
        """finish_step over this rank's MoE layers, combined over the pipeline stages (moe.combine_over_stages)."""
        stage = self.mesh["stage"]
        got = finish_step(self.moe, stage.get_group() if stage.size() > 1 else None, self.dims.ep,
                          self.dims.cp * self.dims.tp, self.device)
        if self.dims.pp > 1:
            got = combine_over_stages(got, self.mesh["pp"].get_group())
        return got

    def current_lr(self) -> float:
        return self.schedulers[0].get_last_lr()[0]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def run_training(plan: Plan, opts: RunOptions, device: torch.device) -> list[StepMetrics]:
    """Train `opts.steps` steps in the current process group; rank 0 logs. Returns rank 0's rows."""
    trainer = Trainer(plan, opts, device)
    rank0 = dist.get_rank() == 0
    out = Path(opts.out) if opts.out else None
    start = resume(trainer, out) if opts.resume and out else 0
    if rank0 and out and start > 0:
        trim_metrics(out / "metrics.jsonl", start)
    log = MetricsLog(opts.out if rank0 else None, quiet=opts.quiet or not rank0, append=opts.resume and start > 0)
    meta = checkpoint_meta(plan)
    t = plan.training
    tokens = t.global_batch * t.seq_len
    seen: tuple[float | None, float | None] = (None, None)  # largest (allocated, reserved) tracked so far
    profiled = profiled_steps(start + opts.timing_warmup, opts.profile_steps) if out else range(0)
    for step in range(start, opts.steps):
        tracked = opts.track_memory == "all" or (opts.track_memory == "warmup" and step - start < max(1, opts.timing_warmup))
        tracker = LiveTensorMemory(device) if tracked and counts_live_tensors(plan, device) else None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        dist.barrier()
        t0 = time.perf_counter()
        with step_profiler(device, step in profiled) as prof:
            with tracker if tracker is not None else contextlib.nullcontext():
                result = trainer.step(step)
        dt = time.perf_counter() - t0
        if prof is not None and out is not None:
            save_profile(prof, out, dist.get_rank(), step + 1, device)
        peak, reserved = _peak_memory(device, tracker)
        if peak is not None:
            seen = (max(seen[0] or 0.0, peak), None if reserved is None else max(seen[1] or 0.0, reserved))
        tps = tokens / dt / dist.get_world_size()
        row = StepMetrics(step=step + 1, loss=result.loss, grad_norm=result.grad_norm, lr=trainer.current_lr(),
                          step_time_s=dt, tokens_per_s_per_gpu=tps, mfu=step_mfu(plan, tps),
                          peak_memory_gib=peak if peak is not None else seen[0],
                          memory_tracked=peak is not None,
                          peak_memory_reserved_gib=reserved if peak is not None else seen[1],
                          **routing_fields(result.routing))
        if rank0:
            log.log(row)
        if out and opts.checkpoint_every and (step + 1) % opts.checkpoint_every == 0 and step + 1 < opts.steps:
            checkpoint.save(out, trainer.model.parts, trainer.optimizers, trainer.schedulers, step + 1, step + 1, meta)
        maybe_fail("kill_after_step", dist.get_rank(), step + 1)
    if out and opts.final_checkpoint and start < opts.steps:
        checkpoint.save(out, trainer.model.parts, trainer.optimizers, trainer.schedulers, opts.steps, opts.steps, meta)
    return log.rows


def routing_fields(routing: RoutingStats | None) -> dict[str, Any]:
    """StepMetrics' MoE fields (absent for a dense model)."""
    if routing is None:
        return {}
    return {"tokens_per_expert": list(routing.tokens_per_expert), "moe_imbalance": routing.imbalance,
            "aux_loss": routing.aux_loss}


def resume(trainer: Trainer, out: Path) -> int:
    """Load the newest complete checkpoint in `out` (written under any plan with the same model,
    seq_len and global batch) into this layout; returns the step to continue from (0 if none)."""
    found = checkpoint.latest(out)
    if found is None:
        if dist.get_rank() == 0 and not trainer.opts.quiet:
            print(f"no complete checkpoint in {out / 'checkpoints'}: starting from step 0", flush=True)
        return 0
    t = trainer.plan.training
    meta = checkpoint.check_compatible(found, trainer.plan.model.to_dict(), t.seq_len, t.global_batch)
    start, data_position = checkpoint.load(found, trainer.model.parts, trainer.optimizers, trainer.schedulers)
    # The data position is the index of the next global batch; data.py makes it the same batch
    # under every plan, so continuing at `start` neither skips nor repeats a sequence.
    assert data_position == start, (data_position, start)
    if dist.get_rank() == 0:  # said even with --quiet: where a run continues from matters
        was = meta.get("parallel")
        replanned = f" (written under {_layout(was)}, {meta.get('world_size')} ranks)" if was != asdict(trainer.plan.parallel) else ""
        print(f"resumed from {found} at step {start}{replanned}", flush=True)
    return start


def checkpoint_meta(plan: Plan) -> dict[str, Any]:
    """What a checkpoint records about the plan it was written under (meta.json)."""
    return {"model": plan.model.to_dict(), "seq_len": plan.training.seq_len,
            "global_batch": plan.training.global_batch, "parallel": asdict(plan.parallel), "plan": plan.to_dict()}


def _layout(parallel: Any) -> str:
    if not isinstance(parallel, dict):
        return "an unknown layout"
    return " x ".join(f"{k} {parallel.get(k)}" for k in ("dp_replicate", "dp_shard", "cp", "tp", "pp"))


def trim_metrics(path: Path, start: int) -> None:
    """Drop rows after step `start` (logged by an attempt that died before checkpointing them),
    so metrics.jsonl has each step once after a restart."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines() if _step_of(line) is not None and _step_of(line) <= start]
    atomic_write_text(path, "".join(line + "\n" for line in keep))


def _step_of(line: str) -> int | None:
    """The step of a metrics.jsonl row; None for a blank line or one cut short by a crash."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def counts_live_tensors(plan: Plan, device: torch.device) -> bool:
    """Whether this run measures peak memory by counting live tensors (metrics.py): on a CPU, and not
    for compiled blocks, which run op by op, uncompiled, under the counting dispatch mode (dynamo
    falls back to eager there), so what it counted would be eager memory while the run trains compiled."""
    return device.type == "cpu" and not plan.compile


def _peak_memory(device: torch.device, tracker: LiveTensorMemory | None) -> tuple[float | None, float | None]:
    """This step's peak (allocated, reserved) in GiB, max over ranks; (None, None) when not
    tracked, reserved None on the CPU (metrics.py: no allocator cache there)."""
    if device.type == "cuda":
        values = [float(torch.cuda.max_memory_allocated(device)), float(torch.cuda.max_memory_reserved(device))]
    elif tracker is not None:
        values = [float(tracker.peak)]
    else:
        return None, None
    buf = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(buf, op=dist.ReduceOp.MAX)
    got = [float(v) / GIB for v in buf.tolist()]
    return got[0], (got[1] if len(got) > 1 else None)
