"""Tensor + sequence parallelism with DTensor's parallelize_module (Megatron layout).

Attention: wq/wk/wv column-parallel (heads split), wo row-parallel; SwiGLU/GELU MLP: w1/w3
column-parallel, w2 row-parallel. With sequence parallelism the norms and the residual stream are
sharded on the sequence dim; the embedding reduce-scatters into it and each block's attention /
feed-forward input is all-gathered by PrepareModuleInput. The output projection keeps logits
sharded on the vocab dim for loss_parallel (cross-entropy without gathering the logits).
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from meshplan.runtime.model import Transformer
from meshplan.runtime.moe import MoE


def tp_styles(float8: bool) -> tuple[type, type, type]:
    """(Colwise, Rowwise, PrepareModuleInput) classes; float8 linears need torchao's variants so
    the all-gathered activations are cast to float8 consistently."""
    if float8:
        from torchao.float8.float8_tensor_parallel import (Float8ColwiseParallel, Float8RowwiseParallel,
                                                           PrepareFloat8ModuleInput)

        return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    return ColwiseParallel, RowwiseParallel, PrepareModuleInput


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool, float8: bool,
             loss_parallel: bool) -> None:
    """Shard `model` (a whole model or one pipeline stage) over `tp_mesh` in place."""
    seq = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, object] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.pos_embeddings is not None:
        # Same output layout as tok_embeddings so the two sum shard-by-shard.
        top["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.norm is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1) if loss_parallel else Replicate(),
                                        use_local_output=not loss_parallel)
    if top:
        parallelize_module(model, tp_mesh, top)

    colwise, rowwise, prepare_input = tp_styles(float8)
    for block in model.layers.values():
        plan: dict[str, object] = {
            "attention": prepare_input(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "attention.wq": colwise(),
            "attention.wk": colwise(),
            "attention.wv": colwise(),
            "attention.wo": rowwise(output_layouts=seq),
        }
        if getattr(block.attention, "q_norm", None) is not None:
            # Qwen3's per-head norms over this rank's heads (dim 2): one weight, its gradient summed over TP.
            plan.update({"attention.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
                         "attention.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True)})
        if block.moe is not None:
            plan.update(moe_tp_plan(block.moe, tp_mesh, seq, colwise, rowwise, prepare_input))
        else:
            plan.update({"feed_forward": prepare_input(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
                         "feed_forward.w1": colwise(),
                         "feed_forward.w2": rowwise(output_layouts=seq)})
            if block.feed_forward.w3 is not None:
                plan["feed_forward.w3"] = colwise()
        if sequence_parallel:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)


def moe_tp_plan(moe: MoE, tp_mesh: DeviceMesh, seq, colwise, rowwise, prepare_input) -> dict[str, object]:
    """An MoE layer under TP + SP (specs/rules.moe_tp_reason), TorchTitan's expert-TP 1: each TP rank routes
    its own sequence chunk (the router's gate replicated, its gradient summed over TP as a norm's is) and
    sends those tokens to their experts over EP, which folds TP; the shared experts are TP-sharded like
    the dense MLP."""
    moe.share.sp_rank, moe.share.sp_size = tp_mesh.get_local_rank(), tp_mesh.size()
    plan: dict[str, object] = {"moe.router.gate": SequenceParallel(sequence_dim=1, use_local_output=True)}
    if moe.shared_experts is not None:
        plan.update({"moe.shared_experts": prepare_input(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
                     "moe.shared_experts.w1": colwise(),
                     "moe.shared_experts.w3": colwise(),
                     "moe.shared_experts.w2": rowwise(output_layouts=seq)})
    return plan


def enable_async_tp(tp_mesh: DeviceMesh) -> None:
    """Async TP, as TorchTitan runs it: inductor's micro-pipeline pass fuses each TP all-gather /
    reduce-scatter with its matmul (over symmetric memory) in the compiled blocks. CUDA/NCCL with
    compile only: check_runnable refuses it elsewhere (specs/rules.py)."""
    import warnings

    import torch._inductor.config as inductor_config

    inductor_config._micro_pipeline_tp = True
    try:  # needed up to ~2.10; deprecated (a no-op) later
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
    except ImportError:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        enable_symm_mem_for_group(tp_mesh.get_group().group_name)
