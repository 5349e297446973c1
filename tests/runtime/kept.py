"""Bytes a module's forward leaves alive for backward, on this CPU (what activation checkpointing changes)."""

from __future__ import annotations

import torch

from meshplan.runtime.metrics import LiveTensorMemory


def kept_after_forward(block: torch.nn.Module, batch: int, seq: int, dim: int,
                       dtype: torch.dtype = torch.float32) -> int:
    """Live tensor bytes after `block`'s forward that were not alive before it (its output included:
    the same for every AC mode)."""
    torch.manual_seed(0)
    x = torch.randn(batch, seq, dim, dtype=dtype, requires_grad=True)
    mem = LiveTensorMemory(torch.device("cpu"))
    with mem:
        before = mem.current()
        y = block(x)
        kept = mem.current() - before
    del y
    return kept
