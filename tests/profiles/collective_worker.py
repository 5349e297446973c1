"""One rank of the 2-rank gloo collective benchmark test (run as a script by test_collectives_gloo.py)."""

import json
import sys

import torch

from meshplan.bench import collectives as coll
from meshplan.bench.env import init_env, shutdown
from meshplan.bench.progress import Reporter
from meshplan.bench.timing import Budget


def main(out: str) -> None:
    env = init_env()
    sets = coll.plan_groups(env, "loopback", "network")
    settings = coll.CollectiveSettings([4096, 65536], target_s=0.01, min_reps=3, rounds=2, dtype=torch.float32)
    points = coll.bench_collectives(env, sets, settings, Budget(None), Reporter(enabled=False))
    if env.rank == 0:
        with open(out, "w") as f:
            json.dump({"points": points, "nnodes": env.nnodes, "world": env.world,
                       "groups": [(g.level, g.size, g.members) for g in sets]}, f)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
