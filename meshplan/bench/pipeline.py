"""What one pipeline action costs on the host (`overheads.pipeline_action_s`, `pipeline_multi_action_s`).

An action is one stage's forward, backward or weight pass of one micro-batch. Beyond its compute, each
runs through torch.distributed.pipelining's schedule in Python and waits in line for its sends and
receives (on a CPU nothing overlaps them). PyTorch has two runtimes: one stage per rank (GPipe, 1F1B)
and several stages per rank (the looped and V-shaped schedules), which posts and waits its transfers
per action: a step over its actions took 0.4 and 1.05 ms here (2-rank gloo, 2 cores).

Measured on the whole world as one pipeline of near-empty stages (one WIDTH x WIDTH linear each):
1F1B with one stage per rank, Interleaved1F1B with two, each timed as a step, slowest rank per round,
median over rounds. The builder turns each step into a per-action cost by inverting the schedule
simulation the estimate uses (cost_models/pipeline) with the profile's own p2p time, so the two read
the same quantity. CPU worlds only: on a GPU the host runs ahead of the kernels.
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from meshplan.bench.env import BenchEnv
from meshplan.bench.timing import time_slowest_rank
from meshplan.cost_models.pipeline import simulate

WIDTH, ROWS = 8, 4  # each micro-batch: ROWS x WIDTH floats
SCHEDULES = (("1F1B", 1), ("Interleaved1F1B", 2))  # (schedule, stages per rank)


def payload_bytes() -> float:
    """What one stage sends another per micro-batch."""
    return ROWS * WIDTH * 4.0


def micro_batches(world: int) -> int:
    return 4 * world


def _schedule(name: str, v: int, env: BenchEnv, m: int):
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S

    ids = [env.rank + env.world * j for j in range(v)]
    stages = [PipelineStage(nn.Linear(WIDTH, WIDTH), stage_index=i, num_stages=env.world * v, device=env.device)
              for i in ids]
    loss = lambda out, target: (out - target).pow(2).mean()  # noqa: E731
    if v == 1:
        return getattr(S, f"Schedule{name}")(stages[0], n_microbatches=m, loss_fn=loss)
    return getattr(S, f"Schedule{name}")(stages, n_microbatches=m, loss_fn=loss)


def _step_seconds(name: str, v: int, env: BenchEnv, rounds: int) -> float:
    m = micro_batches(env.world)
    sched = _schedule(name, v, env, m)
    x, target = torch.randn(m * ROWS, WIDTH), torch.randn(m * ROWS, WIDTH)
    first, last = env.rank == 0, env.rank == env.world - 1  # looped schedules: stage 0 and the last stage's rank

    def step() -> None:
        kwargs = {"target": target} if last else {}
        sched.step(x, **kwargs) if first else sched.step(**kwargs)

    step()
    return statistics.median(time_slowest_rank(step, env) for _ in range(rounds))


def measure_pipeline_steps(env: BenchEnv, quick: bool) -> list[dict]:
    """One record per schedule: its step time over the world as a pipeline."""
    rounds = 7 if quick else 15
    return [{"schedule": name, "pp": env.world, "v": v, "m": micro_batches(env.world),
             "step_s": _step_seconds(name, v, env, rounds)} for name, v in SCHEDULES]


def action_seconds(record: dict, p2p_s: float) -> float:
    """The per-action time at which the schedule simulation's makespan is the measured step."""
    n = record["pp"] * record["v"]

    def makespan(a: float) -> float:
        return simulate(record["schedule"], record["pp"], record["v"], record["m"], [a] * n, [a] * n, [0.0] * n,
                        p2p_s).makespan

    lo, hi = 0.0, record["step_s"]
    if makespan(lo) >= record["step_s"]:
        return 0.0  # the transfers alone explain the step
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if makespan(mid) < record["step_s"] else (lo, mid)
    return (lo + hi) / 2
