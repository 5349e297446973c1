"""Activation checkpointing per transformer block: none | full | selective.

full: a block keeps only its input; everything inside is recomputed in backward.
selective: torch.utils.checkpoint with a selective policy: the outputs of the compute ops (matmuls,
attention) of the op kinds listed in `memory.sac_ops` are saved, everything else (norms,
activation functions, RoPE, the other matmuls) is recomputed.

How the policy knows a matmul's op kind: it counts the linears' matmuls it is shown, in its own
context (one count for the forward, one for the recomputation, fresh for every checkpointed call),
and reads the kind from the block's `matmul_kinds()`, the order its forward runs them in. Attention
kernels are their own kind. Nothing outside the policy changes state inside the checkpointed
forward, so torch.compile traces the block into one graph (Dynamo refuses side effects inside its
checkpoint operator: an earlier tag set by the model's forward made every compiled block run eager).
This is how TorchTitan's op-level SAC tells every other matmul apart.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from meshplan.runtime.model import Transformer
from meshplan.specs.plan import DEFAULT_SAC_OPS


_aten = torch.ops.aten
# A linear's matmul (with or without bias; float8 linears reach the policy as aten.mm on their
# float8 tensors), and the routed experts' grouped GEMMs (runtime/moe.py).
LINEAR_OPS = {_aten.mm.default, _aten.addmm.default, _aten._scaled_mm.default, _aten._grouped_mm.default}
# The attention kernels SDPA may dispatch to (flash/efficient/cudnn/math, CPU and CUDA), and the
# batched matmuls of attention written out (SDPA's math path, context parallelism's gather path).
ATTENTION_OPS = {
    _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_attention_math.default,
}


def op_kind(op, matmul_index: int, kinds: tuple[str, ...]) -> str | None:
    """The op kind of `op`, the matmul_index-th linear matmul of the block when it is one; None
    for ops that are no compute op (always recomputed)."""
    if op in ATTENTION_OPS:
        return "attention"
    if op in LINEAR_OPS:
        if matmul_index >= len(kinds):
            raise RuntimeError(f"selective AC saw more linear matmuls than the block's {len(kinds)} "
                               f"({', '.join(kinds)}): matmul_kinds() no longer matches its forward")
        return kinds[matmul_index]
    return None


def sac_context_fn(kinds: tuple[str, ...], saved: frozenset[str]) -> Callable[[], tuple]:
    """checkpoint's context_fn for one block: a selective policy saving the compute-op outputs of
    the `saved` op kinds, its matmul counts living in the contexts it returns."""

    def context_fn():
        counts = {False: 0, True: 0}  # linear matmuls seen, by ctx.is_recompute

        def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
            index = counts[ctx.is_recompute]
            kind = op_kind(op, index, kinds)
            if op in LINEAR_OPS:
                counts[ctx.is_recompute] = index + 1
            return CheckpointPolicy.MUST_SAVE if kind in saved else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


# TorchTitan's op-level policy saves these ops' outputs (its _save_list: mm, SDPA's flash and efficient
# kernels, the reduce-scatter, and max for float8's amax), every second mm excepted.
TORCHTITAN_SAVED_OPS = {_aten.mm.default, _aten._scaled_dot_product_efficient_attention.default,
                        _aten._scaled_dot_product_flash_attention.default,
                        torch.ops._c10d_functional.reduce_scatter_tensor.default, _aten.max.default}


def torchtitan_op_context_fn() -> tuple:
    """checkpoint's context_fn for TorchTitan's op-level SAC (torchtitan/models/llama3/infra/parallelize.py,
    _custom_policy at 6fc499f6f; the same list since 2024): save the outputs of TORCHTITAN_SAVED_OPS
    except every second mm (the 2nd, 4th, ... of the forward, counted apart in the recomputation), recompute
    the rest. The runtime does not train with it: it lets tests and benchmarks/saved_tensors.py measure
    what a block keeps under the torchtitan stack's policy, which the cost model prices
    (activations.TORCHTITAN_OP_SAC). The attention kernels of this runtime's CPU path stand in for SDPA's
    flash kernel there."""
    counts = {False: 0, True: 0}  # mm calls seen, by ctx.is_recompute
    saved = TORCHTITAN_SAVED_OPS | ATTENTION_OPS

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op == _aten.mm.default:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def let_sac_pass_profiler_ranges() -> None:
    """Under expert parallelism the routed experts are an FSDP2 unit of their own inside the checkpointed
    block; its hooks open profiler ranges (record_function ops) a different number of times in the
    recomputation than in the forward, which selective checkpointing's op cache takes for a changed
    region. The ranges compute nothing: they join the ops SAC passes through (as it does detach)."""
    from torch.utils import checkpoint

    checkpoint.SAC_IGNORED_OPS.update({torch.ops.profiler._record_function_enter_new.default,
                                       torch.ops.profiler._record_function_exit._RecordFunction})


def apply_ac(model: Transformer, mode: str, sac_ops: list[str] | None) -> None:
    """Wrap each block of `model` in place (the wrapper adds `_checkpoint_wrapped_module` to FQNs;
    initialisation.canonical_fqn and DCP's state-dict helpers strip it)."""
    if mode == "none":
        return
    if mode not in ("full", "selective"):
        raise ValueError(f"unknown activation checkpointing mode {mode!r}")
    if mode == "selective" and any(getattr(b, "moe", None) is not None for b in model.layers.values()):
        let_sac_pass_profiler_ranges()
    saved = frozenset(DEFAULT_SAC_OPS if sac_ops is None else sac_ops)
    for key in list(model.layers.keys()):
        block = model.layers[key]
        wrap = partial(checkpoint_wrapper, preserve_rng_state=False)
        if mode == "selective":
            wrap = partial(wrap, context_fn=sac_context_fn(block.matmul_kinds(), saved))
        model.layers[key] = wrap(block)


def block_module(module: nn.Module) -> nn.Module:
    """The block inside an AC wrapper (or the module itself)."""
    return getattr(module, "_checkpoint_wrapped_module", module)
