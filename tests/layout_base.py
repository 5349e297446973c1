"""A dense Layout that cost-model tests start from: one micro-batch shape on 8 ranks of FSDP, edited per test."""

from __future__ import annotations

from meshplan.cost_models.layout import Layout
from meshplan.specs.registry import resolve_model


def fsdp8_layout(model: str = "llama3-8b", **kw) -> Layout:
    """`model` over 8 FSDP ranks, seq 4096, micro-batches of 2 (4 a step), bf16, full AC, eager: kw edits it."""
    spec = resolve_model(model)
    base = dict(spec=spec, gpus=8, seq_len=4096, global_batch=16, micro_batch=2, dtype="bf16", dp_replicate=1,
                dp_shard=8, tp=1, sp=False, async_tp=False, pp=1, schedule="1F1B", v=1,
                stage_layers=(spec.n_layers,), cp=1, ac="full", sac_ops=None, float8=False,
                reshard_after_forward=True, compile=False)
    base.update(kw)
    return Layout(**base)
