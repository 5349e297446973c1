"""The distributed world a benchmark runs in: backend, device, node layout, and rank-0 decisions."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class BenchEnv:
    rank: int
    world: int
    local_rank: int
    local_world: int
    nnodes: int
    backend: str  # nccl | gloo
    device: torch.device
    hosts: list[str] = field(default_factory=list)  # host name per rank
    node_of: list[int] = field(default_factory=list)  # node index per rank

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sync(self) -> None:
        """Wait for queued device work, so host timers see it."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def agree(self, flag: bool) -> bool:
        """Rank 0's decision, on every rank (budget checks must agree or collectives hang); a one-process
        world decides alone, with or without a process group (benchmarks run in one process)."""
        if self.world == 1:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=self.device)
        dist.broadcast(t, src=0)
        return bool(t.item())

    def max_over_ranks(self, values: list[float]) -> list[float]:
        """Element-wise max across all ranks (the slowest rank sets a collective's time)."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def node_ranks(self, node: int) -> list[int]:
        return [r for r in range(self.world) if self.node_of[r] == node]


def init_env() -> BenchEnv:
    """Join the torchrun world: NCCL on GPUs, gloo on CPU; one CPU thread share per local process."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available():
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        # processes stand in for devices: split the cores so ranks do not fight over them
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    kwargs = {"device_id": device} if backend == "nccl" else {}
    # a hung peer should fail the run within minutes, not the 30-minute default
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=5), **kwargs)
    hosts: list[str] = [""] * world
    dist.all_gather_object(hosts, socket.gethostname())
    # nodes from torchrun's GROUP_RANK when present (several "nodes" may share one host in tests)
    group = [0] * world
    dist.all_gather_object(group, int(os.environ.get("GROUP_RANK", 0)))
    order = sorted(set(group))
    node_of = [order.index(g) for g in group]
    return BenchEnv(rank, world, local_rank, local_world, len(order), backend, device, hosts, node_of)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
