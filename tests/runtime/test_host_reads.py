"""A training step reads the device from the host once: the log line's loss and gradient norm,
together. Gradient clipping scales on the device (it used to call .item() between backward and the
optimizer step, which on a GPU stalls the host until backward finished).

Counted with a TorchFunctionMode over Trainer.step: every Tensor.item / tolist / __float__ /
__int__ / __bool__ / cpu() call, on 1 process, and on FSDP 2 and TP 2 (PyTorch's fake process group:
collectives are no-ops, the code path is the run's). AdamW's per-parameter step counts are exempt: they
are CPU tensors in a GPU run too (torch.optim keeps them there unless capturable), so reading them
waits for nothing."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from meshplan.runtime.options import RunOptions
from meshplan.runtime.train import Trainer
from meshplan.specs.plan import plan_from_dict
from plan_base import base_plan

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__bool__,
         torch.Tensor.cpu, torch.Tensor.numpy}


class HostReads(TorchFunctionMode):
    def __init__(self, exempt: set[int]):
        super().__init__()
        self.exempt = exempt
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS and id(args[0]) not in self.exempt:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("degrees", [{}, {"dp_shard": 2}, {"tp": 2}])
def test_a_step_reads_the_device_once(degrees):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    raw = base_plan("tiny", "cpu-gloo")
    raw["parallel"].update(degrees)
    raw["gpus"] = 2 if degrees else 1
    plan = plan_from_dict(raw)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.gpus)
    try:
        trainer = Trainer(plan, RunOptions(steps=2, quiet=True), torch.device("cpu"))
        trainer.step(0)  # first-step lazy state aside
        steps = {id(st["step"]) for opt in trainer.optimizers for st in opt.state.values()}
        assert steps and all(st["step"].device.type == "cpu" for opt in trainer.optimizers for st in opt.state.values())
        with HostReads(steps) as mode:
            result = trainer.step(1)
            loss, norm = result.loss, result.grad_norm
    finally:
        dist.destroy_process_group()
    assert mode.calls == ["tolist"], mode.calls
    assert isinstance(loss, float) and isinstance(norm, float)
