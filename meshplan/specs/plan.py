"""The plan file (best.yaml): dataclasses, validation with one-line errors, and round-trip to YAML."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from meshplan.errors import InputError
from meshplan.fields import (AUTO, as_bool, as_choice, as_int, as_str, reject_unknown,
                             require_mapping)
from meshplan.specs.model import ModelSpec
from meshplan.specs.registry import resolve_model
from meshplan.specs.rules import (CROSS_ENTROPY_FUSIONS, EP_DISPATCHERS, GRAD_REDUCE_DTYPES, MESHPLAN, OFFLOAD_MODULES,
                                  OPTIMIZER_DTYPES, RECOMPUTE_MODULES, STACKS, check_runtime_rules,
                                  cross_entropy_fusion_reason, ep_dispatch_reason, ep_overlap_reason, ep_reason,
                                  grad_reduce_dtype_reason, mtp_reason, offload_modules_reason, precision_aware_reason,
                                  recompute_modules_reason, shared_expert_overlap_reason)
from meshplan.yamlio import atomic_write_yaml, load_yaml_file

PP_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                "ZBVZeroBubble", "DualPipeV")
SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")
# The schedule a plan without pipelining names (the planner writes it; with pp 1 nothing runs one).
DEFAULT_PP_SCHEDULE = "1F1B"
V_SHAPED_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
AC_MODES = ("none", "selective", "full")
# Activation kinds that selective AC may save: a block's compute ops by kind (runtime/activation_checkpoint.py).
SAC_OPS = ("qkv", "attention", "attn_out", "ffn_in", "ffn_out")
# What selective AC saves when a plan says `sac_ops: null` (runtime and cost model alike): the
# attention output (quadratic work per byte) and the matmuls feeding attention and the MLP
# nonlinearity; the two row-parallel outputs (attn_out, ffn_out) are recomputed.
DEFAULT_SAC_OPS = ("qkv", "attention", "ffn_in")
DTYPES = ("bf16", "fp32")
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass
class TrainingSpec:
    seq_len: Any = 8192
    global_batch: Any = AUTO
    micro_batch: Any = AUTO
    dtype: Any = "bf16"
    # Multi-token-prediction modules trained after the last block (DeepSeek-V3's MTP; Megatron-Core's
    # mtp_num_layers): rules.mtp_reason says which stacks run them. Written only when not 0.
    mtp_layers: Any = 0
    # The cross-entropy kernel a megatron-core plan runs (rules.CROSS_ENTROPY_FUSIONS); None: the stack's
    # default. Written only when set.
    cross_entropy_fusion: Any = None


@dataclass
class ParallelSpec:
    dp_replicate: Any = AUTO
    dp_shard: Any = AUTO
    tp: Any = AUTO
    sequence_parallel: Any = AUTO
    async_tp: Any = AUTO
    pp: Any = AUTO
    pp_schedule: Any = AUTO
    pp_virtual_stages: Any = AUTO
    pp_layers: Any = None
    cp: Any = AUTO
    # Expert parallelism: routed experts split over `ep` ranks folded into dp_shard x cp x tp
    # (specs/rules.ep_reason). 1 (no EP) for dense models; a plan file that omits it means 1.
    ep: Any = 1
    # How dispatch and combine cross nodes: all_to_all | deepep (rules.ep_dispatch_reason). Written only
    # when deepep.
    ep_dispatch: Any = "all_to_all"
    # Megatron-Core's EP overlap: all-to-alls under another micro-batch's compute (rules.ep_overlap_reason).
    # Written only when true.
    ep_overlap: Any = False
    # Megatron-Core's shared-expert overlap: the shared experts beside the all-to-alls
    # (rules.shared_expert_overlap_reason). Written only when true.
    shared_expert_overlap: Any = False

    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard


@dataclass
class MemorySpec:
    activation_checkpointing: Any = AUTO
    sac_ops: Any = None
    float8: Any = AUTO
    reshard_after_forward: Any = AUTO
    # Megatron-Core's selective recompute modules (rules.RECOMPUTE_MODULES), on stack megatron-core in
    # place of sac_ops; None: its default, core_attn. Written only when set.
    recompute_modules: Any = None
    # Megatron-Core's precision-aware optimizer (rules.OPTIMIZER_DTYPES): AdamW's two moments and the main
    # gradients in fp32 or bf16; None: fp32. Written only when set.
    optimizer_state_dtype: Any = None
    main_grads_dtype: Any = None
    # Megatron-Core's fine-grained activation offloading (rules.OFFLOAD_MODULES): the modules whose inputs
    # go to host memory between their forward and backward; None: none. Written only when set.
    offload_modules: Any = None
    # The dtype data-parallel gradients are reduced and accumulated in (rules.GRAD_REDUCE_DTYPES), on every
    # stack; None: the stack's own (rules.grad_reduce_dtype). Written only when set.
    grad_reduce_dtype: Any = None


@dataclass
class Plan:
    model: ModelSpec
    cluster: str
    gpus: int
    training: TrainingSpec = field(default_factory=TrainingSpec)
    parallel: ParallelSpec = field(default_factory=ParallelSpec)
    memory: MemorySpec = field(default_factory=MemorySpec)
    compile: Any = False
    placement: dict[str, str] | None = None
    mesh_order: list[str] | None = None  # mesh dims outer -> inner (default: pp, dp_replicate, dp_shard, cp, tp)
    model_ref: Any = None  # how the user named the model (kept so a written plan says the same)
    version: int = 1
    stack: str = MESHPLAN  # the software stack the plan is priced for (specs/rules.py STACKS)

    def auto_fields(self) -> list[str]:
        out = []
        for section in ("training", "parallel", "memory"):
            for f in fields(getattr(self, section)):
                if getattr(getattr(self, section), f.name) == AUTO:
                    out.append(f"{section}.{f.name}")
        if self.compile == AUTO:
            out.append("compile")
        return out

    def is_complete(self) -> bool:
        return not self.auto_fields()

    def to_dict(self, estimate: dict | None = None) -> dict[str, Any]:
        model = self.model_ref if isinstance(self.model_ref, str) else self.model.to_dict()
        out: dict[str, Any] = {
            "version": self.version,
            "model": model,
            "cluster": self.cluster,
            "gpus": self.gpus,
            "training": self._training_dict(),
            "parallel": self._parallel_dict(),
            "memory": self._memory_dict(),
            "compile": self.compile,
        }
        if self.placement:
            out["placement"] = dict(self.placement)
        if self.mesh_order:
            out["mesh_order"] = list(self.mesh_order)
        if self.stack != MESHPLAN:
            out["stack"] = self.stack  # a plan for meshplan's runtime reads as before `stack` existed
        if estimate is not None:
            out["estimate"] = estimate
        return out

    def _training_dict(self) -> dict[str, Any]:
        out = asdict(self.training)
        if out["mtp_layers"] == 0:
            del out["mtp_layers"]  # a plan without MTP reads as before training.mtp_layers existed
        if out["cross_entropy_fusion"] is None:
            del out["cross_entropy_fusion"]  # likewise: the stack's own loss
        return out

    def _parallel_dict(self) -> dict[str, Any]:
        out = asdict(self.parallel)
        if not self.model.is_moe and out["ep"] in (1, AUTO):
            del out["ep"]  # a dense plan reads as before parallel.ep existed
        if out["ep_dispatch"] == "all_to_all":
            del out["ep_dispatch"]  # as does a plan of NCCL all-to-alls before parallel.ep_dispatch
        if not out["ep_overlap"]:
            del out["ep_overlap"]  # and one of all-to-alls in line before parallel.ep_overlap
        if not out["shared_expert_overlap"]:
            del out["shared_expert_overlap"]  # and one of shared experts in line before that field
        return out

    def _memory_dict(self) -> dict[str, Any]:
        out = asdict(self.memory)
        for key in ("recompute_modules", "optimizer_state_dtype", "main_grads_dtype", "offload_modules",
                    "grad_reduce_dtype"):
            if out[key] is None:
                del out[key]  # a plan that names none reads as before the field existed
        return out

    def copy(self, **changes: Any) -> "Plan":
        return replace(self, training=replace(self.training), parallel=replace(self.parallel),
                       memory=replace(self.memory), **changes)

    def save(self, path: str | Path, estimate: dict | None = None) -> None:
        atomic_write_yaml(path, self.to_dict(estimate))


TOP_LEVEL = ("version", "model", "cluster", "gpus", "training", "parallel", "memory", "compile",
             "placement", "mesh_order", "stack", "estimate")


def load_plan(path: str | Path) -> Plan:
    data = load_yaml_file(path, "plan")
    return plan_from_dict(data)


def plan_from_dict(data: Any) -> Plan:
    data = require_mapping(data, "plan")
    reject_unknown(data, TOP_LEVEL, "")
    version = data.get("version", 1)
    if version != 1:
        raise InputError("version", f"must be 1, got {version!r}")
    for key in ("model", "cluster", "gpus"):
        if key not in data:
            raise InputError(key, "is required")
    model = resolve_model(data["model"], "model")
    cluster = data["cluster"]
    if not isinstance(cluster, str) or not cluster:
        raise InputError("cluster", f"must be a built-in profile name or a path to a profile YAML, got {cluster!r}")
    gpus = as_int(data["gpus"], "gpus", 1)
    plan = Plan(
        model=model,
        cluster=cluster,
        gpus=gpus,
        training=_parse_training(data.get("training", {})),
        parallel=_parse_parallel(data.get("parallel", {})),
        memory=_parse_memory(data.get("memory", {})),
        compile=as_bool(data.get("compile", False), "compile", allow_auto=True),
        placement=_parse_placement(data.get("placement")),
        mesh_order=_parse_mesh_order(data.get("mesh_order")),
        model_ref=data["model"] if isinstance(data["model"], str) else None,
        stack=as_choice(data.get("stack", MESHPLAN), "stack", STACKS),
    )
    check_consistency(plan)
    return plan


def _parse_training(raw: Any) -> TrainingSpec:
    raw = require_mapping(raw if raw is not None else {}, "training")
    reject_unknown(raw, [f.name for f in fields(TrainingSpec)], "training")
    d = TrainingSpec()
    return TrainingSpec(
        seq_len=as_int(raw.get("seq_len", d.seq_len), "training.seq_len", 1, allow_auto=True),
        global_batch=as_int(raw.get("global_batch", d.global_batch), "training.global_batch", 1, allow_auto=True),
        micro_batch=as_int(raw.get("micro_batch", d.micro_batch), "training.micro_batch", 1, allow_auto=True),
        dtype=as_choice(raw.get("dtype", d.dtype), "training.dtype", DTYPES, allow_auto=True),
        mtp_layers=as_int(raw.get("mtp_layers", d.mtp_layers), "training.mtp_layers", 0),
        cross_entropy_fusion=_optional_choice(raw, "training", "cross_entropy_fusion", CROSS_ENTROPY_FUSIONS),
    )


def _parse_parallel(raw: Any) -> ParallelSpec:
    raw = require_mapping(raw if raw is not None else {}, "parallel")
    reject_unknown(raw, [f.name for f in fields(ParallelSpec)], "parallel")
    d = ParallelSpec()
    ints = {k: as_int(raw.get(k, getattr(d, k)), f"parallel.{k}", 1, allow_auto=True)
            for k in ("dp_replicate", "dp_shard", "tp", "pp", "pp_virtual_stages", "cp", "ep")}
    pp_layers = raw.get("pp_layers", None)
    if pp_layers is not None and pp_layers != AUTO:
        if not isinstance(pp_layers, list) or not pp_layers:
            raise InputError("parallel.pp_layers", f"must be a list of layer counts per stage, null or 'auto', got {pp_layers!r}")
        pp_layers = [as_int(v, f"parallel.pp_layers[{i}]", 0) for i, v in enumerate(pp_layers)]
    return ParallelSpec(
        sequence_parallel=as_bool(raw.get("sequence_parallel", d.sequence_parallel), "parallel.sequence_parallel", True),
        async_tp=as_bool(raw.get("async_tp", d.async_tp), "parallel.async_tp", True),
        pp_schedule=as_choice(raw.get("pp_schedule", d.pp_schedule), "parallel.pp_schedule", PP_SCHEDULES, True),
        pp_layers=pp_layers,
        ep_dispatch=as_choice(raw.get("ep_dispatch", d.ep_dispatch), "parallel.ep_dispatch", EP_DISPATCHERS),
        ep_overlap=as_bool(raw.get("ep_overlap", d.ep_overlap), "parallel.ep_overlap"),
        shared_expert_overlap=as_bool(raw.get("shared_expert_overlap", d.shared_expert_overlap),
                                      "parallel.shared_expert_overlap"),
        **ints,
    )


def _parse_memory(raw: Any) -> MemorySpec:
    raw = require_mapping(raw if raw is not None else {}, "memory")
    reject_unknown(raw, [f.name for f in fields(MemorySpec)], "memory")
    d = MemorySpec()
    sac = raw.get("sac_ops", None)
    if sac is not None and sac != AUTO:
        if not isinstance(sac, list):
            raise InputError("memory.sac_ops", f"must be a list drawn from {', '.join(SAC_OPS)}, null or 'auto', got {sac!r}")
        sac = [as_choice(v, f"memory.sac_ops[{i}]", SAC_OPS) for i, v in enumerate(sac)]
    return MemorySpec(
        activation_checkpointing=as_choice(raw.get("activation_checkpointing", d.activation_checkpointing),
                                           "memory.activation_checkpointing", AC_MODES, True),
        sac_ops=sac,
        float8=as_bool(raw.get("float8", d.float8), "memory.float8", True),
        reshard_after_forward=as_bool(raw.get("reshard_after_forward", d.reshard_after_forward),
                                      "memory.reshard_after_forward", True),
        recompute_modules=_module_list(raw, "recompute_modules", RECOMPUTE_MODULES),
        optimizer_state_dtype=_optional_choice(raw, "memory", "optimizer_state_dtype", OPTIMIZER_DTYPES),
        main_grads_dtype=_optional_choice(raw, "memory", "main_grads_dtype", OPTIMIZER_DTYPES),
        offload_modules=_module_list(raw, "offload_modules", OFFLOAD_MODULES),
        grad_reduce_dtype=_optional_choice(raw, "memory", "grad_reduce_dtype", GRAD_REDUCE_DTYPES),
    )


def _module_list(raw: dict[str, Any], key: str, choices: tuple[str, ...]) -> list[str] | None:
    """An optional list of Megatron-Core module names: absent or null, None; else non-empty, each once."""
    modules = raw.get(key, None)
    if modules is None:
        return None
    if not isinstance(modules, list) or not modules:
        raise InputError(f"memory.{key}", f"must be a non-empty list drawn from {', '.join(choices)}, or null, "
                                          f"got {modules!r}")
    modules = [as_choice(v, f"memory.{key}[{i}]", choices) for i, v in enumerate(modules)]
    if len(set(modules)) != len(modules):
        raise InputError(f"memory.{key}", f"names a module twice: {modules}")
    return modules


def _optional_choice(raw: dict[str, Any], section: str, key: str, choices: tuple[str, ...]) -> str | None:
    """An optional field of `section`: absent or null, None; else one of `choices`."""
    return None if raw.get(key) is None else as_choice(raw[key], f"{section}.{key}", choices)


def _parse_placement(raw: Any) -> dict[str, str] | None:
    if raw is None:
        return None
    raw = require_mapping(raw, "placement")
    reject_unknown(raw, MESH_DIMS, "placement")
    return {k: as_str(v, f"placement.{k}") for k, v in raw.items()}


def _parse_mesh_order(raw: Any) -> list[str] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or sorted(map(str, raw)) != sorted(MESH_DIMS):
        raise InputError("mesh_order", f"must list each of {', '.join(MESH_DIMS)} once (outer to inner), got {raw!r}")
    return list(raw)


def _known(*values: Any) -> bool:
    return all(v != AUTO for v in values)


def check_consistency(plan: Plan) -> None:
    """Cross-field rules; fields still 'auto' are checked once filled."""
    m, t, p, mem = plan.model, plan.training, plan.parallel, plan.memory
    why = mtp_reason(plan.stack, t.mtp_layers)
    if why:
        raise InputError("training.mtp_layers", why)
    why = cross_entropy_fusion_reason(plan.stack, t.cross_entropy_fusion)
    if why:
        raise InputError("training.cross_entropy_fusion", why)
    why = ep_dispatch_reason(plan.stack, p.ep_dispatch, p.ep)  # the stack's answer needs no ep; ep 1's waits for it
    if why:
        raise InputError("parallel.ep_dispatch", why)
    if p.ep_overlap:
        why = ep_overlap_reason(plan.stack, p.ep, p.pp, p.pp_virtual_stages, mem.activation_checkpointing, t.dtype, t.mtp_layers)
        if why:
            raise InputError("parallel.ep_overlap", why)
    if p.shared_expert_overlap:
        why = shared_expert_overlap_reason(plan.stack, m.moe.shared_experts if m.moe else 0, p.ep, bool(p.ep_overlap),
                                           mem.recompute_modules)
        if why:
            raise InputError("parallel.shared_expert_overlap", why)
    if _known(p.tp):
        if m.n_heads % p.tp or m.n_kv_heads % p.tp:
            raise InputError("parallel.tp", f"must divide n_heads ({m.n_heads}) and n_kv_heads ({m.n_kv_heads}), got {p.tp}")
        if m.ffn_dim % p.tp:
            raise InputError("parallel.tp", f"must divide ffn_dim ({m.ffn_dim}), got {p.tp}")
        if m.moe is not None and _known(p.ep) and p.ep == 1 and m.moe.expert_ffn_dim % p.tp:
            raise InputError("parallel.tp", f"must divide expert_ffn_dim ({m.moe.expert_ffn_dim}) with ep 1 "
                                            f"(experts TP-sharded), got {p.tp}")
    if _known(p.ep, p.dp_shard, p.cp, p.tp):
        why = ep_reason(m, p.ep, p.dp_shard, p.cp, p.tp)
        if why:
            raise InputError("parallel.ep", why)
    degrees = [p.dp_replicate, p.dp_shard, p.cp, p.tp, p.pp]
    if _known(*degrees):
        prod = 1
        for d in degrees:
            prod *= d
        if prod != plan.gpus:
            raise InputError("parallel", f"dp_replicate*dp_shard*cp*tp*pp = {prod} must equal gpus = {plan.gpus}")
    if _known(t.seq_len) and t.seq_len > m.max_seq_len and m.arch == "gpt":
        raise InputError("training.seq_len", f"must be <= the model's learned positions ({m.max_seq_len}), got {t.seq_len}")
    if _known(t.seq_len, p.cp) and p.cp > 1 and t.seq_len % (2 * p.cp):
        raise InputError("parallel.cp", f"2*cp must divide seq_len ({t.seq_len}) for load-balanced causal CP, got cp={p.cp}")
    if _known(t.seq_len, p.cp, p.tp, p.sequence_parallel) and p.sequence_parallel and p.tp > 1:
        if (t.seq_len // p.cp) % p.tp:
            raise InputError("parallel.tp", f"must divide the per-CP-rank sequence ({t.seq_len // p.cp}) with sequence_parallel, got {p.tp}")
    if _known(t.global_batch, t.micro_batch, p.dp_replicate, p.dp_shard):
        per_step = t.micro_batch * p.dp_replicate * p.dp_shard
        if t.global_batch % per_step:
            raise InputError("training.global_batch",
                             f"must be a multiple of micro_batch*dp_replicate*dp_shard = {per_step}, got {t.global_batch}")
    _check_pipeline(plan)
    _check_tp_fields(plan)
    why = recompute_modules_reason(plan.stack, mem.activation_checkpointing, mem.recompute_modules, mem.sac_ops)
    if why:
        raise InputError(*why)
    why = precision_aware_reason(plan.stack, mem.optimizer_state_dtype, mem.main_grads_dtype)
    if why:
        raise InputError(*why)
    why = offload_modules_reason(plan.stack, mem.offload_modules)
    if why:
        raise InputError("memory.offload_modules", why)
    fsdp_size = p.dp_shard * p.cp if _known(p.dp_shard, p.cp) else None
    why = grad_reduce_dtype_reason(plan.stack, mem.grad_reduce_dtype, t.dtype, fsdp_size, mem.main_grads_dtype)
    if why:
        raise InputError("memory.grad_reduce_dtype", why)
    if mem.sac_ops not in (None, AUTO) and mem.activation_checkpointing not in ("selective", AUTO):
        raise InputError("memory.sac_ops", "applies only with activation_checkpointing: selective")
    check_runtime_rules(plan)


def _check_tp_fields(plan: Plan) -> None:
    """Fields that only mean something under TP: refused without it rather than dropped."""
    p = plan.parallel
    if _known(p.tp) and p.tp == 1:
        for name in ("sequence_parallel", "async_tp"):
            if getattr(p, name) is True:
                raise InputError(f"parallel.{name}", "applies only with tp > 1 (tp is 1); set false")


def _check_pipeline(plan: Plan) -> None:
    p, n_layers = plan.parallel, plan.model.n_layers
    if not _known(p.pp):
        return
    if p.pp > n_layers:
        raise InputError("parallel.pp", f"must be <= n_layers ({n_layers}), got {p.pp}")
    if p.pp == 1:
        if _known(p.pp_virtual_stages) and p.pp_virtual_stages != 1:
            raise InputError("parallel.pp_virtual_stages", f"must be 1 when pp is 1, got {p.pp_virtual_stages}")
        if p.pp_layers not in (None, AUTO):
            raise InputError("parallel.pp_layers", f"applies only with pp > 1 (pp is 1), got {p.pp_layers}; set null")
        if _known(p.pp_schedule) and p.pp_schedule != DEFAULT_PP_SCHEDULE:
            raise InputError("parallel.pp_schedule", f"applies only with pp > 1 (pp is 1), got {p.pp_schedule}; "
                                                     f"set {DEFAULT_PP_SCHEDULE} or auto")
        return
    if _known(p.pp_schedule, p.pp_virtual_stages):
        v = p.pp_virtual_stages
        if p.pp_schedule in SINGLE_STAGE_SCHEDULES and v != 1:
            raise InputError("parallel.pp_virtual_stages", f"must be 1 for {p.pp_schedule}, got {v}")
        if p.pp_schedule in V_SHAPED_SCHEDULES and v != 2:
            raise InputError("parallel.pp_virtual_stages", f"must be 2 for {p.pp_schedule} (V-shaped), got {v}")
    if _known(p.pp_virtual_stages):
        stages = p.pp * p.pp_virtual_stages
        if p.pp_layers not in (None, AUTO):
            if len(p.pp_layers) != stages:
                raise InputError("parallel.pp_layers", f"must list {stages} stages (pp*pp_virtual_stages), got {len(p.pp_layers)}")
            if sum(p.pp_layers) != n_layers:
                raise InputError("parallel.pp_layers", f"must sum to n_layers ({n_layers}), got {sum(p.pp_layers)}")
        elif stages > n_layers:
            raise InputError("parallel.pp", f"pp*pp_virtual_stages = {stages} exceeds n_layers ({n_layers})")
