"""Shared helpers for the planner tests: plans from CLI-like arguments, tight-memory profiles, and an
independent brute-force enumeration of the planner's declared space scored with the cost model.

The enumeration is written from the space's documentation (space.py docstring, DESIGN.md), not
from the search code: every ordered factorisation of the GPUs, every micro-batch, SP, async TP,
AC none / full / selective with TorchTitan's default policy or any of the 2^5 SAC subsets,
float8, reshard, compile, every (schedule, virtual stages) pair with the even and the balanced
split, and every mesh order of placement.candidate_orders() (deduplicated by the group spans the
cost model charges, since orders with equal spans score identically).
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterator

from meshplan.cost_models.estimate import estimate_layout, group_spans, stage_durations
from meshplan.cost_models.layout import Layout, even_split, runtime_paths
from meshplan.fields import AUTO
from meshplan.commands.plan import build_plan_mapping
from meshplan.planner.placement import candidate_orders
from meshplan.planner.stage_split import balanced_split
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import PP_SCHEDULES, SAC_OPS, Plan, plan_from_dict
from meshplan.specs.rules import (ac_schedule_reason, async_tp_reason, compile_reason, float8_compile_reason,
                                  microbatch_reason, profile_backend, uses_fully_shard)

SINGLE = ("GPipe", "1F1B")
VSHAPED = ("ZBVZeroBubble", "DualPipeV")


class _Args:
    def __init__(self, model, gpus, cluster, seq_len, global_batch, fix):
        self.model, self.gpus, self.cluster = model, gpus, cluster
        self.seq_len, self.global_batch, self.fix = seq_len, global_batch, list(fix)


def make_plan(model: Any, gpus: int, seq_len: int, global_batch: int | None, cluster: str = "h100-80g-dgx",
              fix: tuple[str, ...] = ()) -> Plan:
    """The same partial plan `meshplan plan` builds from its flags."""
    return plan_from_dict(build_plan_mapping(_Args(model, gpus, cluster, seq_len, global_batch, fix)))


_TIGHT: dict = {}


def tight_profile(name: str, usable_gib: float, shared: bool = True):
    """A private copy of a built-in profile with other usable memory (the built-in stays untouched).
    One copy per built-in is reused, so the cost model's memo on it (block times, which do not depend
    on memory capacity) carries over between budgets."""
    prof = _TIGHT.get(name) if shared else None
    if prof is None:
        prof = copy.deepcopy(load_profile(name))
        prof.__dict__.pop("_cost_cache", None)
        prof.name = f"{name}-tight"
        if shared:
            _TIGHT[name] = prof
    prof.device.usable_memory_gib = usable_gib
    return prof


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def factorisations(n: int, k: int) -> Iterator[tuple[int, ...]]:
    if k == 1:
        yield (n,)
        return
    for d in divisors(n):
        for rest in factorisations(n // d, k - 1):
            yield (d,) + rest


def _opt(value: Any, searched: list[Any]) -> list[Any]:
    return list(searched) if value == AUTO else [value]


@dataclass
class Leaf:
    layout: Layout
    order: tuple[str, ...]
    step_time_s: float
    peak_memory_gib: float
    fits: bool


_BALANCED: dict = {}


def balanced_layers(lay: Layout, prof, order) -> tuple[int, ...]:
    """The time-balanced split: per-stage work of the even split, extras = work beyond its layers."""
    key = (id(prof), lay.with_(schedule="1F1B", stage_layers=()), order)
    got = _BALANCED.get(key)
    if got is None:
        got = _BALANCED[key] = _balanced_layers(lay, prof, order)
    return got


def _balanced_layers(lay: Layout, prof, order) -> tuple[int, ...]:
    spans = group_spans(lay, prof, order)
    n = lay.n_stages
    even = even_split(lay.spec.n_layers, n)
    one = lay.with_(pp=1, schedule="1F1B", v=1, stage_layers=(1,))
    two = lay.with_(pp=1, schedule="1F1B", v=1, stage_layers=(2,))
    d1, d2 = stage_durations(one, prof, spans), stage_durations(two, prof, spans)
    per_layer = (d2.forward[0] + d2.backward[0] + d2.weight[0]) - (d1.forward[0] + d1.backward[0] + d1.weight[0])
    d = stage_durations(lay.with_(stage_layers=even), prof, spans)
    extras = [d.forward[i] + d.backward[i] + d.weight[i] - even[i] * per_layer for i in range(n)]
    # A middle stage's extra work is 0 but for float rounding (1e-21 s here), which balanced_split's
    # tie-break between equally balanced splits (the stage with the larger extras gives layers back first)
    # must not read: the planner's middle stages carry exactly 0.
    extras = [0.0 if abs(x) < 1e-9 * per_layer else x for x in extras]
    return balanced_split(lay.spec.n_layers, extras, per_layer)


def enumerate_space(plan: Plan, prof, global_batch: int, all_sac_subsets: bool = True) -> Iterator[tuple[Layout, tuple]]:
    """Every complete layout (and distinct mesh order) of the declared space that passes the hard rules."""
    spec, p, t, mem = plan.model, plan.parallel, plan.training, plan.memory
    seq = t.seq_len
    dtype = t.dtype if t.dtype != AUTO else "bf16"
    # float8 only where it may compile (uncompiled float8 is refused on a GPU: specs/rules.py).
    f8_ok = prof.supports_float8() and dtype == "bf16" and plan.compile in (AUTO, True)
    subsets = [tuple(s) for r in range(len(SAC_OPS) + 1) for s in itertools.combinations(SAC_OPS, r)]
    for dr, ds, cp, tp, pp in factorisations(plan.gpus, 5):
        fixed = dict(dp_replicate=p.dp_replicate, dp_shard=p.dp_shard, cp=p.cp, tp=p.tp, pp=p.pp)
        got = dict(dp_replicate=dr, dp_shard=ds, cp=cp, tp=tp, pp=pp)
        if any(fixed[k] != AUTO and fixed[k] != got[k] for k in got):
            continue
        if tp > prof.devices_per_node or spec.n_heads % tp or spec.n_kv_heads % tp or spec.ffn_dim % tp:
            continue
        if cp > 1 and seq % (2 * cp):
            continue
        if pp > spec.n_layers:
            continue
        dp = dr * ds
        probe = runtime_paths(Layout(spec=spec, gpus=plan.gpus, seq_len=seq, global_batch=global_batch, micro_batch=1, dtype=dtype,
                       dp_replicate=dr, dp_shard=ds, tp=tp, sp=False, async_tp=False, pp=pp, schedule="1F1B", v=1,
                       stage_layers=even_split(spec.n_layers, pp), cp=cp, ac="none", sac_ops=None, float8=False,
                       reshard_after_forward=True, compile=False),
                              prof)  # Layout's defaults: meshplan's own runtime, as the search plans it
        orders, seen = [], set()
        for order in candidate_orders():
            key = tuple(sorted(group_spans(probe, prof, order).items()))
            if key not in seen:
                seen.add(key)
                orders.append(order)
        for mb in _opt(t.micro_batch, divisors(global_batch)):
            if global_batch % (mb * dp):
                continue
            n_micro = global_batch // (mb * dp)
            sps = [x for x in _opt(p.sequence_parallel, [True, False] if tp > 1 else [False])
                   if not (x and tp > 1 and (seq // cp) % tp)]
            # Async TP only where the runtime runs it (NCCL, compile possible): specs/rules.py.
            runnable = async_tp_reason(tp, max(_opt(plan.compile, [False, True]), default=False),
                                       profile_backend(prof.provenance)) is None
            asyncs = _opt(p.async_tp, [False, True] if tp > 1 and runnable else [False])
            acs = []
            for ac in _opt(mem.activation_checkpointing, ["none", "selective", "full"]):
                if ac != "selective":
                    acs.append((ac, None))
                elif mem.sac_ops not in (None, AUTO):
                    acs.append((ac, tuple(mem.sac_ops)))
                else:
                    if mem.sac_ops is None or mem.activation_checkpointing == AUTO:
                        acs.append((ac, None))  # TorchTitan's default policy
                    if mem.sac_ops == AUTO and all_sac_subsets:
                        acs += [(ac, s) for s in subsets]
            f8s = _opt(mem.float8, [False, True] if f8_ok else [False])
            moot = not uses_fully_shard(ds * cp, dr, dtype)
            reshards = _opt(mem.reshard_after_forward, [True, False] if (ds > 1 and pp == 1) else [pp == 1 and not moot])
            compiles = _opt(plan.compile, [False, True])
            if pp == 1:
                scheds = [("1F1B", 1)]
            else:
                scheds = []
                for s in _opt(p.pp_schedule, list(PP_SCHEDULES)):
                    vs = [1] if s in SINGLE else [2] if s in VSHAPED else [1, 2, 3, 4]
                    for v in _opt(p.pp_virtual_stages, vs):
                        if pp * v <= spec.n_layers and not microbatch_reason(s, pp, v, n_micro):
                            scheds.append((s, v))
            for sp, at, (ac, sac), f8, rs, comp, (sched, v), order in itertools.product(
                    sps, asyncs, acs, f8s, reshards, compiles, scheds, orders):
                if (ac_schedule_reason(pp, sched, ac) or compile_reason(comp, tp, cp, ac, profile_backend(prof.provenance))
                        or float8_compile_reason(f8, comp)):
                    continue
                lay = probe.with_(micro_batch=mb, sp=sp and tp > 1, async_tp=at, ac=ac, sac_ops=sac, float8=f8,
                                  reshard_after_forward=rs, compile=comp, schedule=sched, v=v,
                                  stage_layers=even_split(spec.n_layers, pp * v))
                if pp == 1:
                    yield lay, order
                    continue
                splits = {lay.stage_layers}
                # A searched SAC subset is chosen after the split: the split is balanced for the
                # layer time under TorchTitan's op policy (space.py), whichever subset then runs.
                timed = lay.with_(sac_ops=None) if ac == "selective" and mem.sac_ops == AUTO else lay
                splits.add(balanced_layers(timed, prof, order))
                for layers in sorted(splits):
                    yield lay.with_(stage_layers=layers), order


def brute_force(plan: Plan, prof, global_batch: int, all_sac_subsets: bool = True) -> tuple[Leaf | None, int, int]:
    """(fastest fitting leaf, leaves scored, leaves that fit) over the whole declared space."""
    best, n, n_fit = None, 0, 0
    usable = prof.device.usable_memory_gib
    for lay, order in enumerate_space(plan, prof, global_batch, all_sac_subsets):
        try:
            est = estimate_layout(lay, prof, order)
        except RuntimeError:  # the pipeline simulation refuses the schedule
            continue
        n += 1
        if est.peak_memory_gib > usable:
            continue
        n_fit += 1
        if best is None or est.step_time_s < best.step_time_s:
            best = Leaf(lay, order, est.step_time_s, est.peak_memory_gib, True)
    return best, n, n_fit


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def isclose(a: float, b: float, tol: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=0.0)
