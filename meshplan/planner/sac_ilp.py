"""Which op kinds selective activation checkpointing saves: a 0-1 ILP, like PyTorch's SAC ILP.

Variables: x_k = 1 if op kind k's outputs are saved, y = 1 if anything is recomputed at all.
    minimise   sum_k t_k (1 - x_k) + e * y                (recompute seconds per block)
    subject to sum_k b_k x_k <= budget - b_0                (saved bytes per token per block)
               y >= 1 - x_k   for every kind recompute can run
Item values come from the cost model itself (`sac_items`): b_k from activations.py's inventory
(`activation_bytes_per_token`), t_k and e (the elementwise forward every recomputing block repeats)
from timing.block_time's recompute figure, measured one kind at a time.

`solve_sac_ilp` solves it with pulp/CBC. `best_subset` gives the same optimum by exhaustive
enumeration of the 2^n assignments (n = 5 kinds): the search calls it per candidate because a
CBC process per candidate would cost ~20 ms; tests check both against brute force over the cost
model, and the planner re-solves the winning plan's choice with pulp (see search.py).
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from pathlib import Path

from meshplan.specs.plan import SAC_OPS


@dataclass(frozen=True)
class SacItems:
    """Per-block figures: bytes per token saved by each kind, recompute seconds avoided by it."""

    kinds: tuple[str, ...]
    bytes_per_token: dict[str, float]
    base_bytes_per_token: float  # always kept (block input)
    recompute_s: dict[str, float]  # t_k
    shared_recompute_s: float  # e: paid once if anything is recomputed

    def bytes_of(self, saved: tuple[str, ...]) -> float:
        return self.base_bytes_per_token + sum(self.bytes_per_token[k] for k in saved)

    def time_of(self, saved: tuple[str, ...]) -> float:
        lost = [k for k in self.kinds if k not in saved and self.recompute_s[k] > 0]
        return sum(self.recompute_s[k] for k in lost) + (self.shared_recompute_s if lost else 0.0)


def best_subset(items: SacItems, budget_bytes_per_token: float) -> tuple[str, ...] | None:
    """Optimum of the ILP by enumeration; ties go to fewer saved bytes. None if nothing fits."""
    best = None
    for r in range(len(items.kinds) + 1):
        for saved in itertools.combinations(items.kinds, r):
            b = items.bytes_of(saved)
            if b > budget_bytes_per_token * (1 + 1e-12):
                continue
            key = (items.time_of(saved), b)
            if best is None or key < best[0]:
                best = (key, saved)
    return None if best is None else _canonical(best[1])


def pareto_subsets(items: SacItems) -> list[tuple[str, ...]]:
    """Subsets not dominated in (recompute time, bytes), fastest first: what any budget can pick."""
    allsets = [s for r in range(len(items.kinds) + 1) for s in itertools.combinations(items.kinds, r)]
    scored = sorted(((items.time_of(s), items.bytes_of(s), _canonical(s)) for s in allsets))
    out, min_bytes = [], float("inf")
    for t, b, s in scored:
        if b < min_bytes - 1e-9:
            out.append(s)
            min_bytes = b
    return out


def cbc_path() -> str | None:
    """The CBC binary `pulp[cbc]` installs beside this interpreter (the environment's bin): COIN_CMD alone looks
    for `cbc` on PATH, which holds only when the environment is activated (`.venv/bin/python -m meshplan plan`
    without it crashed). None: COIN_CMD's own search of PATH."""
    beside = Path(sys.executable).with_name("cbc")
    return str(beside) if beside.is_file() else None


def solve_sac_ilp(items: SacItems, budget_bytes_per_token: float) -> tuple[str, ...] | None:
    """The ILP above solved with pulp (CBC). None if even saving nothing exceeds the budget."""
    import pulp

    if items.base_bytes_per_token > budget_bytes_per_token * (1 + 1e-12):
        return None
    prob = pulp.LpProblem("sac", pulp.LpMinimize)
    x = {k: prob.add_variable(f"save_{k}", cat="Binary") for k in items.kinds}
    y = prob.add_variable("any_recompute", cat="Binary")
    # Scale to well-conditioned units (microseconds, bytes relative to the budget).
    scale_t = 1e6
    eps = 1e-9  # prefer fewer saved bytes among equal-time choices
    prob += (pulp.lpSum(items.recompute_s[k] * scale_t * (1 - x[k]) for k in items.kinds)
             + items.shared_recompute_s * scale_t * y
             + pulp.lpSum(eps * items.bytes_per_token[k] * x[k] for k in items.kinds))
    prob += (pulp.lpSum(items.bytes_per_token[k] * x[k] for k in items.kinds)
             <= budget_bytes_per_token * (1 + 1e-12) - items.base_bytes_per_token)
    for k in items.kinds:
        if items.recompute_s[k] > 0:
            prob += y >= 1 - x[k]
    # COIN_CMD runs the CBC binary that `pulp[cbc]` installs (cbcbox); PuLP 3.3 deprecates its
    # bundled PULP_CBC_CMD.
    status = prob.solve(pulp.COIN_CMD(msg=False, path=cbc_path()))
    if pulp.LpStatus[status] != "Optimal":
        return None
    return _canonical(tuple(k for k in items.kinds if (x[k].value() or 0.0) > 0.5))


def _canonical(saved: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(k for k in SAC_OPS if k in saved)
