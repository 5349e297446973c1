"""Host cost per eager op, as cost_models/host.py prices it: `overheads.op_dispatch_s` for every
aten op a training step dispatches (forward and backward), `python_dispatch_s` for the extra of an
op that goes through a Python __torch_dispatch__ (DTensor's sharding propagation and wrapping).

Both are measured on tensors so small that the arithmetic is nothing and the host is everything:
a chain of elementwise multiplies under autograd, forward and backward, once on plain tensors and
once on DTensors replicated over the world (no communication).
"""

from __future__ import annotations

import torch

from meshplan.bench.env import BenchEnv
from meshplan.bench.timing import time_local

CHAIN = 64  # multiplies per chain: forward CHAIN muls, backward CHAIN grad muls (+ a few for the sum)


def _chain_step(x: torch.Tensor) -> None:
    y = x
    for _ in range(CHAIN):
        y = y * 1.0001
    y.sum().backward()


def _ops_per_step() -> int:
    """aten ops of one _chain_step, counted (not assumed) with a dispatch mode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    x = torch.ones(8, requires_grad=True)
    with Count():
        _chain_step(x)
    return Count.n


def _seconds_per_step(x: torch.Tensor, env: BenchEnv, target_s: float, min_reps: int) -> float:
    return time_local(lambda: _chain_step(x), env.sync, target_s, min_reps, warmup=3).median_s


def bench_host_dispatch(env: BenchEnv, target_s: float, min_reps: int) -> tuple[float, float]:
    """(op_dispatch_s, python_dispatch_s) on this rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    ops = _ops_per_step()
    plain = torch.ones(8, device=env.device, requires_grad=True)
    op_s = _seconds_per_step(plain, env, target_s, min_reps) / ops
    # Replicated over the whole world: DTensor's dispatch in full, and no collective (elementwise
    # ops and a sum of replicated tensors stay local).
    mesh = init_device_mesh(env.device.type, (env.world,))
    leaf = distribute_tensor(torch.ones(8, device=env.device), mesh, [Replicate()]).requires_grad_()
    dtensor_s = _seconds_per_step(leaf, env, target_s, min_reps) / ops
    return op_s, max(0.0, dtensor_s - op_s)

