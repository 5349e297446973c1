"""Activation checkpointing per transformer block: none | full | selective.

full: a block keeps only its input; everything inside is recomputed in backward.
selective: torch.utils.checkpoint with a selective policy: the outputs of the compute ops (matmuls,
attention) inside the op kinds listed in `memory.sac_ops` are saved, everything else (norms,
activations functions, RoPE, the other matmuls) is recomputed. Op kinds are tagged by the model
(`sac_region`), see sac_regions.py.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from meshplan.runtime.model import Transformer
from meshplan.runtime.sac_regions import current_region
from meshplan.specs.plan import DEFAULT_SAC_OPS


_aten = torch.ops.aten
# The ops whose outputs are "the activation of an op kind": matmuls (with or without bias), and
# the attention kernels SDPA may dispatch to (flash/efficient/math, CPU and CUDA).
COMPUTE_OPS = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten._scaled_mm.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_attention_math.default,
}


def sac_policy(saved: frozenset[str]):
    """A selective-checkpoint policy saving compute-op outputs inside the `saved` op kinds."""

    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        if op in COMPUTE_OPS and current_region() in saved:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def apply_ac(model: Transformer, mode: str, sac_ops: list[str] | None) -> None:
    """Wrap each block of `model` in place (the wrapper adds `_checkpoint_wrapped_module` to FQNs;
    model.canonical_fqn and DCP's state-dict helpers strip it)."""
    if mode == "none":
        return
    if mode == "full":
        wrap = partial(checkpoint_wrapper, preserve_rng_state=False)
    elif mode == "selective":
        saved = frozenset(DEFAULT_SAC_OPS if sac_ops is None else sac_ops)
        wrap = partial(checkpoint_wrapper, preserve_rng_state=False,
                       context_fn=partial(create_selective_checkpoint_contexts, sac_policy(saved)))
    else:
        raise ValueError(f"unknown activation checkpointing mode {mode!r}")
    for key in list(model.layers.keys()):
        model.layers[key] = wrap(model.layers[key])


def block_module(module: nn.Module) -> nn.Module:
    """The block inside an AC wrapper (or the module itself)."""
    return getattr(module, "_checkpoint_wrapped_module", module)
