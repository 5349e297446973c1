"""Training data: the same global batch at a step whatever the layout; each data-parallel rank
reads only its rows and each CP rank keeps only its sequence chunks.

synthetic: row i of step s is an arithmetic token sequence (random start and stride, from a
generator seeded by (seed, s, i)), so there is something to learn and loss falls.
file: a flat array of token ids (numpy.memmap, uint16 or uint32); row i of step s starts at token
((s * global_batch + i) * seq_len) mod (n_tokens - seq_len - 1): sequential, deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from meshplan.errors import InputError


@dataclass
class BatchSpec:
    global_batch: int
    seq_len: int
    vocab_size: int


class SyntheticData:
    def __init__(self, spec: BatchSpec, seed: int):
        self.spec, self.seed = spec, seed

    def rows(self, step: int, start: int, count: int) -> torch.Tensor:
        """Rows [start, start+count) of step `step`'s global batch: (count, seq_len + 1) int64."""
        out = []
        for i in range(start, start + count):
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 65_537 + i)
            first = torch.randint(0, self.spec.vocab_size, (1,), generator=gen)
            stride = torch.randint(1, 8, (1,), generator=gen)
            out.append((first + stride * torch.arange(self.spec.seq_len + 1)) % self.spec.vocab_size)
        return torch.stack(out)


class TokenFileData:
    def __init__(self, path: str, spec: BatchSpec, dtype: str):
        p = Path(path)
        if not p.is_file():
            raise InputError("--data", f"file not found: {p} (use 'synthetic' or a flat token file)")
        if dtype == "auto":
            dtype = "uint16" if spec.vocab_size <= 65536 else "uint32"
        if dtype not in ("uint16", "uint32"):
            raise InputError("--data-dtype", f"must be uint16, uint32 or auto, got {dtype!r}")
        self.tokens = np.memmap(p, dtype=np.dtype(dtype), mode="r")
        self.spec = spec
        if len(self.tokens) < spec.seq_len + 2:
            raise InputError("--data", f"{p} holds {len(self.tokens)} tokens; need more than seq_len + 1 = {spec.seq_len + 1}")

    def rows(self, step: int, start: int, count: int) -> torch.Tensor:
        s, span = self.spec.seq_len, len(self.tokens) - self.spec.seq_len - 1
        out = []
        for i in range(start, start + count):
            offset = ((step * self.spec.global_batch + i) * s) % span
            out.append(torch.from_numpy(np.asarray(self.tokens[offset:offset + s + 1], dtype=np.int64)))
        rows = torch.stack(out)
        if int(rows.max()) >= self.spec.vocab_size:  # an out-of-range id would crash the embedding lookup
            raise InputError("--data", f"holds token id {int(rows.max())} at step {step}; the model's vocab_size is "
                                       f"{self.spec.vocab_size} (wrong file or --data-dtype?)")
        return rows


def make_source(data: str, spec: BatchSpec, seed: int, dtype: str = "auto"):
    if data == "synthetic":
        return SyntheticData(spec, seed)
    return TokenFileData(data, spec, dtype)


def local_rows(source, step: int, dp_rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This data-parallel rank's (inputs, targets), each (global_batch/dp, seq_len)."""
    per_rank = source.spec.global_batch // dp
    rows = source.rows(step, dp_rank * per_rank, per_rank)
    return rows[:, :-1], rows[:, 1:]
