"""Pruning meshes and knob classes whole, before any of their leaves is built.

A mesh that breaks a rule, or whose model states alone overflow the device, is rejected with all
its leaves. A (mesh, order, micro-batch) node gets a memory bound from its smallest-memory knobs
and a time bound from its fastest; a knob class gets its own time bound when the node is opened
and its memory bound when it comes up. Whatever a bound removes is counted in the pool.
"""

from __future__ import annotations

import itertools

from meshplan.planner.bounds import Bounds
from meshplan.planner.constraints import NO_FIT, PP_LAYERS, SP_SEQ, mesh_reason, sp_reason
from meshplan.planner.enumeration import Enumeration, KnobClass, fastest_member
from meshplan.planner.pool import Pool
from meshplan.planner.space import SAC_ILP, Mesh, Space
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import SAC_OPS
from meshplan.specs.rules import COMPILE_UNTRACEABLE, FLOAT8_UNCOMPILED, float8_compile_reason


class Pruning:
    def __init__(self, space: Space, prof: ClusterProfile, usable_gib: float, pool: Pool, enum: Enumeration,
                 bounds: Bounds):
        self.space, self.prof, self.spec, self.usable = space, prof, space.plan.model, usable_gib
        self.pool, self.enum, self.bounds = pool, enum, bounds

    def mesh_reason(self, m: Mesh) -> str | None:
        """Why no leaf of mesh `m` can run or fit, or None."""
        reason = mesh_reason(self.spec, self.prof, self.space.seq_len, m.tp, m.cp)
        if not reason and m.pp > self.spec.n_layers:
            reason = PP_LAYERS
        if not reason and self.bounds.static_memory_gib(m) > self.usable:
            reason = NO_FIT
        return reason

    def mesh_node(self, m: Mesh, mb: int, order, leaves: int):
        """(time bound, mesh, mb, order, leaves) over every knob setting, or None if nothing can fit.

        Memory: the smallest-memory knobs (full AC, SP, float8, reshard) bound every class below.
        Time: the fastest knobs (no AC, no reshard, either SP and float8 choice) bound them."""
        s = self.space
        sps = [x for x in s.sp_options(m.tp) if not sp_reason(s.seq_len, m.tp, m.cp, x)]
        if not sps:
            self.pool.reject(SP_SEQ, leaves)
            return None
        acs = [a for a, _ in s.ac_options()]
        small_ac = "full" if "full" in acs else "selective" if "selective" in acs else "none"
        small = self.enum.layout(m, mb, max(sps), small_ac, () if small_ac == "selective" else None,
                                 max(s.float8_options()), max(s.reshard_options(m)))
        mem = self.bounds.rank_memory_bound_gib(small)
        if mem > self.usable:
            self.pool.reject(NO_FIT, leaves)
            self.pool.note_nonfit(small, order, self.bounds.class_time_bound(small, order), mem, exact=False)
            return None
        fast_ac = "none" if "none" in acs else "selective" if "selective" in acs else "full"
        fast_sac = tuple(SAC_OPS) if fast_ac == "selective" else None
        bound = min(self.bounds.class_time_bound(self.enum.layout(m, mb, sp, fast_ac, fast_sac, f8,
                                                                  min(s.reshard_options(m))), order)
                    for sp in sps for f8 in s.float8_options())
        return bound, m, mb, order, leaves

    def classes(self, m: Mesh, mb: int, order) -> list[KnobClass]:
        """The knob classes of a node that its own time bound does not prune (the rest counted)."""
        s, pool = self.space, self.pool
        n_sched = self.enum.schedule_leaves(m.pp)
        variants = self.enum.class_variants(m.tp)
        out = []
        for sp in s.sp_options(m.tp):
            per_sp = len(s.ac_options()) * len(s.float8_options()) * len(s.reshard_options(m)) * n_sched * variants
            if sp_reason(s.seq_len, m.tp, m.cp, sp):
                pool.reject(SP_SEQ, per_sp)
                continue
            for (ac, sac), f8, reshard in itertools.product(s.ac_options(), s.float8_options(), s.reshard_options(m)):
                compiles = s.runnable_compiles(m.tp, m.cp, ac)
                n_async = len(s.async_options(m.tp))
                pool.reject(COMPILE_UNTRACEABLE, n_sched * (variants - len(compiles) * n_async))
                eager_f8 = [c for c in compiles if float8_compile_reason(f8, c)]
                pool.reject(FLOAT8_UNCOMPILED, n_sched * len(eager_f8) * n_async)
                compiles = [c for c in compiles if c not in eager_f8]
                kept = len(compiles) * n_async
                if not compiles:
                    continue
                # The class's layout takes the fastest variant the rules leave (compile when it may).
                lay = self.enum.layout(m, mb, sp, ac, sac, f8, reshard).with_(compile=max(compiles))
                pool.n_dom += n_sched * kept - n_sched
                bound = self.bounds.class_time_bound(fastest_member(lay, sac), order)
                if bound >= pool.kth():  # the K-th best only improves: this class will never be expanded
                    pool.n_bounded += n_sched
                    continue
                out.append(KnobClass(bound, next(pool.tie), lay, order, sac, n_sched))
        return out

    def class_fits(self, c: KnobClass) -> bool:
        """The memory bound, checked when the class comes up (most classes never do)."""
        small = c.layout.with_(sac_ops=()) if c.sac == SAC_ILP else c.layout
        mem = self.bounds.rank_memory_bound_gib(small)
        if mem <= self.usable:
            return True
        self.pool.reject(NO_FIT, c.leaves)
        self.pool.note_nonfit(fastest_member(c.layout, c.sac), c.order, c.bound, mem, exact=False)
        return False

