"""The single-process reference: the same model, weights, data, optimizer and LR schedule as a run
of the plan, as a plain PyTorch loop (no mesh, no wrappers). Tests compare every layout's losses
with it; benchmarks/runtime_overhead.py times it against the runtime."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch
from torch import nn

from meshplan.runtime.data import BatchSpec, make_source
from meshplan.runtime.float8 import apply_float8
from meshplan.runtime.initialisation import init_weights
from meshplan.runtime.model import build_model
from meshplan.runtime.moe import RoutingStats, finish_step, moe_layers, routing_stats
from meshplan.runtime.options import RunOptions
from meshplan.runtime.train import build_optimizers, loss_fn
from meshplan.specs.plan import Plan


@dataclass
class ReferenceStep:
    step: int
    loss: float
    step_time_s: float
    routing: RoutingStats | None = None


def reference_run(plan: Plan, opts: RunOptions, float8: bool | None = None) -> list[ReferenceStep]:
    """Train the plan's model in this process: global batch in micro_batch chunks (gradient
    accumulation), clip, AdamW. `float8` overrides the plan's memory.float8.

    bf16 plans train as FSDP2's mixed precision does, spelled out: fp32 master weights and
    optimizer, a bf16 copy of them for each step's forward and backward, each micro-batch's bf16
    gradients accumulated in fp32 on the master weights."""
    spec, t = plan.model, plan.training
    model = build_model(spec, "cpu")
    if plan.memory.float8 if float8 is None else float8:
        apply_float8(model, emulate=True)
    init_weights(model, spec, opts.seed)
    (opt,), (sched,) = build_optimizers([model], opts)
    compute = bf16_copy(model) if t.dtype == "bf16" else model
    n_micro = t.global_batch // t.micro_batch
    moe = moe_layers([compute])
    for layer in moe:
        layer.balanced_routing = opts.balanced_routing
        layer.aux_grad_scale = 1.0 / n_micro
    source = make_source(opts.data, BatchSpec(t.global_batch, t.seq_len, spec.vocab_size), opts.seed, opts.data_dtype)
    out = []
    for step in range(opts.steps):
        t0 = time.perf_counter()
        rows = source.rows(step, 0, t.global_batch)
        inputs, targets = rows[:, :-1], rows[:, 1:]
        total = 0.0
        _copy_params(model, compute)
        for i in range(n_micro):
            sl = slice(i * t.micro_batch, (i + 1) * t.micro_batch)
            loss = loss_fn(compute(inputs[sl]), targets[sl])
            (loss / n_micro).backward()
            _accumulate_grads(compute, model)
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), opts.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        routing = routing_stats(finish_step(moe, None, 1, 1, torch.device("cpu")).tolist(), n_micro)
        out.append(ReferenceStep(step + 1, total / n_micro, time.perf_counter() - t0, routing))
    return out


def bf16_copy(model: nn.Module) -> nn.Module:
    """The compute copy: parameters in bf16, buffers (an MoE layer's counters and expert bias) as they are,
    as FSDP2's mixed precision casts parameters alone."""
    compute = copy.deepcopy(model)
    for p in compute.parameters():
        p.data = p.data.to(torch.bfloat16)
    return compute


@torch.no_grad()
def _copy_params(master: nn.Module, compute: nn.Module) -> None:
    """Cast the fp32 master weights into the compute copy (what FSDP2's all-gather does)."""
    if compute is not master:
        for dst, src in zip(compute.parameters(), master.parameters()):
            dst.copy_(src)


@torch.no_grad()
def _accumulate_grads(compute: nn.Module, master: nn.Module) -> None:
    """Add the compute copy's gradients, in fp32, to the master's (FSDP2's reduce_dtype)."""
    if compute is master:
        return
    for src, dst in zip(compute.parameters(), master.parameters()):
        if src.grad is None:
            continue
        dst.grad = src.grad.float() if dst.grad is None else dst.grad.add_(src.grad.float())
        src.grad = None
