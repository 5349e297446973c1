"""Software versions a profile was measured with, and a torch-free check against what is installed.

The planner calls `check_profile_versions`, so this module reads versions through importlib.metadata
only: it never imports torch.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

# pip distributions that carry the CUDA runtime and NCCL next to a CUDA build of torch (cu11/cu12/cu13).
_CUDA_DISTS = ("nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11")
_NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_versions() -> dict[str, str | None]:
    """torch, CUDA runtime and NCCL package versions as pip sees them (None when not installed)."""
    return {
        "torch": _dist_version("torch"),
        "cuda_runtime_package": _dist_version(*_CUDA_DISTS),
        "nccl_package": _dist_version(*_NCCL_DISTS),
    }


def _major_minor(version: str | None) -> str | None:
    return None if version is None else ".".join(str(version).split("+")[0].split(".")[:2])


def check_profile_versions(profile: Any) -> list[str]:
    """Warnings when `profile` (a ClusterProfile) was measured with other torch / CUDA / NCCL versions."""
    measured = (getattr(profile, "provenance", None) or {}).get("versions")
    if not isinstance(measured, dict):
        return []  # datasheet / published profiles carry no software versions
    here = installed_versions()
    name = getattr(profile, "name", "profile")
    warnings = []
    checks = (
        ("torch", "torch", lambda v: v),
        ("cuda_runtime_package", "CUDA runtime", _major_minor),
        ("nccl_package", "NCCL", lambda v: v),
    )
    for key, label, norm in checks:
        then, now = measured.get(key), here.get(key)
        if then is None and now is None:
            continue
        if norm(then) != norm(now):
            warnings.append(f"cluster profile {name!r} was measured with {label} {then or 'absent'}, "
                            f"installed is {now or 'absent'}: re-run `meshplan profile-cluster` if numbers look off")
    return warnings
