"""CPython's cyclic garbage collector held back while the search runs.

The search allocates millions of short-lived tuples and layouts and keeps growing memo caches
(bounds, memory, schedule simulations), yet makes almost no reference cycles: reference counting
frees nearly everything. With the default thresholds (a young collection every 700 net allocations,
older ones every 10 of those) the collector ran about 750 times in the 405B@16384 search, each older
pass re-walking the caches, and took 0.32 s of its 3.5 s on one process (timed with gc.callbacks
around a --jobs 1 search). Freezing what exists (modules, the space, the profile) and
collecting young objects every 50,000 allocations leaves the collector at about 2 % of the search.
The same freeze before forking workers keeps the parent's objects out of their collections.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

SEARCH_THRESHOLDS = (50_000, 20, 100)  # young, middle, old: collections of each before the next


@contextmanager
def collections_held_back() -> Iterator[None]:
    """Freeze the objects that exist now and collect rarely until the block ends; restored after."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*SEARCH_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
