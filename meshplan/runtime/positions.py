"""Where a rank's tokens sit in the sequence, and rotary embeddings by those positions (shared by the
attention modules and the MoE layer's balanced routing)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SeqLayout:
    """Which global token positions this rank's (local) sequence holds.

    Without context parallelism the local sequence is the whole sequence. With load-balanced
    causal CP the sequence is cut into 2*cp chunks and CP rank r holds chunks r and 2cp-1-r.
    """

    cp_rank: int = 0
    cp_size: int = 1

    def positions(self, local_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        if self.cp_size == 1:
            return torch.arange(local_len, device=device)
        chunk = local_len // 2
        first, second = self.cp_rank, 2 * self.cp_size - 1 - self.cp_rank
        return torch.cat([torch.arange(first * chunk, (first + 1) * chunk, device=device),
                          torch.arange(second * chunk, (second + 1) * chunk, device=device)])


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding on (batch, seq, heads, head_dim), rotating interleaved pairs like Llama."""
    head_dim = x.shape[-1]
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim))
    angles = positions.to(torch.float32)[:, None] * freqs[None, :]  # (seq, head_dim/2)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    out = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return out.flatten(-2).type_as(x)
