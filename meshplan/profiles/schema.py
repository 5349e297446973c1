"""ClusterProfile: what the cost model knows about a cluster; built-ins and profile-cluster share it.

Bandwidths are GB/s (1e9 bytes/s), latencies microseconds, memory GiB, throughput TFLOP/s.
Collective bandwidths use the nccl-tests "bus bandwidth" convention, so published numbers drop in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from meshplan.errors import InputError
from meshplan.fields import as_float, as_int, as_str, reject_unknown, require_mapping

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
PROFILE_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass
class MatmulModel:
    """Achievable matmul TFLOP/s: max_fraction * peak, scaled down for small dims by d / (d + half_dim).

    `points` (optional, measured) hold {m, n, k, dtype, tflops}; when present the cost model
    interpolates them instead of the parametric curve.
    """

    max_fraction: dict[str, float]
    half_dim: float = 96.0
    points: list[dict[str, Any]] = field(default_factory=list)
    # Measured (optional): the routed experts' grouped GEMMs, {groups, m (tokens per group), n, k, dtype,
    # tflops}; where present they price an MoE layer's experts (cost_models/compute.py), else one matmul each.
    grouped_points: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class AttentionModel:
    """Fused causal attention forward throughput: max_fraction * peak * s / (s + half_seq); backward x backward_ratio."""

    max_fraction: float
    half_seq: float = 1024.0
    backward_ratio: float = 0.75  # backward kernels run at this fraction of the forward's throughput
    points: list[dict[str, Any]] = field(default_factory=list)
    # Dense bf16 tensor-core FLOPs per exponential the special-function units issue in the same time (the
    # softmax's one exp per score): the part's tensor FLOPs per clock per SM over its 16 exp per clock per
    # SM. Prices heads narrower than the narrowest measured one (compute.attention_tflops); points without a
    # head_dim stand for every width, so it needs points that name theirs. None holds narrow heads flat.
    flops_per_exp: float | None = None


@dataclass
class Device:
    name: str
    memory_gib: float
    usable_memory_gib: float
    peak_tflops: dict[str, float]
    memory_bandwidth_gbs: float
    matmul: MatmulModel
    attention: AttentionModel
    memory_bound_efficiency: float = 0.7
    # Share of the measured best-case tensor-core rate (matmul max_fraction / points, attention) that
    # training sustains: power and clock limits, SMs shared with NCCL kernels (cost_models/constants.py).
    sustained_fraction: float = 1.0
    # GB/s one way between one GPU and its host's memory when every GPU of the node copies at once (pinned
    # copies): what activation offloading moves at (Megatron-Core's offload_modules). None: not known, and a
    # plan that offloads is refused on the profile.
    host_link_gbs: float | None = None


@dataclass
class LinkLevel:
    """One level of the interconnect: `nvlink` inside a node, `network` across nodes."""

    name: str
    scope: str  # node | cluster
    bandwidth_gbs: float  # per device, one direction
    latency_us: float


@dataclass
class CollectiveSegment:
    """Messages from min_bytes up, where the measurements need a line of their own."""

    min_bytes: float
    bus_bandwidth_gbs: float
    latency_us: float


@dataclass
class CollectiveFit:
    """time = latency + bus factor x bytes / bus bandwidth; `segments` (ascending) override the line
    from their min_bytes on, where one line cannot follow the measurements (profile-cluster)."""

    bus_bandwidth_gbs: float
    latency_us: float
    segments: list[CollectiveSegment] = field(default_factory=list)

    def line_for(self, message_bytes: float) -> tuple[float, float]:
        """(bus bandwidth GB/s, latency us) for one message of this size."""
        for seg in reversed(self.segments):
            if message_bytes >= seg.min_bytes:
                return seg.bus_bandwidth_gbs, seg.latency_us
        return self.bus_bandwidth_gbs, self.latency_us

    def scaled(self, bandwidth_scale: float) -> "CollectiveFit":
        """The same fit with every bandwidth multiplied by `bandwidth_scale` (calibration)."""
        return CollectiveFit(self.bus_bandwidth_gbs * bandwidth_scale, self.latency_us,
                             [replace(seg, bus_bandwidth_gbs=seg.bus_bandwidth_gbs * bandwidth_scale)
                              for seg in self.segments])


@dataclass
class Overheads:
    """Terms fitted to measurements rather than derived: how much of communication hides, and memory slack."""

    fsdp_overlap: float = 0.9  # share of the compute beside a data-parallel collective that it can hide under
    # How much slower compute runs while a hidden data-parallel collective shares the GPU with it (its
    # kernels take SMs and memory bandwidth): the step pays this times the hidden time
    # (estimate.DataParallelComm.contention). 0: free overlap.
    comm_compute_slowdown: float = 0.0
    tp_async_overlap: float = 0.21  # fraction of TP comm hidden by async TP (TorchTitan A/B, see built-ins)
    cp_overlap: float = 0.8
    memory_fragmentation: float = 0.05  # allocator slack on top of live tensors
    # The same slack where FSDP2 accumulates gradients under pipelining (cost_models/memory.py,
    # pp_accumulates); None: memory_fragmentation.
    pp_memory_fragmentation: float | None = None
    context_gib: float = 1.0  # CUDA context, NCCL buffers and workspace per rank
    step_overhead_s: float = 0.0  # per-step fixed cost (launch, optimizer sync)
    kernel_efficiency: float = 1.0  # multiplier on compute throughput (e.g. torch.compile fusion)
    compile_speedup: float = 1.1  # memory-bound work shrinks by this factor with torch.compile
    # Host-side costs of eager PyTorch, priced per op or call the runtime issues (cost_models/host.py counts
    # them). 0 means hidden: on GPUs the host runs ahead of the kernels; on CPUs the host is the device.
    op_dispatch_s: float = 0.0  # every op: Python binding, dispatcher, autograd bookkeeping, launch
    python_dispatch_s: float = 0.0  # extra per op through DTensor's Python __torch_dispatch__
    collective_sync_s: float = 0.0  # per collective / p2p call: waiting for the group, beyond benchmarked latency
    # Per forward op of a checkpointed block: the AC wrapper's hooks and replay, and a selective policy's
    # dispatch mode on top. None (profiles measured before these were): estimated from the costs above
    # (cost_models/host.py).
    checkpoint_op_s: float | None = None
    sac_op_s: float | None = None
    # Per op of an MoE layer's own work (router, top-k, sort, the grouped GEMMs, the combine, the aux loss),
    # forward and backward: its Python between ops (custom autograd functions, the routing's bookkeeping)
    # and, on CUDA, the host paths of sort and grouped GEMM (benchmarks/host_costs.py measures it). None:
    # op_dispatch_s times the ratio measured on the runtime (cost_models/host.py MOE_OP_COST_RATIO).
    moe_op_s: float | None = None
    # Per pipeline action (one stage's forward, backward or weight pass of one micro-batch): the schedule's
    # Python, and its sends and receives waited in line; PyTorch runs one stage per rank (GPipe, 1F1B) and
    # several (the looped and V-shaped schedules) on different runtimes, which cost differently.
    pipeline_action_s: float = 0.0
    pipeline_multi_action_s: float = 0.0
    # Per local expert of an MoE layer's forward, where the stack runs its experts eager behind a
    # device-to-host sync in every MoE layer (Layout.moe_host_sync: Megatron-Core's dropless dispatchers
    # before its sync-free, fully graphed recipes): the host work of Transformer Engine's per-expert GEMM
    # launches, quantisations and allocations, which the GPU waits for (timing._add_moe_host).
    moe_expert_host_s: float = 0.0


@dataclass
class ClusterProfile:
    name: str
    device: Device
    devices_per_node: int
    max_nodes: int
    links: list[LinkLevel]
    collectives: dict[str, dict[str, CollectiveFit]]
    overheads: Overheads = field(default_factory=Overheads)
    provenance: dict[str, Any] = field(default_factory=dict)
    collective_points: list[dict[str, Any]] = field(default_factory=list)
    description: str = ""

    def link(self, name: str) -> LinkLevel:
        for level in self.links:
            if level.name == name:
                return level
        raise KeyError(name)

    def node_level(self) -> str:
        level = self.__dict__.get("_node_level")
        if level is None:
            level = self.__dict__["_node_level"] = next(l.name for l in self.links if l.scope == "node")
        return level

    def cluster_level(self) -> str:
        level = self.__dict__.get("_cluster_level")
        if level is None:
            level = next((l.name for l in self.links if l.scope == "cluster"), self.node_level())
            self.__dict__["_cluster_level"] = level
        return level

    def supports_float8(self) -> bool:
        return "fp8" in self.device.peak_tflops

    def with_network_per_device(self, gbs: float) -> "ClusterProfile":
        """The same cluster on another network: its cluster-level link at `gbs` GB/s per device, and that
        level's collectives scaled by the same ratio (the profile's collective-to-link efficiency kept). For
        a published run whose page states its own network."""
        level = self.cluster_level()
        ratio = gbs / self.link(level).bandwidth_gbs
        links = [replace(l, bandwidth_gbs=gbs) if l.name == level else l for l in self.links]
        collectives = {**self.collectives, level: {c: fit.scaled(ratio) for c, fit in self.collectives[level].items()}}
        return replace(self, links=links, collectives=collectives)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fraction(value: Any, field_name: str) -> float:
    v = as_float(value, field_name, 0.0, exclusive_min=True)
    if v > 1.0:
        raise InputError(field_name, f"must be a fraction in (0, 1], got {v}")
    return v


def _segments(raw: Any, where: str) -> list[CollectiveSegment]:
    if not isinstance(raw, list):
        raise InputError(where, "must be a list of {min_bytes, bus_bandwidth_gbs, latency_us}")
    out = []
    for i, item in enumerate(raw):
        f = f"{where}[{i}]"
        item = require_mapping(item, f)
        reject_unknown(item, ("min_bytes", "bus_bandwidth_gbs", "latency_us"), f)
        out.append(CollectiveSegment(as_float(item.get("min_bytes"), f"{f}.min_bytes", 0.0),
                                     as_float(item.get("bus_bandwidth_gbs"), f"{f}.bus_bandwidth_gbs", 0.0, True),
                                     as_float(item.get("latency_us", 0.0), f"{f}.latency_us", 0.0)))
        if i and out[-1].min_bytes <= out[-2].min_bytes:
            raise InputError(f"{f}.min_bytes", "segments must be in ascending min_bytes")
    return out


def profile_from_dict(data: Any, where: str = "profile") -> ClusterProfile:
    data = require_mapping(data, where)
    reject_unknown(data, ClusterProfile.__dataclass_fields__, where)
    for key in ("name", "device", "devices_per_node", "links", "collectives"):
        if key not in data:
            raise InputError(f"{where}.{key}", "is required")
    device = _device(data["device"], f"{where}.device")
    links = data["links"]
    if not isinstance(links, list) or not links:
        raise InputError(f"{where}.links", "must be a non-empty list of link levels")
    levels = [_link(l, f"{where}.links[{i}]") for i, l in enumerate(links)]
    if not any(l.scope == "node" for l in levels):
        raise InputError(f"{where}.links", "needs one level with scope: node")
    names = [l.name for l in levels]
    colls = require_mapping(data["collectives"], f"{where}.collectives")
    collectives: dict[str, dict[str, CollectiveFit]] = {}
    for level, table in colls.items():
        if level not in names:
            raise InputError(f"{where}.collectives.{level}", f"unknown link level; valid: {', '.join(names)}")
        table = require_mapping(table, f"{where}.collectives.{level}")
        reject_unknown(table, COLLECTIVES, f"{where}.collectives.{level}")
        collectives[level] = {}
        for coll, fit in table.items():
            f = f"{where}.collectives.{level}.{coll}"
            fit = require_mapping(fit, f)
            reject_unknown(fit, ("bus_bandwidth_gbs", "latency_us", "segments"), f)
            collectives[level][coll] = CollectiveFit(
                bus_bandwidth_gbs=as_float(fit.get("bus_bandwidth_gbs"), f"{f}.bus_bandwidth_gbs", 0.0, True),
                latency_us=as_float(fit.get("latency_us", 0.0), f"{f}.latency_us", 0.0),
                segments=_segments(fit.get("segments", []), f"{f}.segments"),
            )
    for level in names:
        missing = [c for c in COLLECTIVES if c not in collectives.get(level, {})]
        if missing:
            raise InputError(f"{where}.collectives.{level}", f"missing {', '.join(missing)}")
    overheads = _overheads(data.get("overheads", {}), f"{where}.overheads")
    return ClusterProfile(
        name=as_str(data["name"], f"{where}.name"),
        device=device,
        devices_per_node=as_int(data["devices_per_node"], f"{where}.devices_per_node", 1),
        max_nodes=as_int(data.get("max_nodes", 4096), f"{where}.max_nodes", 1),
        links=levels,
        collectives=collectives,
        overheads=overheads,
        provenance=dict(require_mapping(data.get("provenance", {}) or {}, f"{where}.provenance")),
        collective_points=_points(data.get("collective_points"), f"{where}.collective_points", ()),
        description=str(data.get("description", "")),
    )


def _device(raw: Any, where: str) -> Device:
    raw = require_mapping(raw, where)
    reject_unknown(raw, Device.__dataclass_fields__, where)
    for key in ("name", "memory_gib", "peak_tflops", "memory_bandwidth_gbs", "matmul", "attention"):
        if key not in raw:
            raise InputError(f"{where}.{key}", "is required")
    peaks = require_mapping(raw["peak_tflops"], f"{where}.peak_tflops")
    reject_unknown(peaks, PROFILE_DTYPES, f"{where}.peak_tflops")
    peak = {k: as_float(v, f"{where}.peak_tflops.{k}", 0.0, True) for k, v in peaks.items()}
    if "bf16" not in peak and "fp32" not in peak:
        raise InputError(f"{where}.peak_tflops", "needs bf16 or fp32")
    mm = require_mapping(raw["matmul"], f"{where}.matmul")
    reject_unknown(mm, MatmulModel.__dataclass_fields__, f"{where}.matmul")
    mm_frac = require_mapping(mm.get("max_fraction"), f"{where}.matmul.max_fraction")
    matmul = MatmulModel(
        max_fraction={k: _fraction(v, f"{where}.matmul.max_fraction.{k}") for k, v in mm_frac.items()},
        half_dim=as_float(mm.get("half_dim", 96.0), f"{where}.matmul.half_dim", 0.0),
        points=_points(mm.get("points"), f"{where}.matmul.points", ("m", "n", "k")),
        grouped_points=_points(mm.get("grouped_points"), f"{where}.matmul.grouped_points", ("groups", "m", "n", "k")),
    )
    at = require_mapping(raw["attention"], f"{where}.attention")
    reject_unknown(at, AttentionModel.__dataclass_fields__, f"{where}.attention")
    attention = AttentionModel(
        max_fraction=_fraction(at.get("max_fraction"), f"{where}.attention.max_fraction"),
        half_seq=as_float(at.get("half_seq", 1024.0), f"{where}.attention.half_seq", 0.0),
        backward_ratio=_fraction(at.get("backward_ratio", 0.75), f"{where}.attention.backward_ratio"),
        points=_points(at.get("points"), f"{where}.attention.points", ("seq_len",)),
        flops_per_exp=(None if at.get("flops_per_exp") is None
                       else as_float(at["flops_per_exp"], f"{where}.attention.flops_per_exp", 0.0, True)),
    )
    memory = as_float(raw["memory_gib"], f"{where}.memory_gib", 0.0, True)
    usable = as_float(raw.get("usable_memory_gib", memory), f"{where}.usable_memory_gib", 0.0, True)
    if usable > memory:
        raise InputError(f"{where}.usable_memory_gib", f"must be <= memory_gib ({memory}), got {usable}")
    return Device(
        name=as_str(raw["name"], f"{where}.name"),
        memory_gib=memory,
        usable_memory_gib=usable,
        peak_tflops=peak,
        memory_bandwidth_gbs=as_float(raw["memory_bandwidth_gbs"], f"{where}.memory_bandwidth_gbs", 0.0, True),
        matmul=matmul,
        attention=attention,
        memory_bound_efficiency=_fraction(raw.get("memory_bound_efficiency", 0.7), f"{where}.memory_bound_efficiency"),
        sustained_fraction=_fraction(raw.get("sustained_fraction", 1.0), f"{where}.sustained_fraction"),
        host_link_gbs=(None if raw.get("host_link_gbs") is None
                       else as_float(raw["host_link_gbs"], f"{where}.host_link_gbs", 0.0, True)),
    )


def _link(raw: Any, where: str) -> LinkLevel:
    raw = require_mapping(raw, where)
    reject_unknown(raw, LinkLevel.__dataclass_fields__, where)
    scope = raw.get("scope")
    if scope not in ("node", "cluster"):
        raise InputError(f"{where}.scope", f"must be one of node | cluster, got {scope!r}")
    return LinkLevel(
        name=as_str(raw.get("name"), f"{where}.name"),
        scope=scope,
        bandwidth_gbs=as_float(raw.get("bandwidth_gbs"), f"{where}.bandwidth_gbs", 0.0, True),
        latency_us=as_float(raw.get("latency_us", 0.0), f"{where}.latency_us", 0.0),
    )


def _overheads(raw: Any, where: str) -> Overheads:
    raw = require_mapping(raw or {}, where)
    reject_unknown(raw, Overheads.__dataclass_fields__, where)
    d = Overheads()
    values = {}
    for key in Overheads.__dataclass_fields__:
        v = raw.get(key, getattr(d, key))
        values[key] = None if v is None and getattr(d, key) is None else as_float(v, f"{where}.{key}", 0.0)
    for key in ("fsdp_overlap", "tp_async_overlap", "cp_overlap"):
        if values[key] > 1:
            raise InputError(f"{where}.{key}", f"must be a fraction in [0, 1], got {values[key]}")
    return Overheads(**values)


def _points(value: Any, where: str, shape_keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Measured points: a list of mappings, each with its shape keys and a positive `tflops` where the
    kind has them (matmul m, n, k; attention seq_len); absent or null means none."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(where, f"must be a list of measured points, got {value!r}")
    out = []
    for i, item in enumerate(value):
        item = require_mapping(item, f"{where}[{i}]")
        for key in shape_keys:
            if key not in item:
                raise InputError(f"{where}[{i}].{key}", "is required")
            as_float(item[key], f"{where}[{i}].{key}", 0.0, True)
        if shape_keys:
            as_float(item.get("tflops"), f"{where}[{i}].tflops", 0.0, True)
        out.append(dict(item))
    return out
