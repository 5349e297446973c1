"""Model FLOPs utilisation: the one definition the estimate, the planner's table, the runtime's
per-step line and the reports share.

MFU = model FLOPs per token (flops.model_flops_per_token: 3 x forward matmuls + attention, no
recompute) x tokens/s per device / the device's dense bf16 peak (fp32 on a profile without one).
Float8 plans are also given MFU against the fp8 peak, where the profile has one.
"""

from __future__ import annotations

from meshplan.cost_models.flops import model_flops_per_token
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.model import ModelSpec


def mfu_peak_name(profile: ClusterProfile) -> str:
    """The peak MFU is measured against: dense bf16, or fp32 on a profile without bf16 (a CPU)."""
    return "bf16" if "bf16" in profile.device.peak_tflops else "fp32"


def mfu(spec: ModelSpec, seq_len: int, tokens_per_s_per_device: float, profile: ClusterProfile,
        peak_name: str | None = None) -> float:
    """MFU against `peak_name` (default mfu_peak_name(profile))."""
    peak = profile.device.peak_tflops[peak_name or mfu_peak_name(profile)] * 1e12
    return model_flops_per_token(spec, seq_len) * tokens_per_s_per_device / peak
