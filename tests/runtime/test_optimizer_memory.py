"""AdamW's step holds what memory.optimizer_step_memory prices: the runtime's optimizer (foreach, as
TorchTitan's) allocates one fp32 temporary per parameter on top of the weights, gradients and moments,
measured as the rise of live tensor storage during a step of a tiny model on this CPU."""

from __future__ import annotations

import torch

from meshplan.cost_models.memory import OPTIMIZER_STEP_TEMP_BYTES, STATE_BYTES
from meshplan.runtime.metrics import LiveTensorMemory
from meshplan.runtime.model import Transformer
from meshplan.runtime.options import RunOptions
from meshplan.runtime.train import build_optimizers
from meshplan.specs.registry import resolve_model


def test_adamw_step_holds_one_fp32_temporary_per_parameter():
    torch.manual_seed(0)
    model = Transformer(resolve_model("tiny-4l"))
    (opt,), _ = build_optimizers([model], RunOptions(steps=2))
    n = sum(p.numel() for p in model.parameters())
    rises = []
    for _ in range(2):  # the first step creates the moments; the second is every later step
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        with LiveTensorMemory(torch.device("cpu")) as mem:
            before = mem.current()
            opt.step()
        rises.append(float(mem.peak - before) / n)
    # By hand: sqrt(v) in fp32, 4 bytes per parameter (the first step also creates m and v, 8 bytes).
    assert OPTIMIZER_STEP_TEMP_BYTES == 4.0 and STATE_BYTES["optimizer"] == 8.0
    assert abs(rises[1] - OPTIMIZER_STEP_TEMP_BYTES) <= 0.01, rises
    assert abs(rises[0] - (OPTIMIZER_STEP_TEMP_BYTES + STATE_BYTES["optimizer"])) <= 0.01, rises
