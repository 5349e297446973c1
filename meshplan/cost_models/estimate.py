"""Estimate: step time, throughput, MFU and per-rank peak memory of a complete plan."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from meshplan.cost_models import constants, forms
from meshplan.cost_models.mfu import mfu as model_mfu, mfu_peak_name
from meshplan.cost_models.activations import megatron_recomputed_matmuls, recomputed_kinds, replay_stops_early
from meshplan.cost_models.comm import GroupSpan, collective_time, p2p_time, runs_nccl
from meshplan.cost_models.compute import memory_bound_time
from meshplan.cost_models.flops import attention_flops_per_token, block_matmuls, model_flops_per_token, sac_kind
from meshplan.cost_models.host import pipeline_action_s, pipeline_actions, step_host_time
from meshplan.cost_models.layout import Layout, layout_of, representative_layers, runtime_paths, stage_kinds
from meshplan.cost_models.memory import (GIB, ONE_RANK_PHASES, STATE_BYTES, kept_output_units, peak_rank_memory,
                                         stage_params, state_bytes, weight_pass_share)
from meshplan.cost_models.moe import ep_span, routing
from meshplan.cost_models.pipeline import ScheduleResult, rank_work, simulate, simulate_cached, stage_rank
from meshplan.cost_models.stacks import MegatronRecompute
from meshplan.cost_models.timing import BlockTime, block_time, embedding_time, ep_alone_share, head_time, mtp_extra_time
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.plan import MESH_DIMS, Plan
from meshplan.specs.rules import uses_fully_shard

# Outer to inner, as TorchTitan builds its mesh: TP varies fastest so it stays inside a node.
DEFAULT_MESH_ORDER = MESH_DIMS


@dataclass
class Estimate:
    step_time_s: float
    tokens_per_s_per_gpu: float
    model_flops_per_token: float
    mfu: float
    hfu: float
    peak_memory_gib: float
    fits: bool
    memory_gib: dict[str, float]
    time_s: dict[str, float]
    per_rank_memory_gib: list[dict[str, float]]
    pipeline: dict[str, Any] = field(default_factory=dict)
    placement: dict[str, str] = field(default_factory=dict)
    usable_memory_gib: float = 0.0
    mfu_peak: str = "bf16 dense"  # the peak `mfu` is measured against
    mfu_fp8: float | None = None  # float8 plans: model FLOPs against the dense fp8 peak
    context_gib: float = 0.0  # the process's CUDA/NCCL context, outside the caching allocator
    moe: dict[str, float] | None = None  # MoE models: the expert terms (moe_summary)

    @property
    def reserved_peak_gib(self) -> float:
        """Live tensors plus the caching allocator's slack: what max_memory_reserved (and TorchTitan's memory
        column) measures; peak_memory_gib adds the context, and that sum is what must fit."""
        return self.peak_memory_gib - self.context_gib

    @property
    def allocated_peak_gib(self) -> float:
        """The peak without its `overhead` part (process context, allocator slack): the tensors
        alone, which is what a run measures as allocated (CUDA max_memory_allocated, live tensor
        bytes on CPU). peak_memory_gib, overhead included, is what must fit."""
        return max(r["total"] - r.get("overhead", 0.0) for r in self.per_rank_memory_gib)

    def to_json(self, plan: Plan | None = None) -> dict[str, Any]:
        out = {
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "model_flops_per_token": self.model_flops_per_token,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory_gib": self.peak_memory_gib,
            "reserved_peak_memory_gib": self.reserved_peak_gib,
            "allocated_peak_memory_gib": self.allocated_peak_gib,
            "usable_memory_gib": self.usable_memory_gib,
            "fits": self.fits,
            "memory_gib": self.memory_gib,
            "time_s": self.time_s,
            "per_rank_memory_gib": self.per_rank_memory_gib,
            "pipeline": self.pipeline,
            "placement": self.placement,
            "mfu_peak": self.mfu_peak,
            "mfu_fp8": self.mfu_fp8,
        }
        if self.moe is not None:
            out["moe"] = self.moe
        if plan is not None:
            out["plan"] = plan.to_dict()
        return out

    def summary(self) -> dict[str, float]:
        """The short form written into a plan file's `estimate:` section."""
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in {
            "step_time_s": self.step_time_s, "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu, "hfu": self.hfu, "peak_memory_gib": self.peak_memory_gib, "fits": self.fits}.items()}


def group_spans(lay: Layout, prof: ClusterProfile, order: tuple[str, ...] = DEFAULT_MESH_ORDER) -> dict[str, GroupSpan]:
    """Each mesh dimension's group: its size and how many of its ranks share a node."""
    return _group_spans(lay.pp, lay.dp_replicate, lay.dp_shard, lay.cp, lay.tp, prof.devices_per_node, order)


@lru_cache(maxsize=65536)
def _group_spans(pp: int, dp_replicate: int, dp_shard: int, cp: int, tp: int, devices_per_node: int,
                 order: tuple[str, ...]) -> dict[str, GroupSpan]:
    degrees = {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp}
    world = pp * dp_replicate * dp_shard * cp * tp
    spans, inner = {}, 1
    for dim in reversed(order):
        d = degrees[dim]
        per_node = max(1, min(d, devices_per_node // inner)) if inner < devices_per_node else 1
        spans[dim] = GroupSpan(d, per_node, _hosts_touched(d, inner, world, devices_per_node))
        inner *= d
    return spans


def _hosts_touched(d: int, inner: int, world: int, devices_per_node: int) -> int:
    """The most hosts any group of a dim touches, ranks filling hosts in order: its members sit `inner`
    ranks apart, and its groups start at b + s * inner * d (b < inner). Where d * inner does not divide
    the host (3-way CP inside 2-way TP on 8-GPU hosts, 64-rank blocks on a 72-GPU NVL72 domain), some
    groups straddle a host boundary that the group containing rank 0 does not (tests/planner/test_placement
    checks this against a topology graph)."""
    if inner >= devices_per_node:  # members a host or more apart: each on its own
        return d
    block = inner * d
    last = 0
    for s in range(min(world // block, devices_per_node)):  # start residues repeat within a host's width
        start = s * block % devices_per_node
        last = max(last, devices_per_node - 1 if start + inner - 1 >= devices_per_node else start + inner - 1)
    # Consecutive members are under a host apart, so a group touches every host from its first to its last.
    return (last + (d - 1) * inner) // devices_per_node + 1


def placement_of(spans: dict[str, GroupSpan], prof: ClusterProfile) -> dict[str, str]:
    return {dim: (prof.node_level() if s.nodes <= 1 else prof.cluster_level()) for dim, s in spans.items() if s.size > 1}


@dataclass
class StageDurations:
    """Seconds per stage for one micro-batch (forward, backward-input, backward-weight) and the p2p send."""

    forward: list[float]
    backward: list[float]
    weight: list[float]
    p2p: float


def stage_durations(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan], bts=None, head=None,
                    emb: float | None = None) -> StageDurations:
    """What the pipeline simulation is fed: per-stage F / B / W durations and the stage-to-stage send.
    `bts`: each block kind's BlockTime by representative layer (block_times)."""
    bts = bts if bts is not None else block_times(lay, prof, spans)
    head = head if head is not None else head_time(lay, prof)
    emb = emb if emb is not None else embedding_time(lay, prof)
    n_stages = lay.n_stages
    act, w_act = pipeline_action_s(lay, prof.overheads)
    f, b, w = [], [], []
    if len(bts) == 1 and not lay.mtp_layers:  # every block alike: a stage costs its layer count times one block
        (bt,) = bts.values()
        fwd, bwd, wgt = bt.forward_with_comm, bt.backward_input_with_comm, bt.backward_weight
        for s in range(n_stages):
            layers = lay.stage_layers[s]
            f.append(layers * fwd + (emb if s == 0 else 0.0) + (head.forward if s == n_stages - 1 else 0.0) + act)
            b.append(layers * bwd + (head.backward if s == n_stages - 1 else 0.0) + act)
            w.append(layers * wgt + w_act)
    else:
        for s, kinds in enumerate(stage_kinds(lay.spec, lay.stage_layers, lay.mtp_layers)):
            f.append(sum(n * bts[k].forward_with_comm for k, n in kinds) + (emb if s == 0 else 0.0)
                     + (head.forward if s == n_stages - 1 else 0.0) + act)
            b.append(sum(n * bts[k].backward_input_with_comm for k, n in kinds)
                     + (head.backward if s == n_stages - 1 else 0.0) + act)
            w.append(sum(n * bts[k].backward_weight for k, n in kinds) + w_act)
    if lay.mtp_layers:  # the MTP modules' projections and second head, beside their blocks (stage_kinds)
        mf, mb, mw = mtp_extra_time(lay, prof, head)
        f[-1] += mf
        b[-1] += mb
        w[-1] += mw
    p2p = 0.0
    if lay.pp > 1:
        payload = lay.tokens_per_micro * lay.hidden_bytes_per_token
        p2p = p2p_time(prof, payload, crosses_node=spans["pp"].nodes > 1)
    return StageDurations(f, b, w, p2p)


def block_times(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan]) -> dict[int, BlockTime]:
    """Each block kind's time, by its representative layer (layout.representative_layers)."""
    return {layer: block_time(lay, prof, spans, layer) for layer in representative_layers(lay.spec)}


def pipeline_schedule(plan: Plan, profile: ClusterProfile, order: tuple[str, ...] = DEFAULT_MESH_ORDER) -> ScheduleResult | None:
    """The simulated schedule (every F / B / W block) behind estimate_plan's step time; None without PP."""
    lay = runtime_paths(layout_of(plan), profile)
    if lay.pp == 1:
        return None
    d = stage_durations(lay, profile, group_spans(lay, profile, plan_order(plan, order)))
    return simulate(lay.schedule, lay.pp, lay.v, lay.n_micro, d.forward, d.backward, d.weight, d.p2p,
                    weight_pass_share(lay))


def estimate_plan(plan: Plan, profile: ClusterProfile, order: tuple[str, ...] = DEFAULT_MESH_ORDER,
                  **layout_overrides) -> Estimate:
    """layout_overrides: Layout fields a plan file cannot say, for modelling other systems' runs
    (validation uses attention_kernel="eager" for Megatron 2021, TorchTitan's SAC op policy)."""
    lay = runtime_paths(layout_of(plan), profile)
    if layout_overrides:
        lay = replace(lay, **layout_overrides)
    return estimate_layout(lay, profile, plan_order(plan, order))


def plan_order(plan: Plan, default: tuple[str, ...] = DEFAULT_MESH_ORDER) -> tuple[str, ...]:
    """The mesh order the plan was placed with (its `mesh_order`), else `default`."""
    return tuple(plan.mesh_order) if plan.mesh_order else default


def profile_cache(prof: ClusterProfile) -> dict:
    """Memo of pure cost-model pieces, kept on the profile object it depends on, one per set of forms in
    force (forms.FORMS): `with forms.forms(...)` must not read another form's memo."""
    by_forms = prof.__dict__.get("_cost_cache")
    if by_forms is None:
        by_forms = prof.__dict__["_cost_cache"] = {}
    return by_forms.setdefault(forms.FORMS, {})


def block_key(lay: Layout, spans: dict[str, GroupSpan]) -> tuple:
    """What a block's time depends on: the key of its memo (stage_inputs) and of the planner's per-layer times."""
    key = ("block", lay.spec, lay.seq_len, lay.micro_batch, lay.cp, lay.tp, lay.sp, lay.async_tp, lay.float8,
           lay.compile, lay.ac, lay.sac_ops, lay.dtype, lay.attention_kernel, lay.attention_dtype,
           lay.elementwise_kernels, lay.norm_fp32, lay.host_ahead, lay.host_counted, lay.kv_repeated,
           lay.cp_attention, lay.cp_ring_overlap, lay.tp_comm_overlap, lay.rope_complex, spans["tp"], spans["cp"],
           lay.n_micro if lay.float8 and lay.float8_weight_cache else None)
    # Expert parallelism changes MoE blocks only: a dense model's key stays as it was.
    if not lay.spec.is_moe:
        return key
    # An MoE block sees dp_shard only through its EP group's span (moe.ep_span), which is what the key holds.
    group = ep_span(spans, lay.ep, lay.cp, lay.tp) if lay.ep > 1 else None
    overlapped = ep_alone_share(lay) if lay.ep_overlap and lay.n_micro >= 2 else None  # timing.ep_exposed
    return key + (lay.ep, lay.moe_imbalance, group, overlapped, lay.moe_host_sync, lay.moe_fused_mlp, lay.ep_dispatch,
                  lay.moe_tp_gather, lay.shared_expert_overlap)


@dataclass
class StepParts:
    """Everything of a step that needs no pipeline simulation: per-stage durations and per-rank work."""

    spans: dict[str, GroupSpan]
    bts: dict[int, BlockTime]  # each block kind's time by representative layer (block_times)
    head: Any
    emb: float
    durations: StageDurations
    busy: tuple[float, ...]  # work per pipeline rank over the step (exact; the makespan is >= max)

    @property
    def bt(self) -> BlockTime:
        """The last block's time (every block's, in a uniform model)."""
        return self.bts[max(self.bts)]


def stage_inputs(lay: Layout, prof: ClusterProfile, order: tuple[str, ...] = DEFAULT_MESH_ORDER) -> tuple:
    """What stage_durations needs besides the split: (group spans, block times, head time, embedding time)."""
    cache = profile_cache(prof)
    spans = group_spans(lay, prof, order)
    key = block_key(lay, spans)
    bt = cache.get(key)
    if bt is None:
        bt = cache[key] = block_times(lay, prof, spans)
    hkey = ("head", lay.spec, lay.tokens_per_micro, lay.tp, lay.dtype, lay.loss_compiled, lay.loss_kernel,
            lay.metric_losses)
    he = cache.get(hkey)
    if he is None:
        he = cache[hkey] = (head_time(lay, prof), embedding_time(lay, prof))
    return spans, bt, he[0], he[1]


def step_parts(lay: Layout, prof: ClusterProfile, order: tuple[str, ...] = DEFAULT_MESH_ORDER) -> StepParts:
    spans, bt, head, emb = stage_inputs(lay, prof, order)
    d = stage_durations(lay, prof, spans, bt, head, emb)
    return StepParts(spans, bt, head, emb, d, rank_busy(lay, d))


def rank_busy(lay: Layout, d: StageDurations) -> tuple[float, ...]:
    """Each pipeline rank's work over the step under the layout's schedule (its stage placement)."""
    return rank_work(lay.schedule, lay.pp, lay.v, lay.n_micro, d.forward, d.backward, d.weight)


def compose_step(lay: Layout, prof: ClusterProfile, parts: StepParts, makespan: float) -> tuple[float, int, float, dict, float]:
    """Step time from a pipeline makespan: (step, critical rank, exposed data-parallel comm, its split, optimizer)."""
    crit = max(range(lay.pp), key=lambda r: parts.busy[r])
    data_exposed, data_detail = _data_parallel_comm(lay, prof, parts.spans, crit, compute_windows(lay, parts, crit))
    optimizer = _optimizer_time(lay, prof, crit)
    step = makespan + data_exposed + optimizer + prof.overheads.step_overhead_s
    return step, crit, data_exposed, data_detail, optimizer


def step_time_lower_bound(lay: Layout, prof: ClusterProfile, order: tuple[str, ...] = DEFAULT_MESH_ORDER) -> tuple[float, bool]:
    """(bound, exact): the step time with the makespan replaced by the busiest rank's work, which no
    schedule can beat. Exact without pipelining."""
    parts = step_parts(lay, prof, order)
    return compose_step(lay, prof, parts, max(parts.busy))[0], lay.pp == 1


def estimate_layout(lay: Layout, prof: ClusterProfile, order: tuple[str, ...] = DEFAULT_MESH_ORDER) -> Estimate:
    parts = step_parts(lay, prof, order)
    spans, bts, head, emb, d = parts.spans, parts.bts, parts.head, parts.emb, parts.durations
    kept_units = tuple(kept_output_units(lay)) if lay.pp > 1 and lay.pp_keeps_outputs else None
    if kept_units:
        res = simulate(lay.schedule, lay.pp, lay.v, lay.n_micro, d.forward, d.backward, d.weight, d.p2p,
                       weight_pass_share(lay), keep_blocks=False, kept=list(kept_units))
        makespan, busy, phases = res.makespan, res.busy, res.phases
    elif lay.pp > 1:
        makespan, busy, _, phases = simulate_cached(lay.schedule, lay.pp, lay.v, lay.n_micro, tuple(d.forward),
                                                    tuple(d.backward), tuple(d.weight), d.p2p,
                                                    w_memory_share=weight_pass_share(lay))
    else:
        makespan, busy, phases = parts.busy[0], parts.busy, ONE_RANK_PHASES
    step, crit, _, data_detail, optimizer = compose_step(lay, prof, parts, makespan)

    time_s = _time_breakdown(lay, prof, bts, head, emb, crit, busy[crit], makespan)
    time_s.update(data_detail)
    time_s["optimizer"] = optimizer
    # The pipeline's own host work per action sits in the critical rank's busy time, not in its compute.
    time_s["overhead"] = prof.overheads.step_overhead_s + pipeline_actions(lay, crit) * pipeline_action_s(lay, prof.overheads)[0]

    mems = [peak_rank_memory(lay, r, phases[r], prof.overheads) for r in range(lay.pp)]
    in_flight = [max(p[0] for p in ph if p is not None) for ph in phases]
    peak = max(mems, key=lambda m: m.total)
    tokens_per_s = lay.global_batch * lay.seq_len / step / lay.gpus
    mflops = model_flops_per_token(lay.spec, lay.seq_len)
    peak_name = mfu_peak_name(prof)
    mfu = model_mfu(lay.spec, lay.seq_len, tokens_per_s, prof)
    fp8 = lay.float8 and "fp8" in prof.device.peak_tflops
    mfu_fp8 = model_mfu(lay.spec, lay.seq_len, tokens_per_s, prof, "fp8") if fp8 else None
    usable = prof.device.usable_memory_gib
    return Estimate(
        step_time_s=step,
        tokens_per_s_per_gpu=tokens_per_s,
        model_flops_per_token=mflops,
        mfu=mfu,
        hfu=mfu * (1 + _recompute_flops_per_token(lay, runs_nccl(prof)) / mflops),
        peak_memory_gib=peak.total / GIB,
        fits=peak.total / GIB <= usable,
        memory_gib=peak.gib(),
        time_s=time_s,
        per_rank_memory_gib=[{"pp_rank": m.rank, "total": m.total / GIB, **m.gib()} for m in mems],
        pipeline={"schedule": lay.schedule, "pp": lay.pp, "virtual_stages": lay.v, "microbatches": lay.n_micro,
                  "stage_layers": list(lay.stage_layers), "bubble_fraction": (makespan - busy[crit]) / makespan,
                  "in_flight": list(in_flight), "p2p_s": d.p2p},
        placement=placement_of(spans, prof),
        usable_memory_gib=usable,
        mfu_peak=f"{peak_name} dense",
        mfu_fp8=mfu_fp8,
        context_gib=prof.overheads.context_gib,
        moe=moe_summary(lay, bts, crit) if lay.spec.is_moe else None,
    )


def moe_summary(lay: Layout, bts: dict[int, BlockTime], crit: int) -> dict[str, float]:
    """The expert terms of the critical pipeline rank's step: its routed experts' grouped GEMMs (forward and
    both backward passes), the dispatch and combine all-to-alls issued and exposed, the routing it was
    priced at, and what the routed experts' states take on it."""
    sp = stage_params(lay, crit)
    moe_blocks = [(k, n) for k, n in sp.kinds if lay.spec.is_moe_layer(k)]
    m = lay.n_micro
    routed = lambda bt: bt.kinds.matmul_by_kind.get("expert_in", 0.0) + bt.kinds.matmul_by_kind.get("expert_out", 0.0)
    r = routing(lay.spec, lay.tokens_per_micro, lay.tp, lay.ep, lay.moe_imbalance)
    return {"ep": lay.ep, "imbalance": lay.moe_imbalance, "tokens_per_local_expert": r.tokens_per_expert,
            "local_experts": r.local_experts, "moe_layers": sum(n for _, n in moe_blocks),
            "expert_compute_s": m * sum(n * 3 * routed(bts[k]) for k, n in moe_blocks),
            "ep_comm_issued_s": m * sum(n * bts[k].ep_comm_issued for k, n in moe_blocks),
            "ep_comm_exposed_s": m * sum(n * bts[k].ep_comm for k, n in moe_blocks),
            "routed_state_gib": sum(state_bytes(lay)) * sp.routed / lay.routed_fsdp_shard / GIB,
            "routed_state_bytes_per_param": sum(state_bytes(lay))}


def _time_breakdown(lay: Layout, prof: ClusterProfile, bts: dict[int, BlockTime], head, emb, crit: int, busy: float,
                    makespan: float) -> dict[str, float]:
    stages = [s for s in range(lay.n_stages) if stage_rank(s, lay.pp, lay.schedule) == crit]
    kinds = stage_params(lay, crit).kinds  # the critical rank's blocks, by kind
    m = lay.n_micro

    def blocks(part) -> float:
        return m * sum(n * part(bts[k]) for k, n in kinds)

    extra = (emb if 0 in stages else 0.0) + (head.forward + head.backward if lay.n_stages - 1 in stages else 0.0)
    if lay.n_stages - 1 in stages:  # the MTP modules' blocks are among `kinds` (layout.stage_kinds)
        extra += sum(mtp_extra_time(lay, prof, head))
    out = {
        "compute": blocks(lambda bt: bt.forward + bt.backward_input + bt.backward_weight) + m * extra,
        "recompute": blocks(lambda bt: bt.recompute),
        "tp_comm": blocks(lambda bt: bt.tp_comm),
        "cp_comm": blocks(lambda bt: bt.cp_comm),
        "pipeline_bubble": makespan - busy,
    }
    if lay.spec.is_moe:
        out["ep_comm"] = blocks(lambda bt: bt.ep_comm)
    return out


@dataclass
class DataParallelComm:
    """The step's FSDP and replica collectives on the critical rank, seconds: issued, hidden and exposed.

    Each collective runs beside the compute of the unit it is issued with, and what exceeds that window is
    exposed (overlap_beyond_windows); the windows follow the stack (Layout.dp_overlap). prefetch (FSDP1,
    FSDP2): each micro-batch's forward gathers the next unit beside the current one, its backward gathers
    again (unless the parameters are held) and reduce-scatters the last unit beside the current one.
    buckets (Megatron-Core): the gathers under the first micro-batch's forward, the reductions under the
    last one's backward; under its interleaved schedule chunk by chunk, each beside the passes of the chunks
    after it (chunked_exposure). none: nothing hides. The first gather and the last reduction (the tails) have no
    compute beside them. What hides is not free: while a collective's kernels share the GPU with the
    compute, the compute runs slower (contention: overheads.comm_compute_slowdown x the hidden share of the
    collectives timed at the node level's rate, their kernels' work; under forms.py's hidden_time
    alternative x the hidden time itself).
    Under forms.py's pooled alternative, FSDP's collectives instead pool against overheads.fsdp_overlap of
    the critical rank's work over the step, with no contention (the form shipped until 2026-11-27)."""

    all_gather: float = 0.0  # FSDP parameter gathers, every unit, every time they are gathered
    reduce_scatter: float = 0.0  # FSDP gradient reductions
    all_reduce: float = 0.0  # gradient all-reduce across replicas (HSDP / DDP)
    tail_all_gather: float = 0.0  # the first block's gather, before any compute to hide under
    tail_reduce_scatter: float = 0.0  # the last block's reduction, after the compute
    tail_all_reduce: float = 0.0
    mechanism: str = "prefetch"  # Layout.dp_overlap
    beyond_windows: float = 0.0  # the collectives' time past the compute beside them (tails apart)
    contention: float = 0.0  # the compute's slowdown beside the hidden collectives
    at_node_rate: float = 0.0  # the same collectives (tails apart) timed as if their group shared one node
    copies: float = 0.0  # FSDP2's copy-out / copy-in kernels on the compute stream (Layout.fsdp_copies)

    @property
    def fsdp(self) -> float:
        return self.all_gather + self.reduce_scatter

    @property
    def total(self) -> float:
        """The collectives compute can hide under (the tails apart)."""
        return self.fsdp + self.all_reduce

    @property
    def tail(self) -> float:
        return 0.0 + self.tail_all_gather + self.tail_reduce_scatter + self.tail_all_reduce

    @property
    def exposed(self) -> float:
        if not self.total:
            return self.copies  # fully_shard on one rank: its copies, no collective (one_rank_copy_time)
        if self.mechanism == "none":
            return self.total + self.copies
        return self.beyond_windows + self.tail + self.contention + self.copies

    @property
    def hidden(self) -> float:
        """Issued less what runs past its window (the tails are issued apart and never hide)."""
        return self.total - self.beyond_windows if self.total and self.mechanism != "none" else 0.0

    @property
    def fsdp_share(self) -> float:
        """FSDP's share of the exposed time (the split reported as fsdp_comm / dp_comm)."""
        return self.fsdp / self.total if self.total else float(self.copies > 0)


@dataclass(frozen=True)
class ComputeWindows:
    """The critical rank's compute over the step (busy) and over one micro-batch's forward and backward
    (input and weight gradients, recompute included): what data_parallel_comm hides collectives beside."""

    busy: float
    forward: float = 0.0
    backward: float = 0.0


def compute_windows(lay: Layout, parts: StepParts, crit: int) -> ComputeWindows:
    """One micro-batch's forward and backward on the critical rank, and its work over the step."""
    d = parts.durations
    zeros = [0.0] * len(d.forward)
    fwd = rank_work(lay.schedule, lay.pp, lay.v, 1, d.forward, zeros, zeros)[crit]
    return ComputeWindows(parts.busy[crit], fwd, parts.busy[crit] / lay.n_micro - fwd)


def overlap_beyond_windows(lay: Layout, c: DataParallelComm, windows: ComputeWindows, share: float) -> float:
    """The collectives' time past the compute each runs beside (`share` of each window usable), tails apart.

    prefetch, per micro-batch: its forward hides that micro-batch's gathers (every gather of the step under
    the first micro-batch's forward where the parameters are held: PP, or no reshard after forward); its
    backward hides the backward gathers and, in the micro-batches that reduce (Layout.grad_reductions),
    the reductions. Blocks alike, so a micro-batch's windows stand for its blocks' windows summed.
    Under forms.py's pooled alternative, prefetch's collectives pool against `share` of the step's work."""
    rs_ar = c.reduce_scatter + c.all_reduce
    fwd, bwd = share * windows.forward, share * windows.backward
    if c.mechanism == "none":
        return c.total
    if c.mechanism == "prefetch" and forms.FORMS.dp_overlap == "pooled":
        return max(0.0, c.total - share * windows.busy)
    if c.mechanism == "buckets":
        # Megatron-Core's interleaved schedule syncs a model chunk at a time (one chunk without it: v is 1)
        group = min(lay.pp, lay.n_micro)
        return chunked_exposure(c.all_gather, fwd, lay.v, group) + chunked_exposure(rs_ar, bwd, lay.v, group)
    m, g = lay.n_micro, lay.grad_reductions
    if lay.params_held:
        forward, ag_back = max(0.0, c.all_gather - fwd), 0.0
    else:
        forward, ag_back = m * max(0.0, c.all_gather / (2 * m) - fwd), c.all_gather / (2 * m)
    backward = (m - g) * max(0.0, ag_back - bwd) + g * max(0.0, ag_back + rs_ar / g - bwd)
    return forward + backward


def chunked_exposure(total: float, window: float, v: int, group: int) -> float:
    """What runs past its compute when Megatron-Core syncs v model chunks one at a time (pipeline_parallel/
    schedules.py, interleaved: param_sync_func gathers the next chunk as a chunk's first micro-batch starts
    its forward, grad_sync_func reduces a chunk after its last micro-batch's backward, bucket by bucket
    beside that pass). The chunks' collectives, total / v each, queue on one stream; the one j chunks from
    the step's end (reductions) or start (gathers) has its own pass (window / v) and the `group` passes of
    each of the j chunks between (Megatron's micro-batch group per virtual stage, the pipeline size) to run
    beside. Exposed is the longest backlog: max over j of (j + 1) total / v - (j group + 1) window / v;
    for one chunk, max(0, total - window)."""
    return max(0.0, max((j + 1) * total / v - (j * group + 1) * window / v for j in range(v)))


def data_parallel_comm(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan], crit: int,
                       windows: ComputeWindows) -> DataParallelComm:
    """FSDP all-gather / reduce-scatter and replica all-reduce of the critical rank, and what compute hides.
    Under EP the routed experts are gathered and reduced over their own, smaller FSDP group (ep_fsdp)."""
    sp = stage_params(lay, crit)
    routed = sp.routed if lay.ep > 1 else 0.0
    params = sp.total - routed
    gather_bytes = 1.0 if lay.float8 else lay.act_bytes
    grad_bytes = lay.grad_reduce_bytes
    c = DataParallelComm(mechanism=lay.dp_overlap)

    def issued(times: int, op: str, payload: float, span: GroupSpan, calls: int) -> float:
        """`times` rounds of a collective over its group; at_node_rate gathers them at the node level's rate
        (the same time where the group sits on one node)."""
        took = times * collective_time(prof, op, payload, span, calls)
        on_node = GroupSpan(span.size, span.size)
        c.at_node_rate += took if span.nodes <= 1 else times * collective_time(prof, op, payload, on_node, calls)
        return took

    units = sp.layers + 1  # FSDP groups one collective per block, plus the root (embedding, norm, head)
    gathers = 1 if lay.params_held else 2 * lay.n_micro
    copies_priced = lay.fsdp_copies and forms.FORMS.fsdp_copies == "counted" and runs_nccl(prof)
    if lay.fsdp_shard > 1:
        span = _fsdp_span(spans)
        c.all_gather = issued(gathers, "all_gather", params * gather_bytes, span, units)
        c.reduce_scatter = issued(lay.grad_reductions, "reduce_scatter", params * grad_bytes, span, units)
        c.tail_all_gather = collective_time(prof, "all_gather", sp.block * gather_bytes, span)
        c.tail_reduce_scatter = collective_time(prof, "reduce_scatter", sp.block * grad_bytes, span)
        efsdp = lay.routed_fsdp_shard
        sharded = params  # what FSDP gathers and reduces, and so copies
        if routed and efsdp > 1:
            espan = _expert_fsdp_span(spans, lay)
            moe_units = sum(n for k, n in sp.kinds if lay.spec.is_moe_layer(k))
            c.all_gather += issued(gathers, "all_gather", routed * gather_bytes, espan, moe_units)
            c.reduce_scatter += issued(lay.grad_reductions, "reduce_scatter", routed * grad_bytes, espan, moe_units)
            sharded += routed
        if copies_priced:
            c.copies = fsdp_copy_time(lay, prof, sharded, gathers, gather_bytes, grad_bytes)
    elif copies_priced and lay.fsdp_one_rank and uses_fully_shard(1, lay.dp_replicate, lay.dtype):
        c.copies = one_rank_copy_time(lay, prof, sp.total, gathers, gather_bytes, grad_bytes)
    if lay.dp_replicate > 1:
        span = spans["dp_replicate"]
        local = sp.sharded(lay.fsdp_shard, lay.routed_fsdp_shard)
        c.all_reduce = issued(lay.grad_reductions, "all_reduce", local * grad_bytes, span, units)
        c.tail_all_reduce = collective_time(prof, "all_reduce", sp.block * grad_bytes / lay.fsdp_shard, span)
    if c.total:
        c.beyond_windows = overlap_beyond_windows(lay, c, windows, prof.overheads.fsdp_overlap)
        if forms.FORMS.dp_overlap == "windows":  # the pooled share stood for the contention too
            c.contention = prof.overheads.comm_compute_slowdown * contended(c)
    return c


def fsdp_copy_time(lay: Layout, prof: ClusterProfile, params: float, gathers: int, gather_bytes: float,
                   grad_bytes: float) -> float:
    """FSDP2's copies on the compute stream over the step (Layout.fsdp_copies): each gather's copy-out reads
    the gathered buffer and writes the unsharded parameters (2 x gather_bytes a parameter), each gradient
    reduction's copy-in reads the unsharded gradients (act_bytes) and writes the reduce-scatter's input
    (grad_bytes). The copy-in on the reduce-scatter stream's side and the sharded gradients' accumulation
    move a shard's worth, left out. On GPU (NCCL) profiles, whose rows chose the form; a CPU profile keeps
    what it was calibrated under (the copies in its fitted host and memory terms), as the runs it prices
    were not part of the choice."""
    per_param = gathers * 2 * gather_bytes + lay.grad_reductions * (lay.act_bytes + grad_bytes)
    return memory_bound_time(prof.device, params * per_param)


def one_rank_copy_time(lay: Layout, prof: ClusterProfile, params: float, gathers: int, gather_bytes: float,
                       grad_bytes: float) -> float:
    """fully_shard's copies on a one-rank mesh over the step (Layout.fsdp_one_rank), on the compute stream:
    fsdp_copy_time's copy-out into the unsharded parameters and copy-in of the gradients, plus, at each
    unshard, the cast of the fp32 parameters to the gather dtype (4 + gather_bytes a parameter), which where
    FSDP shards is a shard's worth and left out. The one-rank reduction's copy to its output runs on the
    reduce-scatter stream, beside the compute, as a collective would: left out."""
    cast = memory_bound_time(prof.device, params * gathers * (4.0 + gather_bytes))
    return fsdp_copy_time(lay, prof, params, gathers, gather_bytes, grad_bytes) + cast


def contended(c: DataParallelComm) -> float:
    """The time the compute is slowed over, as forms.FORMS.contention says: the hidden time, or the hidden
    share of the collectives at the node level's rate (their kernels' work, which a slower link stretches
    without adding to)."""
    if forms.FORMS.contention == "hidden_time":
        return c.hidden
    return c.hidden * c.at_node_rate / c.total


def _data_parallel_comm(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan], crit: int,
                        windows: ComputeWindows):
    """Exposed FSDP all-gather / reduce-scatter and replica all-reduce: what compute cannot hide."""
    c = data_parallel_comm(lay, prof, spans, crit, windows)
    exposed, share = c.exposed, c.fsdp_share
    return exposed, {"fsdp_comm": exposed * share, "dp_comm": exposed * (1 - share)}


def _expert_fsdp_span(spans: dict[str, GroupSpan], lay: Layout) -> GroupSpan:
    """The routed experts' FSDP group (ep_fsdp): dp_shard x cp x tp less the EP group inside it."""
    dims = [spans[d] for d in ("dp_shard", "cp", "tp")]
    size = lay.routed_fsdp_shard
    on_node = dims[0].ranks_per_node * dims[1].ranks_per_node * dims[2].ranks_per_node
    return GroupSpan(size, max(1, min(size, on_node // ep_span(spans, lay.ep, lay.cp, lay.tp).ranks_per_node)))


def _fsdp_span(spans: dict[str, GroupSpan]) -> GroupSpan:
    """The flattened dp_shard x cp group FSDP shards over."""
    a, b = spans["dp_shard"], spans["cp"]
    return GroupSpan(a.size * b.size, min(a.size * b.size, a.ranks_per_node * b.ranks_per_node))


def _optimizer_time(lay: Layout, prof: ClusterProfile, rank: int) -> float:
    """AdamW's memory traffic, plus the step's host work outside the blocks (optimizer ops, data-parallel
    hooks and their collective calls; 0 unless the profile prices host work, see host.py)."""
    local = stage_params(lay, rank).sharded(lay.fsdp_shard, lay.routed_fsdp_shard)
    return memory_bound_time(prof.device, local * optimizer_bytes_per_param(lay)) + step_host_time(lay, prof, rank)


def optimizer_bytes_per_param(lay: Layout) -> float:
    """What the optimizer step and the gradient clipping move per parameter of a rank: torch.optim's foreach
    AdamW and a foreach clip, or a fused Adam with the clip's norm alone (Layout.optimizer_foreach)."""
    m = constants.MODEL
    if lay.optimizer_foreach:
        return m.adamw_foreach_bytes_per_param + m.clip_foreach_bytes_per_param
    # The fused step reads the fp32 parameter, the gradient and both moments and writes the parameter and the
    # moments (7 x 4 bytes in fp32); a precision-aware optimizer's bf16 gradient and moments move half as much.
    fp32 = STATE_BYTES
    narrower = (fp32["grads"] - lay.main_grad_bytes) + 2 * (fp32["optimizer"] - lay.optimizer_state_bytes)
    return m.adamw_bytes_per_param - narrower + lay.main_grad_bytes  # the clip's norm reads each gradient once


def _recompute_flops_per_token(lay: Layout, on_gpu: bool) -> float:
    """Model FLOPs (the MFU convention) recompute adds per token, over every block."""
    kinds = recomputed_kinds(lay.ac, lay.sac_ops, lay.spec.arch, lay.attention_kernel, lay.compile)
    spec = lay.spec
    if not kinds and not isinstance(lay.sac_ops, MegatronRecompute):
        return 0.0
    total = 0.0
    stopped = recomputed_kinds(lay.ac, lay.sac_ops, spec.arch, lay.attention_kernel, lay.compile, True)
    for layers in spec.block_kinds().values():
        layer_kinds = stopped if replay_stops_early(lay, layers[0], on_gpu) else kinds
        flops = sum(mm.flops_per_token for mm in megatron_recomputed_matmuls(spec, layers[0], 1, lay.sac_ops))
        for mm in block_matmuls(spec, layers[0]):
            kind = sac_kind(mm.kind)
            if kind in layer_kinds:
                flops += mm.flops_per_token
            elif f"{kind}_partial" in layer_kinds:
                flops += mm.flops_per_token * (spec.kv_dim / (spec.q_dim + 2 * spec.kv_dim) if kind == "qkv" else 0.5)
        if "attention" in layer_kinds:
            flops += attention_flops_per_token(spec, lay.seq_len, causal=False, layer=layers[0])
        total += flops * len(layers)
    return total
