"""Under torchrun on gloo: compile a function that all-gathers its input over the world, multiplies, and
all-reduces the product (the collectives a TP block traces to), with runtime/tp_census installed; rank 0
writes the census to argv[1]."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from meshplan.runtime import tp_census


def main() -> None:
    dist.init_process_group("gloo")
    before = tp_census.census()
    tp_census.install()
    group = dist.group.WORLD

    def shard_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        full = funcol.all_gather_tensor(x, 0, group)
        return funcol.all_reduce(full @ w, "sum", group)

    out = torch.compile(shard_matmul)(torch.ones(2, 4), torch.ones(4, 3))
    world = dist.get_world_size()
    if dist.get_rank() == 0:
        result = {"before": before, "after": tp_census.census(), "value": out[0, 0].item(), "world": world}
        with open(sys.argv[1], "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
