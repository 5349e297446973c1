"""The declared search space: which values each plan field may take, given what the plan fixes.

A field that is 'auto' in the plan is searched over the options below; a fixed field has one
option. Options of a knob depend only on the mesh degrees (e.g. async TP exists only with tp > 1),
so a subtree's size is a product of option counts: the summary counts every leaf, not a sample.

  degrees        every ordered factorisation gpus = dp_replicate * dp_shard * cp * tp * pp, and for an MoE
                 model every EP degree that folds into dp_shard * cp * tp and divides the experts
  micro_batch    every divisor of global_batch
  seq. parallel  {true, false} with tp > 1            async TP  {false, true} with tp > 1
  pp schedule    all 7 with pp > 1; virtual stages 1 (GPipe, 1F1B), 2 (V-shaped), 1..4 (others)
  pp_layers      even split and the time-balanced split (stage_split.py), with pp > 1; with the SAC
                 subset searched, the split is balanced for TorchTitan's op policy's layer time and
                 the subset is chosen for it (the split comes first, as a user would set it)
  activation ck. none | selective (TorchTitan op policy) | selective (SAC ILP) | full
  float8         {false, true} where the profile has fp8 peaks
  reshard        {true, false} where it changes anything (dp_shard > 1 and pp = 1)
  compile        {false, true}; on gloo not true with tp > 1 and AC none (specs/rules.py)
  mesh order     one per distinct placement of the groups on link levels (placement.py)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan.errors import InputError
from meshplan.fields import AUTO
from meshplan.planner.defaults import default_global_batch, default_seq_len
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import PP_SCHEDULES, SINGLE_STAGE_SCHEDULES, V_SHAPED_SCHEDULES, Plan
from meshplan.specs.rules import (async_tp_reason, compile_reason, ep_reason, mla_reason, moe_schedule_reason,
                                  moe_tp_reason, profile_backend, stack_reason, tied_embeddings_reason,
                                  uses_fully_shard)

SAC_DEFAULT = "default"  # selective AC with TorchTitan's op policy (sac_ops: null)
SAC_ILP = "ilp"  # selective AC with the op kinds the SAC ILP chooses under the memory budget
EVEN = "even"
BALANCED = "balanced"
DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")


def memoized(method):
    """Cache a Space method's answer per arguments: the search asks the same questions ~10^5 times."""
    name = method.__name__

    def cached(self, *args):
        key = (name, args)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = method(self, *args)
        return got

    cached.__doc__ = method.__doc__
    return cached


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pin_to_one(plan: Plan, dims: tuple[str, ...], why: str) -> str:
    """Set each of `dims` the plan leaves auto to 1; the note saying so."""
    for dim in dims:
        if getattr(plan.parallel, dim) == AUTO:
            setattr(plan.parallel, dim, 1)
    return f"{' = '.join(dims)} = 1 for {plan.model.name}: {why}"


@dataclass(frozen=True)
class Mesh:
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int = 1  # expert parallelism, folded into dp_shard x cp x tp (specs/rules.ep_reason)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def as_dict(self) -> dict[str, int]:
        out = {d: getattr(self, d) for d in DEGREES}
        return {**out, "ep": self.ep} if self.ep > 1 else out


@dataclass
class Space:
    plan: Plan
    profile: ClusterProfile
    seq_len: int
    global_batch: int
    dtype: str
    assumptions: list[str] = field(default_factory=list)
    excludes: dict[str, list[Any]] = field(default_factory=dict)
    _memo: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_plan(cls, plan: Plan, profile: ClusterProfile, excludes: dict[str, list[Any]] | None = None) -> "Space":
        why = stack_reason(plan.stack, "plan")  # the search builds meshplan-runtime layouts (enumeration.py)
        if why:
            raise InputError("stack", why)
        t = plan.training
        notes = []
        dtype = t.dtype
        if dtype == AUTO:
            dtype = "bf16" if "bf16" in profile.device.peak_tflops else "fp32"
        seq_len = t.seq_len
        if seq_len == AUTO:
            seq_len, note = default_seq_len(plan.model)
            notes.append(note)
        gb = t.global_batch
        if gb == AUTO:
            gb, note = default_global_batch(plan.model, seq_len, plan.gpus, profile, dtype)
            notes.append(note)
        # The workload is fixed from here on: what the search (and any re-search) plans for.
        plan = plan.copy()
        # Degrees the runtime runs at 1 for this model (specs/rules.py), where the plan leaves them auto.
        if plan.model.tied_embeddings:
            notes.append(_pin_to_one(plan, ("tp", "pp"), tied_embeddings_reason(True, 2, 2)))
        if plan.model.mla is not None:
            notes.append(_pin_to_one(plan, ("tp", "cp"), mla_reason(True, 2, 2)))
        plan.training.seq_len, plan.training.global_batch = seq_len, gb
        if plan.gpus > profile.devices_per_node * profile.max_nodes:
            raise InputError("gpus", f"{plan.gpus} exceeds the cluster's {profile.devices_per_node} x {profile.max_nodes} devices")
        return cls(plan, profile, seq_len, gb, dtype, notes, dict(excludes or {}))

    # -- helpers ---------------------------------------------------------------------------
    def _opts(self, key: str, value: Any, searched: list[Any]) -> list[Any]:
        """`searched` if the plan leaves `key` auto, else the fixed value; minus --exclude values."""
        opts = searched if value == AUTO else [value]
        bad = self.excludes.get(key, [])
        return [o for o in opts if o not in bad]

    # -- degrees ---------------------------------------------------------------------------
    def meshes(self) -> list[Mesh]:
        p = self.plan.parallel
        fixed = {d: getattr(p, d) for d in DEGREES}
        out = []

        def rec(i: int, left: int, acc: list[int]) -> None:
            if i == len(DEGREES) - 1:
                cand = acc + [left]
                m = Mesh(*cand)
                if all(self._allowed(d, getattr(m, d), fixed[d]) for d in DEGREES):
                    out.extend(Mesh(*cand, ep=e) for e in self.ep_options(m.dp_shard, m.cp, m.tp))
                return
            for d in divisors(left):
                if self._allowed(DEGREES[i], d, fixed[DEGREES[i]]):
                    rec(i + 1, left // d, acc + [d])

        rec(0, self.plan.gpus, [])
        return out

    def _allowed(self, key: str, value: int, fixed: Any) -> bool:
        if fixed != AUTO and value != fixed:
            return False
        return value not in self.excludes.get(f"parallel.{key}", [])

    @memoized
    def ep_options(self, dp_shard: int, cp: int, tp: int) -> list[int]:
        """EP degrees that shard the routed experts on these degrees (1 alone for a dense model)."""
        spec = self.plan.model
        searched = [1] + ([e for e in divisors(spec.moe.experts) if e > 1 and ep_reason(spec, e, dp_shard, cp, tp) is None]
                          if spec.is_moe else [])
        fixed = self.plan.parallel.ep
        opts = searched if fixed == AUTO else [fixed] if ep_reason(spec, fixed, dp_shard, cp, tp) is None else []
        # What the runtime builds (rules.moe_tp_reason): with TP, EP folds it, and SP (sp_options) goes with it.
        return [e for e in opts if e not in self.excludes.get("parallel.ep", [])
                and moe_tp_reason(spec.is_moe, e, tp, True) is None]

    # -- per-mesh knob options -------------------------------------------------------------
    @memoized
    def micro_batches(self) -> list[int]:
        return self._opts("training.micro_batch", self.plan.training.micro_batch, divisors(self.global_batch))

    @memoized
    def sp_options(self, tp: int) -> list[bool]:
        # An MoE model runs TP with SP only (rules.moe_tp_reason).
        searched = [False] if tp == 1 else [True] if self.plan.model.is_moe else [True, False]
        return self._opts("parallel.sequence_parallel", self.plan.parallel.sequence_parallel, searched)

    @memoized
    def async_options(self, tp: int) -> list[bool]:
        # Offered only where the runtime can run it (specs/rules.py): NCCL, with compile possible.
        runnable = async_tp_reason(tp, max(self.compile_options(), default=False),
                                   profile_backend(self.profile.provenance)) is None
        return self._opts("parallel.async_tp", self.plan.parallel.async_tp, [False, True] if tp > 1 and runnable else [False])

    @memoized
    def schedule_options(self, pp: int) -> list[tuple[str, int]]:
        """(schedule, virtual stages) pairs; with pp = 1 the schedule is moot (one placeholder)."""
        p = self.plan.parallel
        if pp == 1:
            return [("1F1B", 1)]
        out = []
        for s in self._opts("parallel.pp_schedule", p.pp_schedule, list(PP_SCHEDULES)):
            if moe_schedule_reason(self.plan.model.is_moe, pp, s):
                continue  # what the runtime does not run (specs/rules.py)
            vs = [1] if s in SINGLE_STAGE_SCHEDULES else [2] if s in V_SHAPED_SCHEDULES else [1, 2, 3, 4]
            for v in self._opts("parallel.pp_virtual_stages", p.pp_virtual_stages, vs):
                out.append((s, v))
        return out

    @memoized
    def split_options(self, pp: int) -> list[Any]:
        """EVEN, BALANCED or a fixed list of layers per stage."""
        p = self.plan.parallel
        if pp == 1:
            return [EVEN]
        if p.pp_layers not in (None, AUTO):
            return [tuple(p.pp_layers)]
        searched = p.pp_layers == AUTO or AUTO in (p.pp, p.pp_schedule, p.pp_virtual_stages)
        return [EVEN, BALANCED] if searched else [EVEN]

    @memoized
    def ac_options(self) -> list[tuple[str, Any]]:
        """(activation_checkpointing, sac choice): sac choice is SAC_DEFAULT, SAC_ILP or a fixed tuple."""
        m = self.plan.memory
        sac = m.sac_ops
        acs = self._opts("memory.activation_checkpointing", m.activation_checkpointing, ["none", "selective", "full"])
        out = []
        for ac in acs:
            if ac != "selective":
                out.append((ac, None))
            elif sac == AUTO:
                out.append((ac, SAC_ILP))
            elif sac is not None:
                out.append((ac, tuple(sac)))
            elif m.activation_checkpointing == AUTO:
                out += [(ac, SAC_DEFAULT), (ac, SAC_ILP)]
            else:
                out.append((ac, SAC_DEFAULT))
        return out

    @memoized
    def float8_options(self) -> list[bool]:
        # Only where it may compile: uncompiled float8 is refused (specs/rules.float8_compile_reason).
        ok = self.profile.supports_float8() and self.dtype == "bf16" and True in self.compile_options()
        return self._opts("memory.float8", self.plan.memory.float8, [False, True] if ok else [False])

    @memoized
    def reshard_options(self, mesh: Mesh) -> list[bool]:
        # Where nothing is fully_shard-ed the field is moot and written false (specs/rules.py).
        moot = not uses_fully_shard(mesh.dp_shard * mesh.cp, mesh.dp_replicate, self.dtype)
        searched = [True, False] if (mesh.dp_shard > 1 and mesh.pp == 1) else [mesh.pp == 1 and not moot]
        return self._opts("memory.reshard_after_forward", self.plan.memory.reshard_after_forward, searched)

    @memoized
    def compile_options(self) -> list[bool]:
        return self._opts("compile", self.plan.compile, [False, True])

    @memoized
    def runnable_compiles(self, tp: int, cp: int, ac: str) -> list[bool]:
        """compile_options() less what the runtime cannot run compiled with these degrees and AC (specs/rules.py)."""
        backend = profile_backend(self.profile.provenance)
        moe = self.plan.model.is_moe
        return [c for c in self.compile_options() if compile_reason(c, tp, cp, ac, backend, moe) is None]
