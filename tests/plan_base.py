"""The complete single-process plan mapping that runtime and scale tests start from."""

from __future__ import annotations

import copy
from typing import Any


def base_plan(model: str, cluster: str) -> dict[str, Any]:
    """fp32, seq 32, global batch 8 in micro-batches of 2, no parallelism: layouts are edits of this."""
    return copy.deepcopy({
        "model": model, "cluster": cluster, "gpus": 1,
        "training": {"seq_len": 32, "global_batch": 8, "micro_batch": 2, "dtype": "fp32"},
        "parallel": {"dp_replicate": 1, "dp_shard": 1, "tp": 1, "sequence_parallel": False, "async_tp": False,
                     "pp": 1, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "pp_layers": None, "cp": 1},
        "memory": {"activation_checkpointing": "none", "sac_ops": None, "float8": False,
                   "reshard_after_forward": True},
        "compile": False,
    })
