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


def max_stage_time(split: tuple[int, ...], extras: list[float], layer: float) -> float:
    return max(k * layer + e for k, e in zip(split, extras))


def brute_force_split(n_layers: int, extras: list[float], layer: float) -> float:
    """Optimal max stage time by enumerating every composition (tests only; exponential)."""
    n = len(extras)
    best = math.inf

    def rec(s: int, left: int, acc: float) -> None:
        nonlocal best
        if s == n - 1:
            if left >= 1:
                best = min(best, max(acc, left * layer + extras[s]))
            return
        for k in range(1, left - (n - 1 - s) + 1):
            rec(s + 1, left - k, max(acc, k * layer + extras[s]))

    rec(0, n_layers, 0.0)
    return best
