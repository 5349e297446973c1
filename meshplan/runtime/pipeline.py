"""Pipeline parallelism with torch.distributed.pipelining: stage split, stage-to-rank mapping and
the schedule named by the plan."""

from __future__ import annotations

from typing import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as S
from torch import nn

from meshplan.runtime.moe import routing_not_counted
from meshplan.specs.plan import SINGLE_STAGE_SCHEDULES, V_SHAPED_SCHEDULES
from meshplan.specs.rules import SPLIT_BACKWARD_SCHEDULES

SCHEDULES: dict[str, type] = {
    "GPipe": S.ScheduleGPipe,
    "1F1B": S.Schedule1F1B,
    "Interleaved1F1B": S.ScheduleInterleaved1F1B,
    "LoopedBFS": S.ScheduleLoopedBFS,
    "InterleavedZeroBubble": S.ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": S.ScheduleZBVZeroBubble,
    "DualPipeV": S.ScheduleDualPipeV,
}


def stage_ids(pp_rank: int, pp: int, virtual: int, schedule: str) -> list[int]:
    """Stages held by `pp_rank`. V-shaped schedules (ZBV, DualPipeV): rank r holds r and 2pp-1-r,
    so the first and last stage share rank 0. Others loop: r, r+pp, r+2pp, ..."""
    if schedule in V_SHAPED_SCHEDULES:
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + i * pp for i in range(virtual)]


def split_layers(n_layers: int, n_stages: int, pp_layers: list[int] | None) -> list[list[int]]:
    """Layer indices per stage: the plan's pp_layers if given, else as even as possible with the
    remainder on the first stages."""
    if pp_layers is None:
        base, extra = divmod(n_layers, n_stages)
        pp_layers = [base + (1 if s < extra else 0) for s in range(n_stages)]
    out, start = [], 0
    for count in pp_layers:
        out.append(list(range(start, start + count)))
        start += count
    return out


class Stage(PipelineStage):
    """A PipelineStage whose metadata inference (one forward PyTorch runs at the first step to learn the
    shapes a stage sends) is not training: MoE layers do not count its routing (runtime/moe.py). The
    private method is `_forward_metadata_inference` in torch 2.13 and `_shape_inference` before; both are
    covered, and test_moe_layouts.py checks the first step's counts by hand."""

    def _forward_metadata_inference(self, *args, **kwargs):
        with routing_not_counted(self.submod):
            return super()._forward_metadata_inference(*args, **kwargs)

    def _shape_inference(self, *args, **kwargs):
        with routing_not_counted(self.submod):
            return super()._shape_inference(*args, **kwargs)


def build_schedule(modules: list[nn.Module], ids: list[int], n_stages: int, pp_mesh: DeviceMesh,
                   device: torch.device, schedule: str, n_microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
    """PipelineStage per local module, and the schedule driving them. Gradients are scaled by
    1/n_microbatches inside the schedule (scale_grads), so loss_fn is the per-micro-batch mean."""
    if schedule in SPLIT_BACKWARD_SCHEDULES:
        keep_compiled_graphs()
    group = pp_mesh.get_group()
    stages = [Stage(m, stage_index=i, num_stages=n_stages, device=device, group=group)
              for m, i in zip(modules, ids)]
    cls = SCHEDULES[schedule]
    if schedule in SINGLE_STAGE_SCHEDULES:
        return cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)
    return cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn, scale_grads=True)


def keep_compiled_graphs() -> None:
    """Let torch.compile'd blocks run a split backward. The input-gradient pass keeps the graph for
    the weight-gradient pass (retain_graph=True), which AOTAutograd's donated buffers forbid
    ("compiled with non-empty donated buffers which requires ... retain_graph=False"). Turned off
    process-wide (read when a block is first compiled, after this): the compiled backward then
    allocates what it would have written into saved buffers it may no longer free."""
    import torch._functorch.config

    torch._functorch.config.donated_buffer = False
