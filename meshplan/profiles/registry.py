"""Find a cluster profile by built-in name or path."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from meshplan.errors import InputError
from meshplan.profiles.schema import ClusterProfile, profile_from_dict
from meshplan.yamlio import load_yaml_file

BUILTIN_DIR = Path(__file__).parent / "builtin"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml"))


def list_profiles() -> list[ClusterProfile]:
    return [load_profile(n) for n in builtin_names()]


@lru_cache(maxsize=64)
def _load_path(path: str) -> ClusterProfile:
    return profile_from_dict(load_yaml_file(path, "cluster"), "cluster")


def load_profile(name_or_path: str) -> ClusterProfile:
    if not isinstance(name_or_path, str) or not name_or_path:
        raise InputError("cluster", f"must be a profile name or path, got {name_or_path!r}")
    builtin = BUILTIN_DIR / f"{name_or_path}.yaml"
    if builtin.is_file():
        return _load_path(str(builtin))
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        return _load_path(str(path.resolve()))
    raise InputError("cluster", f"unknown cluster {name_or_path!r}; valid: {', '.join(builtin_names())} (or a path to a profile YAML)")


# Device-name keys to the built-in profile of that part (the first key found in the name wins).
BUILTIN_BY_DEVICE = (("H200", "h200-141g-dgx"), ("H100", "h100-80g-dgx"), ("GB200", "gb200-186g-nvl72"),
                     ("B200", "b200-180g-dgx"),
                     ("A100", "a100-80g-dgx"))


# A GPU of a part no built-in profile has takes the H100's: the part most published runs were fitted on.
OTHER_GPU_BUILTIN = "h100-80g-dgx"


def nearest_builtin(device_name: str, gpu: bool = False) -> str:
    """The built-in profile of the same part as `device_name`; for another part, the H100's if it is a GPU
    (`gpu`), cpu-gloo if not."""
    fallback = OTHER_GPU_BUILTIN if gpu else "cpu-gloo"
    return next((name for key, name in BUILTIN_BY_DEVICE if key in device_name), fallback)
