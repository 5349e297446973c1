"""One rank of the contention test (run as a script by test_contention.py): matmuls alone and beside
all-reduces over the world, each rank's result written by rank 0."""

import json
import sys
from dataclasses import asdict

import torch.distributed as dist

from meshplan.bench.contention import measure_contention
from meshplan.bench.env import init_env, shutdown


def main(out: str) -> None:
    env = init_env()
    r = measure_contention(env, dist.group.WORLD, env.world)
    results = [None] * env.world
    dist.all_gather_object(results, {**asdict(r), "slowdown": r.slowdown})
    if env.rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
