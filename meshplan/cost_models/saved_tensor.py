"""One tensor a block keeps for its backward: its size per token, its dtype and how TP shards it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActivationTensor:
    name: str
    sac_kind: str  # the SAC op kind whose output this is (see specs.plan.SAC_OPS), or "other"
    elements_per_token: float
    shard: str
    bytes_per_element: float | None = None  # None: the activation dtype
    no_ac_saved: bool = True  # kept when there is no checkpointing at all
