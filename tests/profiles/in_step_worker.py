"""One rank of the in-step measurement test (run as a script by test_in_step.py): counts the FSDP2
model's collectives with torch.profiler, then times its steps and the pipeline steps
(quick settings)."""

import json
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from meshplan.bench import in_step
from meshplan.bench.env import init_env, shutdown
from meshplan.bench.pipeline import measure_pipeline_steps


def collective_counts(model: torch.nn.Module) -> dict[str, int]:
    x = torch.randn(in_step.TOKENS, in_step.WIDTH)
    model(x).sum().backward()  # the first step's lazy initialisation is not a step
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model(x).sum().backward()
    names = [e.key for e in prof.key_averages() for _ in range(e.count)]
    return {"gathers": sum("allgather_base" in n for n in names),
            "scatters": sum("reduce_scatter_base" in n for n in names)}


def main(out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    env = init_env()
    model = in_step.blocks(env)
    mesh = init_device_mesh("cpu", (env.world,))
    in_step.shard_blocks(model, mesh)
    counts = collective_counts(model)
    fsdp = in_step.measure_fsdp_steps(env, quick=True)
    steps = measure_pipeline_steps(env, quick=True)
    if env.rank == 0:
        with open(out, "w") as f:
            json.dump({**counts, "units": in_step.UNITS, "fsdp": fsdp, "pipeline": steps}, f)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
    # as meshplan's own workers end (meshplan/__main__.py): no interpreter finalisation after the work
    sys.stdout.flush()
    os._exit(0)
