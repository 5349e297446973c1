"""Run several plans in one torchrun world (one process group, a fresh DeviceMesh per plan) and
write each plan's per-step losses to a JSON file (rank 0). Used by test_layouts.py.

usage: torchrun ... layouts_worker.py CASES.json RESULTS.json
CASES.json: [{"name": str, "plan": {...plan mapping...}, "steps": int, "track_memory": str,
              "inspect": bool}, ...]
With "inspect", every training step runs under device_hygiene.DeviceHygiene and the results list
the tensors meshplan's runtime made off the model's device ("device_violations"), the dtypes of
every nn.Linear output during the steps ("compute_dtypes") and of the trained parameters after
them ("master_dtypes"), and the dtypes and total bytes FSDP2's gradient reductions sent over the
case ("reduce_dtypes", "reduce_bytes"; reductions_recorded).
With "compile_check", Dynamo's counters are cleared before the case and the results carry its graph
breaks and the frames it gave up on ("dynamo_breaks"), the graphs it built ("dynamo_graphs"), and how
many compiled regions ran forward and backward in the last step, counted by the profiler
("compiled_forward", "compiled_backward"): a block that falls back to eager runs none.
"""

import contextlib
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

from device_hygiene import DeviceHygiene
from meshplan.runtime.options import RunOptions
from meshplan.runtime.train import Trainer, run_training
from meshplan.specs.plan import plan_from_dict


@contextlib.contextmanager
def inspected_steps(seen: dict[str, set]):
    """Run every Trainer.step under DeviceHygiene (only the step: weight initialisation builds
    full tensors on the CPU on purpose) with a forward hook on every nn.Linear, collecting what
    they see."""
    step = Trainer.step

    def record_dtype(module, args, output):
        seen["compute_dtypes"].add(str(output.dtype))

    def inspected(self, i):
        linears = [m for part in self.model.parts for m in part.modules() if isinstance(m, torch.nn.Linear)]
        hooks = [m.register_forward_hook(record_dtype) for m in linears]
        try:
            with DeviceHygiene(self.device) as mode:
                out = step(self, i)
        finally:
            for h in hooks:
                h.remove()
        seen["device_violations"].update(f"{v.factory} at {v.where} (device {v.device})" for v in mode.violations)
        seen["master_dtypes"].update(str(p.dtype) for p in self.params)
        return out

    Trainer.step = inspected
    try:
        yield
    finally:
        Trainer.step = step


@contextlib.contextmanager
def reductions_recorded(seen: dict[str, set], sent: dict[str, int]):
    """Record what FSDP2's gradient reductions send (fully_shard and replicate alike): the dtype and bytes of
    each reduce-scatter and all-reduce input issued inside its foreach_reduce, the one place it reduces
    gradients. Collectives outside it (the loss's average, the norm for clipping) are not counted."""
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group

    inside = [False]
    reduce = param_group.foreach_reduce
    originals = {name: getattr(dist, name) for name in ("reduce_scatter_single", "reduce_scatter_tensor", "all_reduce")
                 if hasattr(dist, name)}

    def sending(name, fn):
        def call(*args, **kwargs):
            if inside[0]:
                tensor = (kwargs.get("input", args[1] if len(args) > 1 else None) if name.startswith("reduce_scatter")
                          else kwargs.get("tensor", args[0] if args else None))
                seen["reduce_dtypes"].add(str(tensor.dtype))
                sent["reduce_bytes"] = sent.get("reduce_bytes", 0) + tensor.numel() * tensor.element_size()
            return fn(*args, **kwargs)
        return call

    def reducing(*args, **kwargs):
        inside[0] = True
        try:
            return reduce(*args, **kwargs)
        finally:
            inside[0] = False

    param_group.foreach_reduce = reducing
    for name, fn in originals.items():
        setattr(dist, name, sending(name, fn))
    try:
        yield
    finally:
        param_group.foreach_reduce = reduce
        for name, fn in originals.items():
            setattr(dist, name, fn)


@contextlib.contextmanager
def compile_counted(result: dict, steps: int):
    """Count Dynamo's graphs and breaks over the case, and the compiled regions of its last step."""
    from collections import Counter

    from torch._dynamo.utils import counters
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()  # every case compiles its own blocks, as a fresh run would
    counters.clear()
    step = Trainer.step
    events: Counter = Counter()

    def profiled(self, i):
        if i != steps - 1:
            return step(self, i)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = step(self, i)
        events.update(e.name for e in prof.events())
        return out

    Trainer.step = profiled
    try:
        yield
    finally:
        Trainer.step = step
    result["dynamo_breaks"] = [k.splitlines()[0] for k in list(counters["graph_break"]) + list(counters["unimplemented"])]
    result["dynamo_graphs"] = counters["stats"]["unique_graphs"]
    result["compiled_forward"] = events["CompiledFunction"]
    result["compiled_backward"] = events["CompiledFunctionBackward"]


def main() -> None:
    cases_path, results_path = sys.argv[1], sys.argv[2]
    cases = json.load(open(cases_path))
    dist.init_process_group("gloo")
    results = {}
    for case in cases:
        t0 = time.perf_counter()
        try:
            plan = plan_from_dict(case["plan"])
            opts = RunOptions(steps=case.get("steps", 5), seed=case.get("seed", 0), quiet=True,
                              data=case.get("data", "synthetic"),
                              track_memory=case.get("track_memory", "off"), timing_warmup=2,
                              balanced_routing=case.get("balanced_routing", False))
            seen: dict[str, set] = {"device_violations": set(), "compute_dtypes": set(), "master_dtypes": set(),
                                    "reduce_dtypes": set()}
            compiled: dict = {}
            with contextlib.ExitStack() as stack:
                if case.get("inspect"):
                    stack.enter_context(inspected_steps(seen))
                    stack.enter_context(reductions_recorded(seen, compiled))
                if case.get("compile_check"):
                    stack.enter_context(compile_counted(compiled, opts.steps))
                rows = run_training(plan, opts, torch.device("cpu"))
            results[case["name"]] = {"losses": [r.loss for r in rows], **compiled,
                                     "routing": [[r.tokens_per_expert, r.moe_imbalance, r.aux_loss] for r in rows],
                                     "peak_memory_gib": [r.peak_memory_gib for r in rows],
                                     **{k: sorted(v) for k, v in seen.items()},
                                     "seconds": time.perf_counter() - t0}
        except Exception:
            results[case["name"]] = {"error": traceback.format_exc()}
            print(f"[rank {dist.get_rank()}] case {case['name']} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        if dist.get_rank() == 0:  # after every case, so a world that hangs later keeps what ran
            _write(results, results_path)
        dist.barrier()
    dist.destroy_process_group()


def _write(results: dict, path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
