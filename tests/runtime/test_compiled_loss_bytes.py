"""What a compiled loss moves, counted by Inductor's own scheduler (torch._inductor.metrics.num_bytes_accessed:
the bytes each fused kernel reads and writes), against what the estimate prices (timing.COMPILED_LOSS_BYTES):
the runtime's loss (train.loss_fn) and OLMo-core's, whose compiled loss adds a z-loss on the same
log-sum-exp. Eager, the same loss moves about 16 bytes a logit each way (the fp32 upcast, log-softmax and
their backward; timing.loss_times)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._inductor import metrics

from meshplan.cost_models.timing import COMPILED_LOSS_BYTES
from meshplan.runtime.train import loss_fn

TOKENS, VOCAB = (2, 256), 2048  # (batch, sequence), vocabulary: 1M bf16 logits


def olmo_core_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """OLMo-core's cross_entropy_loss with its z-loss (nn/functional/cross_entropy_loss.py at e27ba7455)."""
    flat = logits.flatten(0, 1).float()
    loss = F.cross_entropy(flat, targets.flatten(0, 1))
    return loss + 1e-5 * flat.logsumexp(-1).pow(2).mean()


def _bytes_per_logit(fn) -> tuple[float, float]:
    torch._dynamo.reset()
    batch, seq, vocab = TOKENS[0], TOKENS[1], VOCAB
    logits = torch.randn(batch, seq, vocab, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, vocab, (batch, seq))
    metrics.reset()
    torch._logging.set_logs(inductor_metrics=True)  # Inductor counts the bytes only with its metrics log on
    try:
        loss = torch.compile(fn)(logits, targets)
        forward = metrics.num_bytes_accessed
        loss.backward()
        backward = metrics.num_bytes_accessed - forward
    finally:
        torch._logging.set_logs()
        torch._dynamo.reset()
    n = logits.numel()
    return forward / n, backward / n


@pytest.mark.parametrize("fn", [loss_fn, olmo_core_loss], ids=["runtime", "olmo_core"])
def test_compiled_loss_moves_what_the_estimate_prices(fn):
    with torch._inductor.config.patch(force_disable_caches=True):  # a graph from the cache is not counted
        forward, backward = _bytes_per_logit(fn)
    assert forward == pytest.approx(COMPILED_LOSS_BYTES[0], rel=0.02)
    assert backward == pytest.approx(COMPILED_LOSS_BYTES[1], rel=0.02)
