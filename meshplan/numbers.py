"""Numbers written for people: significant digits in plain notation, never 1.239e+04."""

from __future__ import annotations

import math


def significant(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits in plain notation with thousands separators
    (12.3, 0.0123, 1,234, 0.000674); integers at or above 10**digits are shown whole."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"
