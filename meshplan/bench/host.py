"""Host cost per eager op, as cost_models/host.py prices it, measured on tensors so small that the
arithmetic is nothing and the host is everything:

- `op_dispatch_s`: every aten op a training step dispatches (forward and backward): a chain of
  multiplies by a Python number under autograd, forward and backward, on plain tensors. On a GPU the
  cheapest op there is (no cuBLAS or cuDNN call): the runtime's blocks cost more per op there
  (benchmarks/host_costs.py times them beside the chain);
- `python_dispatch_s`: the extra of an op through DTensor's Python __torch_dispatch__ (sharding
  propagation and wrapping): the same chain on DTensors replicated over the world (no communication);
- `checkpoint_op_s`: per forward op of a block under activation checkpointing, the extra of the
  wrapper (saved-tensor hooks in forward, the replay and its unpacking in backward): a chain whose
  ops each save their output (tanh, as most ops of a block save a tensor), wrapped as the runtime
  wraps a block (checkpoint_wrapper, non-reentrant, no RNG state), against the same chain bare;
- `sac_op_s`: per forward op, the further extra of a selective policy's dispatch mode, which sees
  every op of the forward and of the replay: the same wrapper with a policy that recomputes all.

Per op, the multiply (a scalar wrapped each call) costs about what an average op of the runtime's blocks
does: a one-process tiny-4l step (1,065 ops a micro-batch) here needs 4.0 us per op to be priced as
measured, the multiply chain gives 3.7-3.9, a tanh chain 2.4.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields
from functools import partial

import torch
from torch import nn

from meshplan.bench.env import BenchEnv
from meshplan.bench.timing import time_local

CHAIN = 64  # forward ops per chain; backward as many grad ops (+ a few for the sum)
ROUNDS = 5  # every variant timed once a round: a difference is taken within one round


@dataclass(frozen=True)
class HostCosts:
    """Seconds per op, as overheads.* of a profile (names alike)."""

    op_dispatch_s: float = 0.0
    python_dispatch_s: float = 0.0
    checkpoint_op_s: float = 0.0
    sac_op_s: float = 0.0


class Chain(nn.Module):
    """CHAIN multiplies by a Python number in a row: the op mix's per-op cost."""

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        for _ in range(CHAIN):
            y = y * 1.0001
        return y


class SavingChain(nn.Module):
    """CHAIN tanh ops in a row: every op saves its output for backward, as checkpointing sees a block."""

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        for _ in range(CHAIN):
            y = y.tanh()
        return y


def _recompute_all(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.PREFER_RECOMPUTE


def checkpointed(selective: bool) -> nn.Module:
    """The saving chain wrapped as runtime/activation_checkpoint.py wraps a block (full, or selective)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    if not selective:
        return checkpoint_wrapper(SavingChain(), preserve_rng_state=False)
    return checkpoint_wrapper(SavingChain(), preserve_rng_state=False,
                              context_fn=partial(create_selective_checkpoint_contexts, _recompute_all))


def count_ops(fn) -> int:
    """aten ops `fn` dispatches, counted (not assumed) with a dispatch mode. The detach of each saved
    tensor is left out: the mode itself causes it (a profiler trace of a plain run has none)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func is not torch.ops.aten.detach.default
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def _step(module: nn.Module, x: torch.Tensor) -> None:
    module(x).sum().backward()


def _seconds(module: nn.Module, x: torch.Tensor, env: BenchEnv, target_s: float, min_reps: int) -> float:
    return time_local(lambda: _step(module, x), env.sync, target_s, min_reps, warmup=3).median_s


def costs_of(times: dict[str, float], ops: int) -> HostCosts:
    """The four costs from one round's step times of the chains (plain, dtensor, bare, full, selective)."""
    op_s = times["plain"] / ops
    return HostCosts(op_s, max(0.0, times["dtensor"] / ops - op_s),
                     max(0.0, (times["full"] - times["bare"]) / CHAIN),
                     max(0.0, (times["selective"] - times["full"]) / CHAIN))


def bench_host_dispatch(env: BenchEnv, target_s: float, min_reps: int) -> HostCosts:
    """All four costs on this rank: each the median over rounds of that round's difference. A shared host's
    speed can change by 2x for minutes; variants timed apart would put that change into a difference."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    plain = torch.ones(8, device=env.device, requires_grad=True)
    ops = count_ops(lambda: _step(Chain(), plain))
    # Replicated over the whole world: DTensor's dispatch in full, and no collective (elementwise
    # ops and a sum of replicated tensors stay local).
    mesh = init_device_mesh(env.device.type, (env.world,))
    leaf = distribute_tensor(torch.ones(8, device=env.device), mesh, [Replicate()]).requires_grad_()
    variants = {"plain": (Chain(), plain), "dtensor": (Chain(), leaf), "bare": (SavingChain(), plain),
                "full": (checkpointed(False), plain), "selective": (checkpointed(True), plain)}
    rounds = [costs_of({k: _seconds(m, x, env, target_s / ROUNDS, max(1, min_reps // 2)) for k, (m, x) in
                        variants.items()}, ops) for _ in range(ROUNDS)]
    return HostCosts(*(statistics.median(getattr(c, f.name) for c in rounds) for f in fields(HostCosts)))
