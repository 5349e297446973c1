"""Start torchrun (torch.distributed.run) for a plan: one process per GPU, or per simulated GPU on
CPU (gloo). The workers run `python -m meshplan run` with the run's flags.

One node: `--standalone` (a local rendezvous on a free port, so concurrent runs do not collide).
Several nodes: one torchrun agent per node, all meeting at a c10d rendezvous (`--rdzv-endpoint
HOST:PORT` on one of the nodes); torchrun assigns global ranks when all `--nnodes` agents joined.
`--max-restarts K` lets torchrun restart the whole worker group up to K times after a worker
fails; the restarted workers resume from the newest complete checkpoint (worker.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

# Each worker is `meshplan run` itself: under torchrun it trains instead of launching.
WORKER_ARGV = ("-m", "meshplan", "run")
# torchrun (2.13) shares the agent's TCPStore with the workers and keeps it across restarts with no
# per-attempt key prefix: restarted workers read the dead attempt's gloo/NCCL addresses and hang in
# init_process_group. Unshared, rank 0 of each attempt hosts a fresh store on a fresh port.
TORCHRUN_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
# The CUDA caching allocator as TorchTitan runs it (run_train.sh: PYTORCH_ALLOC_CONF=expandable_segments:True),
# the runs the memory model's allocator slack was fitted on (overheads.memory_fragmentation). Without it a
# 3B step on one H200 reserved 23 % over its peak allocation (benchmarks/results/gpu_truth-NVIDIA_H200-
# 2026-11-26-3b-*.md), far above the fitted slack. A user's own setting, under either name, wins.
ALLOCATOR_ENV = {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
ALLOCATOR_ENV_NAMES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def worker_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment torchrun and its workers get: the caller's, the store setting, and the
    allocator setting unless the caller chose one."""
    allocator = {} if any(name in environ for name in ALLOCATOR_ENV_NAMES) else ALLOCATOR_ENV
    return {**environ, **TORCHRUN_ENV, **allocator}


@dataclass(frozen=True)
class LaunchOptions:
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None   # HOST:PORT; None on one node (standalone)
    rdzv_backend: str = "c10d"
    rdzv_id: str = "meshplan"
    max_restarts: int = 0

    @property
    def standalone(self) -> bool:
        return self.nnodes == 1 and self.rdzv_endpoint is None


def torchrun_args(launch: LaunchOptions) -> list[str]:
    """torchrun's own flags (everything before the worker module)."""
    if launch.standalone:
        where = ["--standalone"]
    else:
        where = [f"--nnodes={launch.nnodes}", f"--node-rank={launch.node_rank}",
                 f"--rdzv-backend={launch.rdzv_backend}", f"--rdzv-endpoint={launch.rdzv_endpoint}",
                 f"--rdzv-id={launch.rdzv_id}"]
    return [*where, f"--nproc-per-node={launch.nproc_per_node}", f"--max-restarts={launch.max_restarts}"]


def torchrun_command(launch: LaunchOptions, worker_argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_args(launch), *WORKER_ARGV, *worker_argv]


def launch(launch_opts: LaunchOptions, worker_argv: list[str]) -> int:
    """Run torchrun in a child process and return its exit code. SIGTERM / SIGHUP / SIGINT sent to
    `meshplan run` are passed on to torchrun, which stops its workers before exiting (killing
    torchrun outright would leave the workers running)."""
    proc = subprocess.Popen(torchrun_command(launch_opts, worker_argv), env=worker_env(dict(os.environ)))
    # signal handlers can only be installed from the main thread
    forwarded = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT) if threading.current_thread() is threading.main_thread() else ()
    previous = {sig: signal.signal(sig, lambda signum, _frame: proc.send_signal(signum)) for sig in forwarded}
    try:
        return proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
