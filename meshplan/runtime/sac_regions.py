"""Op-kind tags for selective activation checkpointing.

The model marks where each op kind of SAC_OPS runs (`with sac_region("qkv"): ...`); the SAC policy
reads the current tag. The tag is a plain module-level value set by forward code, so the original
forward and its recomputation see the same tags in the same order: tagging is deterministic and
does not depend on how linears decompose into aten ops (mm / addmm / float8 / DTensor).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

_current: list[str | None] = [None]


@contextmanager
def sac_region(kind: str) -> Iterator[None]:
    previous = _current[0]
    _current[0] = kind
    try:
        yield
    finally:
        _current[0] = previous


def current_region() -> str | None:
    return _current[0]
