"""No tensor in a training step is made off the model's device.

The step once built its loss accumulator with `torch.zeros(())` (no device) and added a CUDA loss
to it, which crashed every plan without PP at its first step on a GPU. On a CPU-only machine that
code runs fine, so the test does not wait for a crash: device_hygiene.DeviceHygiene flags every
factory call made from meshplan/runtime during the step that names no device or another one.
The multi-rank layouts (TP, FSDP, PP, CP) are checked the same way in test_layouts.py's bf16 runs.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from cases import in_bf16, plan
from device_hygiene import DeviceHygiene
from meshplan.runtime.options import RunOptions
from meshplan.runtime.train import Trainer
from meshplan.specs.plan import plan_from_dict

CPU = torch.device("cpu")


def _runtime_code(source: str) -> dict:
    """Compile `source` as if it were a file in meshplan/runtime/ (the detector goes by file)."""
    namespace: dict = {}
    exec(compile(source, "/somewhere/meshplan/runtime/fake_step.py", "exec"), namespace)
    return namespace


def test_detector_flags_runtime_factories_without_the_device():
    ns = _runtime_code(
        "import torch\n"
        "def step():\n"
        "    torch.zeros(())\n"                       # line 3: no device
        "    torch.zeros((), device='cpu')\n"         # fine
        "    torch.tensor([1.0])\n"                   # line 5: no device
        "    torch.arange(3, device='meta')\n"        # line 6: another device
        "    torch.as_tensor(torch.ones(1, device='cpu'))\n"  # fine: keeps its input's device
    )
    with DeviceHygiene(CPU) as mode:
        ns["step"]()
        torch.zeros(())  # made here, not by meshplan's runtime: not its business
    got = [(v.factory, v.where.rsplit(":", 1)[1], v.device) for v in mode.violations]
    assert got == [("zeros", "3", None), ("tensor", "5", None), ("arange", "6", "meta")]


@pytest.fixture
def one_rank_world(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_step_makes_no_tensor_off_the_model_device(one_rank_world, dtype):
    """Two steps (the first builds the optimizer state) of a plan without PP: the path that had
    the CPU accumulator. bf16 adds FSDP2's mixed precision on the one-rank mesh."""
    case = plan()
    trainer = Trainer(plan_from_dict(in_bf16(case) if dtype == "bf16" else case), RunOptions(steps=2, quiet=True), CPU)
    with DeviceHygiene(CPU) as mode:
        for step in range(2):
            trainer.step(step)
    assert [f"{v.factory} at {v.where} (device {v.device})" for v in mode.violations] == []
