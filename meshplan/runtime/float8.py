"""float8 training via torchao: nn.Linear -> Float8Linear (dynamic tensorwise scaling).

On CPU there are no float8 matmul kernels, so `emulate=True` casts to float8 and back and
multiplies in high precision: the numerics of float8 training, not its speed. The output
projection stays in high precision (as torchtitan does: the logits are precision-sensitive).
"""

from __future__ import annotations

from torch import nn

SKIP = ("output",)


def apply_float8(model: nn.Module, emulate: bool) -> None:
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(emulate=emulate)

    def keep(module: nn.Module, fqn: str) -> bool:
        if fqn in SKIP or not isinstance(module, nn.Linear):
            return False
        # float8 matmuls need both dims divisible by 16
        return module.in_features % 16 == 0 and module.out_features % 16 == 0

    convert_to_float8_training(model, config=config, module_filter_fn=keep)
