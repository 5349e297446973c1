"""float8 training via torchao: nn.Linear -> Float8Linear (dynamic tensorwise scaling).

On CPU there are no float8 matmul kernels, so `emulate=True` casts to float8 and back and
multiplies in high precision: the numerics of float8 training, not its speed. The output
projection stays in high precision (as torchtitan does: the logits are precision-sensitive).

Under FSDP the weights are all-gathered in float8 (1 byte per element, as the estimate prices
them), with their scales computed for all weights at once after each optimizer step
(`precompute_scales`), as TorchTitan does.
"""

from __future__ import annotations

from torch import nn

SKIP = ("output",)


def apply_float8(model: nn.Module, emulate: bool, fsdp_float8_all_gather: bool = False) -> None:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(emulate=emulate, enable_fsdp_float8_all_gather=fsdp_float8_all_gather)

    def keep(module: nn.Module, fqn: str) -> bool:
        if fqn in SKIP or not isinstance(module, nn.Linear):
            return False
        # float8 matmuls need both dims divisible by 16
        return module.in_features % 16 == 0 and module.out_features % 16 == 0

    convert_to_float8_training(model, config=config, module_filter_fn=keep)


def uses_fsdp_float8_all_gather(model: nn.Module) -> bool:
    """Whether any Float8Linear of `model` all-gathers its FSDP-sharded weight in float8."""
    return any(getattr(getattr(m, "config", None), "enable_fsdp_float8_all_gather", False) for m in model.modules())


def precompute_scales(parts: list[nn.Module]) -> None:
    """Amax and scale of every float8-gathered weight in one pass (one all-reduce), after the
    optimizer changed them, instead of one per weight inside the next all-gather."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for part in parts:
        if uses_fsdp_float8_all_gather(part):
            precompute_float8_dynamic_scale_for_fsdp(part)


def register_precompute(optimizers: list, parts: list[nn.Module]) -> None:
    """Run precompute_scales after every optimizer step (nothing when no weight is float8-gathered)."""
    if not any(uses_fsdp_float8_all_gather(p) for p in parts) or not optimizers:
        return
    optimizers[-1].register_step_post_hook(lambda *_: precompute_scales(parts))
