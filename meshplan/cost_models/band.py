"""An error band on an estimate, from the out-of-sample errors of the validated runs nearest to it, and an
extrapolation flag where the estimate's MFU passes the best published run of its device, precision and stack.

The validated rows' errors come from `meshplan validate --cross --save` (data/validation/oos_errors.json:
each published run predicted with the fitted constants refitted without its table). They are read once per
process; the band is for the few plans shown, not for every plan the planner searches.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from meshplan.cost_models.estimate import Estimate
from meshplan.profiles.registry import load_profile
from meshplan.specs.plan import Plan
from meshplan.specs.rules import MEGATRON_CORE

OOS_FILE = "oos_errors.json"
NEIGHBOURS = 3  # validated rows whose errors make the band
TERM_MARGIN = 0.02  # a term share this much smaller than the reference run's is named as making it faster


@lru_cache(maxsize=1)
def validated_rows() -> tuple[dict[str, Any], ...]:
    text = resources.files("meshplan.data.validation").joinpath(OOS_FILE).read_text()
    return tuple(json.loads(text)["rows"])


def device_class(device_name: str) -> str:
    """'NVIDIA H100 SXM 96GB HBM2e (500 W)' -> 'H100': one family whatever its memory or power."""
    for word in device_name.replace("-", " ").split():
        if any(ch.isdigit() for ch in word) and word[0].isalpha() and word.upper() == word:
            return word
    return device_name


def stack_family(stack: str, table: str = "") -> str:
    """The stack a run's MFU is compared within: Megatron's (a megatron-core plan; a published table of
    Megatron-LM, Megatron-Bridge or Megatron-Core, priced with its kernels) or PyTorch's (the others)."""
    return "megatron" if stack == MEGATRON_CORE or table.startswith("Megatron") else "pytorch"


def features(plan: Plan, table: str = "") -> dict[str, Any]:
    """What the band measures distance on and the extrapolation compares within; `table`: a published row's."""
    p = plan.parallel
    return {"device": device_class(load_profile(plan.cluster).device.name), "gpus": plan.gpus,
            "tp": p.tp, "pp": p.pp, "cp": p.cp, "fsdp": p.dp_shard, "ep": p.ep, "float8": bool(plan.memory.float8),
            "moe": plan.model.is_moe, "stack": stack_family(plan.stack, table)}


def distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How far apart two runs are: another device class counts 3, a dense model against an MoE one 2, a
    factor 8 in GPUs 1, each parallel dimension used by one and not the other 1, another precision 1."""
    d = 3.0 * (a["device"] != b["device"]) + 2.0 * (a["moe"] != b["moe"]) + abs(math.log2(a["gpus"] / b["gpus"])) / 3
    d += sum((a[k] > 1) != (b[k] > 1) for k in ("tp", "pp", "cp", "fsdp", "ep"))
    return d + (a["float8"] != b["float8"])


@dataclass
class Band:
    low_s: float
    high_s: float
    nearest: list[dict[str, Any]]  # label, source, distance, out-of-sample error
    extrapolated: bool
    extrapolation: str  # why, or against what

    def to_json(self) -> dict[str, Any]:
        return {"step_time_band_s": [self.low_s, self.high_s], "nearest_validated": self.nearest,
                "extrapolated": self.extrapolated, "extrapolation": self.extrapolation}


def band_of(plan: Plan, est: Estimate) -> Band:
    f = features(plan)
    rows = sorted(validated_rows(), key=lambda r: distance(f, r["features"]))[:NEIGHBOURS]
    errors = [r["oos_step_error"] for r in rows]
    # measured = predicted / (1 + error): the nearest rows' errors, applied to this prediction
    times = [est.step_time_s / (1 + e) for e in errors] + [est.step_time_s]
    nearest = [{"label": r["label"], "source": r["source"], "distance": round(distance(f, r["features"]), 3),
                "oos_step_error": r["oos_step_error"]} for r in rows]
    flag, why = extrapolation(f, est)
    return Band(min(times), max(times), nearest, flag, why)


def extrapolation(f: dict[str, Any], est: Estimate) -> tuple[bool, str]:
    """Above the best published MFU of this device class, precision and stack? Then which terms are smaller."""
    same = [r for r in validated_rows() if all(r["features"][k] == f[k] for k in ("device", "float8", "stack"))]
    if not same:
        return True, f"no published {f['stack']} run on {f['device']} ({'float8' if f['float8'] else 'bf16'}) to compare with"
    best = max(same, key=lambda r: r["published_mfu"])
    if est.mfu <= best["published_mfu"]:
        return False, f"MFU {est.mfu:.1%} <= {best['published_mfu']:.1%} published ({best['label']})"
    shares = {k: v / est.step_time_s for k, v in est.time_s.items()}
    faster = [f"{k} {shares.get(k, 0.0):.1%} vs {v:.1%}" for k, v in best["time_shares"].items()
              if shares.get(k, 0.0) < v - TERM_MARGIN]
    return True, (f"MFU {est.mfu:.1%} > {best['published_mfu']:.1%}, the best published ({best['label']}); "
                  f"smaller shares of the step than that run's estimate: {', '.join(faster) or 'none (faster compute)'}")
