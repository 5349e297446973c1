"""Catch tensors that meshplan's runtime creates off the model's device (test helper).

A TorchFunctionMode, not a TorchDispatchMode: by the time a factory reaches the dispatcher the
default device has been filled in (`torch.zeros(())` arrives as aten.zeros with device=cpu), so
on a CPU-only machine a dispatch mode cannot tell "made on the CPU on purpose" from "forgot the
device", which is the bug that crashed every CUDA run at its first step. At the Python API the
call still shows whether `device=` was given. Only calls made directly from a file under
meshplan/runtime/ (but data.py, the host-side batch) count: PyTorch itself makes CPU tensors on purpose (AdamW's step counters,
scalar wrapping) and those are not ours to judge.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

# Factories whose result lives on the CPU (or the default device) unless `device=` is given.
# The *_like functions and Tensor.new_* take their input's device and are fine.
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.tensor, torch.scalar_tensor,
             torch.rand, torch.randn, torch.randint, torch.randperm, torch.linspace, torch.logspace, torch.eye,
             torch.empty_strided, torch.as_tensor}
RUNTIME_DIR = os.path.join("meshplan", "runtime") + os.sep
# The host side of the step: data.py builds the batch on the CPU on purpose (a CPU generator makes
# it identical under every layout) and Trainer.step moves it to the device with .to(device).
HOST_SIDE = (os.path.join("meshplan", "runtime", "data.py"),)
THIS_FILE = os.path.abspath(__file__)
PASS_THROUGH = (os.path.join("torch", "overrides.py"), os.path.join("torch", "utils", "_device.py"))


@dataclass
class Violation:
    factory: str
    where: str  # file:line of the meshplan call
    device: str | None  # the device it asked for (None: not said)


class DeviceHygiene(TorchFunctionMode):
    """Records factory calls from meshplan/runtime that name no device or another device."""

    def __init__(self, device: torch.device | str):
        super().__init__()
        self.device = torch.device(device)
        self.violations: list[Violation] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and not (func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)):
            asked = kwargs.get("device")
            if asked is None or not self._same(torch.device(asked)):
                caller = _caller()
                name = caller.f_code.co_filename if caller is not None else ""
                if RUNTIME_DIR in name and not name.endswith(HOST_SIDE):
                    where = f"{caller.f_code.co_filename}:{caller.f_lineno}"
                    self.violations.append(Violation(func.__name__, where, None if asked is None else str(asked)))
        return func(*args, **kwargs)

    def _same(self, asked: torch.device) -> bool:
        if asked.type != self.device.type:
            return False
        return asked.index is None or self.device.index is None or asked.index == self.device.index


def _caller():
    """The Python frame that called the torch function (past this mode and torch's own relays)."""
    frame = sys._getframe(2)
    while frame is not None and (os.path.abspath(frame.f_code.co_filename) == THIS_FILE
                                 or frame.f_code.co_filename.endswith(PASS_THROUGH)):
        frame = frame.f_back
    return frame
