"""Uneven layer splits over pipeline stages: minimise the slowest stage.

Every block costs the same (`layer`), the first stage also pays the embedding and the last the
head and loss (`extras`). The optimum of min over splits of max over stages is found exactly by a
binary search over the finite set of possible stage times {k*layer + extra_s}: a target time T is
feasible iff the stages can hold n_layers with at least one layer each, each stage s holding at most
floor((T - extra_s) / layer) layers (a greedy capacity test, so the search is exact).
"""

from __future__ import annotations

import math
from collections import Counter


def _fits(target: float, layer: float, extras: Counter, n_layers: int) -> bool:
    """Can stages whose time stays <= target hold n_layers, at least one layer each?"""
    total = 0
    for e, count in extras.items():
        k = math.floor((target - e) / layer + 1e-9) if layer > 0 else n_layers
        if k < 1:
            return False
        total += count * min(k, n_layers)
    return total >= n_layers


def _capacities(target: float, layer: float, extras: list[float], n_layers: int) -> list[int]:
    return [min(math.floor((target - e) / layer + 1e-9), n_layers) if layer > 0 else n_layers for e in extras]


def balanced_split(n_layers: int, extras: list[float], layer: float) -> tuple[int, ...]:
    """Layers per stage minimising max_s(layers_s * layer + extras_s); each stage gets >= 1 layer.

    Among optimal splits, surplus capacity is taken back from the stages with the largest extras
    first (so the embedding / head stages end up lightest) and otherwise from the last stages.
    """
    n = len(extras)
    if n > n_layers:
        raise ValueError(f"{n} stages for {n_layers} layers")
    if n == 1:
        return (n_layers,)
    groups = Counter(extras)  # stages with equal extras have equal capacity: test each value once
    values = sorted({k * layer + e for e in groups for k in range(1, n_layers + 1)})
    lo, hi = 0, len(values) - 1
    while lo < hi:  # smallest feasible target (feasibility is monotone in the target)
        mid = (lo + hi) // 2
        if _fits(values[mid], layer, groups, n_layers):
            hi = mid
        else:
            lo = mid + 1
    caps = _capacities(values[lo], layer, extras, n_layers)
    surplus = sum(caps) - n_layers
    # Take surplus from stages with large extras, then from the back: both keep max <= target.
    order = [s for e in sorted(groups, reverse=True) for s in range(n - 1, -1, -1) if extras[s] == e]
    while surplus:
        for s in order:
            if surplus and caps[s] > 1:
                caps[s] -= 1
                surplus -= 1
    return tuple(caps)


def balanced_split_costs(costs: list[float], extras: list[float]) -> tuple[int, ...]:
    """Layers per stage minimising the slowest stage, max_s(sum of its layers' costs + extras_s), when layers
    cost differently (an MoE model's dense first layers): stages hold consecutive layers, at least one each.

    Exact: the optimum is one of the finitely many sums costs[i:j] + extras_s, searched by bisection with a
    feasibility test that tracks every layer boundary each stage can end at under the target (a heavy layer
    may not fit a stage with large extras, so filling stages greedily is not enough)."""
    n, n_stages = len(costs), len(extras)
    if n_stages > n:
        raise ValueError(f"{n_stages} stages for {n} layers")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def ends(target: float) -> list[list[bool]] | None:
        """reach[s][j]: stages 0..s can cover layers [0, j) within the target."""
        reach = [[j == 0 for j in range(n + 1)]]
        for e in extras:
            prev, new, top = reach[-1], [False] * (n + 1), 0
            for i in range(n):
                if not prev[i]:
                    continue
                top = max(top, i)
                while top < n and prefix[top + 1] - prefix[i] + e <= target * (1 + 1e-12):
                    top += 1
                    new[top] = True
            reach.append(new)
        return reach if reach[-1][n] else None

    values = sorted({prefix[j] - prefix[i] + e for e in set(extras) for i in range(n) for j in range(i + 1, n + 1)})
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ends(values[mid]) is not None:
            hi = mid
        else:
            lo = mid + 1
    target, reach = values[lo], ends(values[lo])
    split, j = [], n
    for s in range(n_stages - 1, -1, -1):  # back from the end: the latest start each stage can have
        i = max(i for i in range(j) if reach[s][i] and prefix[j] - prefix[i] + extras[s] <= target * (1 + 1e-12))
        split.append(j - i)
        j = i
    return tuple(reversed(split))


def max_stage_time(split: tuple[int, ...], extras: list[float], layer: float) -> float:
    return max(k * layer + e for k, e in zip(split, extras))


def brute_force_split(n_layers: int, extras: list[float], layer: float | list[float]) -> float:
    """Optimal max stage time by enumerating every composition (tests only; exponential). `layer`: one
    cost for every layer, or each layer's own."""
    n = len(extras)
    costs = layer if isinstance(layer, list) else [layer] * n_layers
    best = math.inf

    def rec(s: int, start: int, acc: float) -> None:
        nonlocal best
        left = n_layers - start
        if s == n - 1:
            if left >= 1:
                best = min(best, max(acc, sum(costs[start:]) + extras[s]))
            return
        for k in range(1, left - (n - 1 - s) + 1):
            rec(s + 1, start + k, max(acc, sum(costs[start:start + k]) + extras[s]))

    rec(0, 0, 0.0)
    return best
