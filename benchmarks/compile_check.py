"""Do the runtime's compiled blocks compile here? One process, this machine's device: tiny-4l built
by the runtime's own functions, for each layout (no TP; TP with SP on a one-rank mesh, which runs
DTensor's code path without a second device) and each AC mode, with its blocks compiled: a forward
and backward, then Dynamo's graph breaks and the compiled regions one more step ran (profiler).
The answer for TP is what specs/rules.py's compile_reason should say on this backend and torch.

    python benchmarks/compile_check.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import traceback
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist


def one_case(device: torch.device, tp: bool, ac: str) -> dict:
    from torch._dynamo.utils import counters
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.profiler import ProfilerActivity, profile

    from meshplan.runtime.activation_checkpoint import apply_ac
    from meshplan.runtime.initialisation import init_weights
    from meshplan.runtime.model import build_model
    from meshplan.runtime.tensor_parallel import apply_tp
    from meshplan.runtime.train import loss_fn
    from meshplan.specs.registry import resolve_model

    torch._dynamo.reset()
    counters.clear()
    spec = resolve_model("tiny-4l")
    model = build_model(spec, "meta")
    if tp:
        apply_tp(model, init_device_mesh(device.type, (1,), mesh_dim_names=("tp",)), True, False, True)
    apply_ac(model, ac, None)
    for block in model.layers.values():
        block.compile()
    model.to_empty(device=device)
    init_weights(model, spec, 0)
    x = torch.randint(0, spec.vocab_size, (2, 64), device=device)

    def step() -> None:
        with loss_parallel() if tp else contextlib.nullcontext():
            loss_fn(model(x), x).backward()

    out = {"layout": "TP 1 + SP (DTensor)" if tp else "no TP", "ac": ac}
    try:
        step()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step()
        events = Counter(e.name for e in prof.events())
        out.update(ok=True, forward=events["CompiledFunction"], backward=events["CompiledFunctionBackward"])
    except Exception as e:  # the point is to see which combinations fail, and how
        out.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
        traceback.print_exc()
    out["breaks"] = sum(counters["graph_break"].values()) + sum(counters["unimplemented"].values())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for compile_check-<device>.md")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    rows = [one_case(device, tp, ac) for tp in (False, True) for ac in ("none", "full", "selective")]
    dist.destroy_process_group()
    lines = [f"# compile check: {name}, torch {torch.__version__}", "",
             "| layout | AC | runs | compiled forward / backward regions (4 blocks) | graph breaks | error |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        regions = f"{r['forward']} / {r['backward']}" if r.get("ok") else ""
        lines.append(f"| {r['layout']} | {r['ac']} | {'yes' if r.get('ok') else 'NO'} | {regions} | {r['breaks']} | "
                     f"{r.get('error', '')} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        path = Path(args.out) / f"compile_check-{name.replace(' ', '_')}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
