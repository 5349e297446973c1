"""Hard constraints of the space, each with the one-line reason the search summary counts."""

from __future__ import annotations

from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import SINGLE_STAGE_SCHEDULES, V_SHAPED_SCHEDULES
from meshplan.specs.rules import COMPILE_UNTRACEABLE, FLOAT8_UNCOMPILED, MICROBATCHES, SAC_SPLIT_BACKWARD

TP_NODE = "tp > devices per node"
TP_DIVIDES = "tp does not divide heads / kv heads / ffn"
CP_SEQ = "2*cp does not divide seq_len"
SP_SEQ = "sequence parallel: tp does not divide seq_len/cp"
PP_LAYERS = "pp*virtual stages > n_layers"
BATCH = "batch mismatch: global_batch % (dp*micro_batch) != 0"
SCHEDULE_V = "virtual stages invalid for schedule"
SPLIT = "pp_layers does not match pp*virtual stages / n_layers"
NO_FIT = "does not fit in memory"
SIM_FAILED = "pipeline simulator failed"
# The runtime's rules (specs/rules.py) are counted like the planner's own.
REASONS = (TP_NODE, TP_DIVIDES, CP_SEQ, SP_SEQ, PP_LAYERS, SCHEDULE_V, SPLIT, BATCH, MICROBATCHES, SAC_SPLIT_BACKWARD,
           COMPILE_UNTRACEABLE, FLOAT8_UNCOMPILED, NO_FIT)


def mesh_reason(spec: ModelSpec, prof: ClusterProfile, seq_len: int, tp: int, cp: int) -> str | None:
    """Why TP/CP degrees are impossible for this model and sequence, or None."""
    if tp > prof.devices_per_node:
        return TP_NODE
    if spec.n_heads % tp or spec.n_kv_heads % tp or spec.ffn_dim % tp:
        return TP_DIVIDES
    if cp > 1 and seq_len % (2 * cp):
        return CP_SEQ
    return None


def sp_reason(seq_len: int, tp: int, cp: int, sp: bool) -> str | None:
    if sp and tp > 1 and (seq_len // cp) % tp:
        return SP_SEQ
    return None


def batch_reason(global_batch: int, dp: int, micro_batch: int) -> str | None:
    return BATCH if global_batch % (dp * micro_batch) else None


def schedule_reason(n_layers: int, pp: int, schedule: str, v: int, pp_layers: list[int] | None) -> str | None:
    if pp == 1:
        return None
    if schedule in SINGLE_STAGE_SCHEDULES and v != 1:
        return SCHEDULE_V
    if schedule in V_SHAPED_SCHEDULES and v != 2:
        return SCHEDULE_V
    if pp_layers is not None:
        if len(pp_layers) != pp * v or sum(pp_layers) != n_layers:
            return SPLIT
    elif pp * v > n_layers:
        return PP_LAYERS
    return None
