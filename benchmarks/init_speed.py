"""How long a rank takes to initialise its weights, by the runtime's own init (runtime/initialisation.py).

Each rank draws only its shard: with FSDP over N ranks a rank's time should be about 1/N of one
rank's. Prints seconds per billion parameters of the model and per billion a rank holds.

    python benchmarks/init_speed.py                               # CPU: 1 and 2 gloo ranks, llama3.2-1b cut to 2 layers
    python benchmarks/init_speed.py --model llama3-8b --layers 0 --ranks 1   # on a GPU: the whole 8B on one device
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path


def worker(model: str, layers: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from meshplan.runtime.initialisation import init_weights
    from meshplan.runtime.model import build_model
    from meshplan.specs.registry import resolve_model

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    spec = resolve_model(model)
    if layers:
        spec = replace(spec, n_layers=layers)
    m = build_model(spec, "meta")
    if dist.get_world_size() > 1:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in m.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(m, mesh=mesh)
    m.to_empty(device=device)
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in m.parameters())
    dist.barrier()
    t0 = time.perf_counter()
    init_weights(m, spec, seed=0)
    if cuda:
        torch.cuda.synchronize()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"ranks": dist.get_world_size(), "device": str(device.type),
                                         "params": spec.num_params(), "held": held, "seconds": float(dt)}))
    dist.destroy_process_group()


def measure(model: str, layers: int, ranks: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               __file__, "--worker", "--model", model, "--layers", str(layers), "--out", str(out)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                             env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if res.returncode != 0:
            raise SystemExit(res.stdout[-2000:] + res.stderr[-3000:])
        return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3.2-1b")
    ap.add_argument("--layers", type=int, default=2, help="cut the model to this many blocks (0: all)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads per rank, the same for every world so that work per rank is compared")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.model, args.layers, args.out)
        return 0
    rows = [measure(args.model, args.layers, n, args.threads) for n in args.ranks]
    print(f"{'ranks':>5} {'device':>6} {'params':>8} {'held/rank':>10} {'init s':>8} {'s per B params':>15} "
          f"{'s per B held':>13} {'vs 1 rank':>9}")
    base = rows[0]["seconds"] if rows and rows[0]["ranks"] == 1 else None
    for r in rows:
        ratio = f"{r['seconds'] / base:.2f}" if base else ""
        print(f"{r['ranks']:>5} {r['device']:>6} {r['params'] / 1e9:>7.3f}B {r['held'] / 1e9:>9.3f}B {r['seconds']:>8.2f} "
              f"{r['seconds'] / (r['params'] / 1e9):>15.2f} {r['seconds'] / (r['held'] / 1e9):>13.2f} {ratio:>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
