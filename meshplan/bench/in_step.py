"""What an FSDP2 collective call costs inside a CPU training step, which back-to-back
micro-benchmarks do not see (`overheads.collective_sync_s`).

On a CPU nothing hides a collective: FSDP2's all-gather and reduce-scatter "streams" are the one
CPU stream there and gloo work is waited for in line (torch/distributed/fsdp/_fully_shard/
_fsdp_param_group.py, get_all_gather_streams; the runtime's CP gather path calls dist.all_gather),
so CPU profiles set fsdp_overlap = cp_overlap = 0 (builder.py). What is left is each call's hook
and wait time beyond the benchmarked transfer and the host ops cost_models/host.py prices: with as
many processes as cores, the wait for the peers' and gloo's threads to be scheduled. Measured on a
small FSDP2 model against the same model unsharded, both on every rank at once (one unit per block:
all-gathers forward and again in backward, one reduce-scatter per unit, the calls host.py counts).
What is left after the hook ops and the transfers, both priced as the estimate prices them (the
transfers from the profile's own collective fits, in the builder), is the per-call figure. The same
messages timed back to back instead scattered by 2x between rounds here; the fits rest on every
measured size.

Every rank runs the same fixed number of repetitions (collectives must match across ranks); a
round's time is the slowest rank's, a figure the median over rounds. Measured on CPU worlds only: on a
GPU the host runs ahead of the kernels (host.py) and NCCL overlaps on its own streams.
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from meshplan.bench.env import BenchEnv
from meshplan.bench.timing import time_slowest_rank
from meshplan.cost_models.comm import GroupSpan, collective_time
from meshplan.cost_models.host import UNIT_OPS, UNIT_OPS_PER_TENSOR
from meshplan.profiles.schema import ClusterProfile

UNITS, WIDTH, TOKENS = 4, 128, 128  # the FSDP2 model: UNITS blocks of three WIDTH x WIDTH linears
TENSORS_PER_UNIT = 6  # three weights, three biases


def blocks(env: BenchEnv) -> nn.Sequential:
    """UNITS blocks of three linears, the same weights on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(3)])
                           for _ in range(UNITS)]).to(env.device)


def shard_blocks(model: nn.Sequential, mesh) -> None:
    """One FSDP2 unit per block under a root without parameters of its own, as the runtime wraps a
    model (runtime/data_parallel.py): every block but the last reshards after forward."""
    from torch.distributed.fsdp import fully_shard

    for i, block in enumerate(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=i < len(model) - 1)
    fully_shard(model, mesh=mesh)


def fsdp_calls() -> tuple[int, int]:
    """(all-gathers, reduce-scatters) of one step of the sharded blocks: each block gathered forward
    and again backward but the last, which stays gathered (host.py counts them so too), one reduction each."""
    return 2 * UNITS - 1, UNITS


def measure_fsdp_steps(env: BenchEnv, quick: bool) -> dict[str, float]:
    """The small model's step unsharded and sharded (slowest rank, median over rounds), with what the
    builder needs to take out of the difference: the unit's full (gathered) bytes and the call counts."""
    from torch.distributed.device_mesh import init_device_mesh

    reps, rounds = (10, 5) if quick else (20, 7)
    x = torch.randn(TOKENS, WIDTH, device=env.device)
    sharded_model = blocks(env)
    shard_blocks(sharded_model, init_device_mesh(env.device.type, (env.world,)))
    plain_step, sharded_step = (lambda m=m: m(x).sum().backward() for m in (blocks(env), sharded_model))
    plain_step()  # warm-up: lazy state (FSDP2 initialises on its first step)
    sharded_step()
    # The two in turn, each round: a shared host's speed can change by 2x for minutes, and the
    # difference must come from one state of it.
    per_round = [(time_slowest_rank(plain_step, env, reps), time_slowest_rank(sharded_step, env, reps))
                 for _ in range(rounds)]
    unit_numel = sum(p.numel() for p in blocks(env)[0].parameters())
    gathers, scatters = fsdp_calls()
    return {"plain_s": statistics.median(p for p, _ in per_round),
            "sharded_s": statistics.median(s for _, s in per_round),
            "extra_s": statistics.median(s - p for p, s in per_round),
            "unit_bytes": 4.0 * env.world * -(-unit_numel // env.world),
            "gathers": gathers, "scatters": scatters, "group": env.world, "group_per_node": env.local_world}


def sync_per_call(record: dict[str, float], op_dispatch_s: float, prof: ClusterProfile) -> float:
    """Per FSDP2 call: (sharded step - unsharded step, per round - hook ops - transfers) / calls, the hook
    ops at op_dispatch_s and the transfers at the profile's collective fits, as the estimate prices both."""
    span = GroupSpan(int(record["group"]), int(record["group_per_node"]))
    transfer = (record["gathers"] * collective_time(prof, "all_gather", record["unit_bytes"], span)
                + record["scatters"] * collective_time(prof, "reduce_scatter", record["unit_bytes"], span))
    hooks = UNITS * (UNIT_OPS + TENSORS_PER_UNIT * UNIT_OPS_PER_TENSOR) * op_dispatch_s
    calls = record["gathers"] + record["scatters"]
    return max(0.0, (record["extra_s"] - hooks - transfer) / calls)
