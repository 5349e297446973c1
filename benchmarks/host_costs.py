"""Host cost per eager op on this machine's device (bench/host.py, as profile-cluster measures it on a
CPU), in one process: on a GPU the chain's kernels are tiny, so the host is what is timed (Python,
dispatcher, autograd, the kernel launch). Prints the four costs in microseconds, as JSON, and the
cost per op of the runtime's own blocks (tiny-4l's dense ones, tiny-moe's MoE ones) timed the same way.

    python benchmarks/host_costs.py [--device cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from meshplan.bench.env import init_env
from meshplan.bench.host import bench_host_dispatch, runtime_block_op_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target-s", type=float, default=0.3, help="time per variant (default 0.3 s)")
    ap.add_argument("--out", default=None, help="also write host_costs-<device>.json here")
    a = ap.parse_args()
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": os.environ.get("MASTER_PORT", "29533")}.items():
        os.environ.setdefault(k, v)
    env = init_env()
    costs = bench_host_dispatch(env, a.target_s, 5)
    blocks = {f"block_op_s {m}": runtime_block_op_s(env, m, a.target_s, 5) for m in ("tiny-4l", "tiny-moe")}
    name = torch.cuda.get_device_name(env.device) if env.is_cuda else "CPU"
    row = {"device": name, "torch": torch.__version__, "cpu_count": os.cpu_count(),
           **{k: round(v * 1e6, 2) for k, v in {**asdict(costs), **blocks}.items()}, "unit": "us per op"}
    print(json.dumps(row))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"host_costs-{name.replace(' ', '_')}.json").write_text(json.dumps(row, indent=1) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
