"""The rules of a runnable plan, each in one place: which knob combinations PyTorch cannot run
(the planner prunes them and counts the reason, a plan naming one is refused in one line, `run`
checks again before launch) and what the runtime can run on each backend (the planner offers,
the estimate prices and `run` refuses by the same functions). Pure Python: the cost model may
import it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshplan.errors import InputError
from meshplan.fields import AUTO

if TYPE_CHECKING:  # plan.py checks these rules when it loads a plan
    from meshplan.specs.model import ModelSpec
    from meshplan.specs.plan import Plan

NCCL, GLOO = "nccl", "gloo"
# The software stacks a plan can be priced for (plan field `stack`; what each runs differently is
# cost_models/stacks.py). meshplan's own runtime is the default, and the only one `run` executes.
MESHPLAN, TORCHTITAN, MEGATRON_CORE = "meshplan", "torchtitan", "megatron-core"
STACKS = (MESHPLAN, TORCHTITAN, MEGATRON_CORE)
BACKENDS = (NCCL, GLOO)
RING, GATHER = "ring", "gather"


def backend_for_device(device_type: str) -> str:
    """The process-group backend the runtime uses on a device type (worker.pick_device)."""
    return NCCL if device_type == "cuda" else GLOO


def cp_attention_kind(backend: str) -> str:
    """How context-parallel attention runs: PyTorch's ring attention (context_parallel's SDPA
    dispatch) on NCCL/CUDA; on gloo/CPU, which PyTorch's ring does not support, meshplan's
    all-gather of K/V with block-causal chunked attention (runtime/context_parallel.py)."""
    return RING if backend == NCCL else GATHER


# The gather path's query/key tile: scores are (heads x tile x tile) whatever the sequence length.
CP_GATHER_TILE = 256


def cp_gather_tiles(seq_len: int, cp: int) -> tuple[int, int]:
    """(visible, diagonal) query-tile x key-tile pairs the gather path computes on each CP rank. A rank
    holds chunks r and 2cp-1-r of 2cp, each cut into t tiles; the query tile at global tile index g sees
    the g tiles before it and its own (the diagonal, causally masked): summed over the rank's tiles,
    (2cp-1) t^2 + t(t+1), the same on every rank."""
    t = -(-(seq_len // (2 * cp)) // CP_GATHER_TILE)
    return (2 * cp - 1) * t * t + t * (t + 1), 2 * t


FUSED, COMPOSITE = "fused", "composite"


def rms_norm_kernel(backend: str) -> str:
    """How nn.RMSNorm runs: PyTorch's fused kernel on CUDA (it keeps the input and one fp32 scale per
    token for backward); on CPU its composite, which in bf16 upcasts and keeps the fp32 input copy
    and the fp32 normalised output (both seen with saved-tensor hooks on torch 2.13)."""
    return FUSED if backend == NCCL else COMPOSITE


def cp_kv_repeated(kind: str) -> bool:
    """Whether K/V reach CP attention expanded to every query head. The ring path expands them:
    under DTensor's SDPA dispatch the kernel is chosen on global shapes, and only some kernels
    take grouped K/V; the gather path keeps them grouped (SDPA's enable_gqa)."""
    return kind == RING


def uses_fully_shard(fsdp_size: int, dp_replicate: int, dtype: str) -> bool:
    """Whether the runtime wraps the model in FSDP2's fully_shard (runtime/data_parallel.py): where it
    shards (dp_shard * cp > 1), and for a bf16 plan without data parallelism, which gets a one-rank
    fully_shard for its mixed precision. Elsewhere (DDP, or fp32 on one rank) nothing is resharded."""
    return fsdp_size > 1 or (dp_replicate == 1 and dtype != "fp32")


def normalise_moot_fields(plan: Plan) -> list[str]:
    """Set the fields of a complete plan that its layout makes moot to their neutral value, which
    `estimate` and `run` then use; one line per change, for them to say."""
    p, mem = plan.parallel, plan.memory
    notes = []
    if mem.reshard_after_forward is True and not uses_fully_shard(p.dp_shard * p.cp, p.dp_replicate,
                                                                  str(plan.training.dtype)):
        mem.reshard_after_forward = False
        notes.append("memory.reshard_after_forward: true has no effect without FSDP (dp_shard*cp = 1 and DDP or "
                     "fp32): run and estimated as false")
    if plan.compile is True and plan.stack == MEGATRON_CORE:
        plan.compile = False
        notes.append("compile: true has no effect under stack megatron-core, which does not torch.compile its model "
                     "(its fused kernels are priced either way): estimated as false")
    return notes


def async_tp_reason(tp: int, compile_: bool, backend: str) -> str | None:
    """Why async TP cannot run, or None. It is an inductor pass (torch._inductor.config.
    _micro_pipeline_tp) over symmetric-memory collectives, which exist only on NCCL/CUDA."""
    if tp <= 1:
        return None  # moot: no TP collectives to overlap (the estimate ignores it too)
    if backend != NCCL:
        return f"needs CUDA/NCCL (symmetric memory); this backend is {backend}"
    if not compile_:
        return "needs compile: true (async TP is a torch.compile pass)"
    return None


def mesh_order_reason(order: list[str] | tuple[str, ...] | None) -> str | None:
    """Why the runtime cannot build the device mesh in this order, or None. HSDP's 2-D mesh is
    (replicate, shard), so dp_replicate must be outside dp_shard."""
    if order is None:
        return None
    from meshplan.specs.plan import MESH_DIMS

    if sorted(order) != sorted(MESH_DIMS):
        return f"must list each of {', '.join(MESH_DIMS)} once"
    if list(order).index("dp_replicate") > list(order).index("dp_shard"):
        return "must put dp_replicate outside (before) dp_shard: HSDP's mesh is (replicate, shard)"
    return None


def unsupported_fields(plan: Plan, backend: str) -> list[tuple[str, str]]:
    """(field, reason) for every field of a complete plan the runtime cannot honour on `backend`."""
    out: list[tuple[str, str]] = []
    p = plan.parallel
    why = model_runs_reason(plan.model)
    if why:
        out.append(("model", why))
    if p.async_tp:
        why = async_tp_reason(int(p.tp), bool(plan.compile), backend)
        if why:
            out.append(("parallel.async_tp", why))
    why = mesh_order_reason(plan.mesh_order)
    if why:
        out.append(("mesh_order", why))
    why = moe_tp_reason(plan.model.is_moe, int(p.ep), int(p.tp), bool(p.sequence_parallel))
    if why:
        out.append(("parallel.ep", why))
    why = moe_schedule_reason(plan.model.is_moe, int(p.pp), str(p.pp_schedule))
    if why:
        out.append(("parallel.pp_schedule", why))
    why = mla_reason(plan.model.mla is not None, int(p.tp), int(p.cp))
    if why:
        out.append(("parallel.tp" if p.tp > 1 else "parallel.cp", why))
    why = float8_tp_reason(bool(plan.memory.float8), int(p.tp), backend)
    if why:
        out.append(("memory.float8", why))
    why = compile_reason(bool(plan.compile), int(p.tp), int(p.cp), str(plan.memory.activation_checkpointing), backend,
                         plan.model.is_moe)
    if why:
        out.append(("compile", why))
    return out


COMPILE_UNTRACEABLE = "compiled blocks that do not trace (TP or CP on gloo, MoE)"


def compile_reason(compile_: bool, tp: int, cp: int, ac: str, backend: str, moe: bool = False) -> str | None:
    """Why blocks of this layout cannot run compiled, or None. A compiled block must run as its
    compiled graph or be refused: never eager while priced compiled. Measured on 2 gloo ranks
    (torch 2.13, tiny-4l, tests/runtime/test_compile.py):
    - TP blocks: with AC none their backward fails inside DTensor ("'Tensor' object has no attribute
      '_local_tensor'"), with SP and selective AC likewise, and with full AC AOTAutograd saves the
      DeviceMesh for backward as if it were a tensor ("expected all tensors_saved_with_vc_check to
      be Tensors"). On CUDA these are not seen, so it is not refused there.
    - CP blocks: the gather path (gloo's, rules.cp_attention_kind) loops over tiles with gloo
      collectives inside an autograd.Function, which Dynamo does not trace: the block would fall
      back to eager whole.
    - MoE blocks (`moe`: the model has MoE layers), on every backend: the token dispatch's splits are
      data-dependent (a host read) and the grouped GEMM's compiled form takes bf16 only, so Dynamo breaks
      the block's graph ("Dynamic shape operator", 2 graphs and no compiled region on tiny-moe with EP 2,
      selective AC) or fails to trace it (fp32; a DTensor expert weight).
    `ac` is kept in the signature because the failures above were each seen per AC mode."""
    if compile_ and moe:
        return "with mixture-of-experts layers: the runtime's token dispatch does not trace, so blocks would run eager; use compile: false"
    if not compile_ or backend != GLOO:
        return None
    if tp > 1:
        return (f"with tp > 1 fails on gloo (DTensor's backward in compiled TP blocks, activation_checkpointing {ac}); "
                "use compile: false")
    if cp > 1 and cp_attention_kind(backend) == GATHER:
        return "with cp > 1 on gloo: the gather path's attention does not trace, so blocks would run eager; use compile: false"
    return None


def check_backend_rules(plan: Plan, backend: str) -> None:
    """One-line error for a complete plan the planner would not emit on `backend` (a profile's):
    compiled blocks that cannot compile there, pruned from the search under COMPILE_UNTRACEABLE. Compiled
    MoE blocks are meshplan's runtime's limit: a plan priced as another stack runs them keeps them."""
    p = plan.parallel
    why = compile_reason(bool(plan.compile), int(p.tp), int(p.cp), str(plan.memory.activation_checkpointing), backend,
                         plan.model.is_moe and plan.stack == MESHPLAN)
    if why:
        raise InputError("compile", f"true cannot run on {backend}: {why}")


def float8_tp_reason(float8: bool, tp: int, backend: str) -> str | None:
    """Why float8 cannot run with TP on this backend, or None: float8 TP sends float8 tensors
    through the TP collectives, and gloo has no float8 dtype ("Invalid scalar type", then a hang)."""
    if float8 and tp > 1 and backend == GLOO:
        return "with tp > 1 needs CUDA/NCCL: gloo's collectives have no float8 dtype"
    return None


FLOAT8_MIN_CAPABILITY = (8, 9)  # torchao float8 training: fp8 tensor cores (Ada, Hopper, Blackwell)


def float8_device_reason(float8: bool, device_type: str, capability: tuple[int, int] | None) -> str | None:
    """Why float8 cannot run on this device, or None. On CUDA it needs compute capability 8.9 or later;
    on a CPU the runtime emulates it (torchao's emulate=True: float8 numerics, not its speed)."""
    if float8 and device_type == "cuda" and capability is not None and tuple(capability) < FLOAT8_MIN_CAPABILITY:
        return (f"true needs fp8 tensor cores (compute capability 8.9 or later); this GPU is "
                f"{capability[0]}.{capability[1]}; set false")
    return None


def model_runs_reason(spec: ModelSpec) -> str | None:
    """Why the runtime cannot build this model yet, or None. It builds GQA attention of any head width (with
    Qwen3's per-head q/k norms) and DeepSeek's MLA (runtime/mla.py), each with a dense or mixture-of-experts
    MLP (runtime/moe.py), under plain RoPE; sliding windows, attention biases, sinks or YaRN's scaling would
    run as something else. The cost model prices them all (plan and estimate take them); `run` refuses them
    in one line."""
    if spec.runtime_attention:
        return None
    return (f"{spec.name}'s attention (sliding windows, biases, sinks or YaRN's RoPE scaling) is planned and priced "
            "but not yet built by the runtime; use a model with GQA or MLA attention and plain RoPE to run")


def moe_schedule_reason(moe: bool, pp: int, schedule: str) -> str | None:
    """Why an MoE model cannot run this pipeline schedule, or None. The split-backward schedules (PyTorch's
    zero-bubble ones) take input and weight gradients in two autograd passes; through the MoE layer's
    all-to-all and aux-loss hooks that gives other losses than one process (4e-3 relative by step 5 on
    tiny-moe, EP 2 x PP 2 InterleavedZeroBubble, where the other schedules agree to 1e-7)."""
    if moe and pp > 1 and schedule in SPLIT_BACKWARD_SCHEDULES:
        return (f"{schedule} splits backward into input and weight passes, which the runtime's MoE layers do not "
                f"run correctly yet; use a schedule other than {', '.join(SPLIT_BACKWARD_SCHEDULES)}")
    return None


def mla_reason(mla: bool, tp: int, cp: int) -> str | None:
    """Why the runtime cannot run MLA (runtime/mla.py) in this layout, or None: it builds it without TP (its
    latent projections and norms would be replicated DTensors, not built) and without CP (both CP paths
    take keys and values of one head width; MLA's differ)."""
    if mla and (tp > 1 or cp > 1):
        return ("with MLA attention the runtime runs tp = cp = 1 (its latent projections are not TP-sharded, "
                "and CP's attention takes one head width for keys and values)")
    return None


def moe_tp_reason(moe: bool, ep: int, tp: int, sp: bool) -> str | None:
    """Why the runtime cannot run an MoE model's layers with this TP, or None. It runs TorchTitan's expert-TP
    1 (runtime/tensor_parallel.moe_tp_plan): each TP rank routes its own sequence-parallel chunk of the
    tokens and EP, folding TP, takes them to whole experts. Experts TP-sharded like a dense MLP (ep = 1) or
    TP ranks routing the same tokens (no SP) are priced (cost_models/moe.py) but not built."""
    if not moe or tp == 1:
        return None
    if not sp or ep == 1:
        return (f"with tp {tp} an MoE model runs with sequence_parallel: true and expert parallelism folding tp "
                f"(ep a multiple of {tp}), got sequence_parallel {str(sp).lower()}, ep {ep}")
    return None


EP_FOLDING = "expert parallelism that does not fold into dp_shard x cp x tp or divide the experts"


def ep_reason(spec: ModelSpec, ep: int, dp_shard: int, cp: int, tp: int) -> str | None:
    """Why `ep` cannot shard this model's routed experts on this mesh, or None. TorchTitan's folding
    (ParallelDims, expert-TP 1): the `ep` mesh dimension is made of all of tp and cp and the inner
    ep / (cp*tp) of dp_shard, so ep must be a multiple of cp*tp and divide dp_shard*cp*tp; the routed
    experts are Shard(0) over it, so ep must divide their count; what is left of dp_shard*cp*tp
    (ep_fsdp) FSDP-shards them. With ep = 1 the experts are TP-sharded like the dense MLP."""
    if ep == 1:
        return None
    if spec.moe is None:
        return f"must be 1 for {spec.name}, a dense model (no experts to shard), got {ep}"
    if spec.moe.experts % ep:
        return f"must divide the routed experts ({spec.moe.experts}), got {ep}"
    if ep % (cp * tp) or (dp_shard * cp * tp) % ep:
        return (f"must be a multiple of cp*tp ({cp * tp}) dividing dp_shard*cp*tp ({dp_shard * cp * tp}): "
                f"EP folds into the data, context and tensor dimensions, got {ep}")
    return None


GROUPED_MM_MIN_CAPABILITY = (9, 0)  # Hopper's grouped GEMM kernels: torch._grouped_mm's bf16 path on CUDA


def grouped_mm_kernel(device_type: str, dtype: str, capability: tuple[int, int] | None) -> bool:
    """Whether the routed experts run as one torch._grouped_mm (the runtime's GroupedExperts, and what
    profile-cluster times): on a CPU in any float dtype; on CUDA in bf16 from compute capability 9.0.
    Elsewhere the runtime loops over the experts, one matmul each."""
    if device_type == "cpu":
        return True
    return device_type == "cuda" and dtype == "bf16" and capability is not None \
        and tuple(capability) >= GROUPED_MM_MIN_CAPABILITY


def ep_fsdp(ep: int, dp_shard: int, cp: int, tp: int) -> int:
    """Ranks the routed experts are FSDP-sharded over (TorchTitan's efsdp): the rest of dp_shard x cp x tp
    once EP has taken its part; with ep = 1 the experts are TP-sharded and FSDP shards over dp_shard x cp."""
    return dp_shard * cp if ep == 1 else dp_shard * cp * tp // ep


def expert_tp(ep: int, tp: int) -> int:
    """TP degree inside each routed expert: the dense MLP's with ep = 1, none (expert-TP 1) under EP."""
    return tp if ep == 1 else 1


def loss_compiled(compile_: bool, tp: int) -> bool:
    """Whether the runtime compiles the loss (the fp32 upcast and cross-entropy) with the blocks, as
    TorchTitan's compile.components ["model", "loss"] does. Inductor fuses the upcast, log-softmax and
    their backward into reductions and one pointwise pass: measured on CPU (torch 2.13) the loss holds
    the logits and their gradient, 2 x 2 bytes per bf16 logit, where eager holds 14 (the fp32 log-softmax
    and its incoming and outgoing fp32 gradients; tests/runtime/test_saved_activations.py). Under TP the
    logits are vocab-sharded DTensors and loss parallel's cross-entropy runs eager."""
    return compile_ and tp == 1


FLOAT8_UNCOMPILED = "float8 without compile on a GPU"


def float8_compile_reason(float8: bool, compile_: bool, stack: str = MESHPLAN) -> str | None:
    """Why float8 may not run uncompiled on a GPU, or None. Without compile torchao's dynamic-scaling
    casts (amax, scale, cast, transpose per operand of every matmul) run as separate kernels and
    through a tensor subclass's Python dispatch: slower than bf16, not faster. Measured: llama3.2-3b
    on one H200, eager float8 1.689 s/step against eager bf16 0.875 s and compiled float8 0.633 s
    (benchmarks/results/gpu_truth-NVIDIA_H200-2026-11-26-3b-*.md); torchao's own report, an FFN on an
    L20, eager float8 1.1-3.4x slower than fp16 (pytorch/ao#685). A CPU's emulated float8 is for
    numerics only and is not refused (float8_device_reason). Megatron-Core's float8 is Transformer
    Engine's, whose modules quantize in their own fused kernels without torch.compile: not refused there."""
    if float8 and not compile_ and stack != MEGATRON_CORE:
        return ("true needs compile: true on a GPU: uncompiled, torchao's float8 casts run unfused and the "
                "step is slower than bf16 (measured 1.9x on H200); set compile: true or float8: false")
    return None


def profile_backend(provenance: dict[str, Any] | None) -> str:
    """The backend a cluster profile describes: the one its benchmark world recorded
    (profile-cluster writes provenance.world.backend); built-in GPU profiles record none: NCCL."""
    world = (provenance or {}).get("world")
    backend = world.get("backend") if isinstance(world, dict) else None
    return backend if backend in BACKENDS else NCCL


# Schedules whose backward is two passes (torch.distributed.pipelining's I and W actions): input
# gradients first, with the graph retained, weight gradients later.
SPLIT_BACKWARD_SCHEDULES = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")

SAC_SPLIT_BACKWARD = "selective AC with a split-backward (zero-bubble) schedule"


def ac_schedule_reason(pp: int, schedule: str, ac: str) -> str | None:
    """Selective AC under a split-backward schedule: the input-gradient and the weight-gradient pass
    are separate autograd calls, so a checkpointed block is recomputed once for each; PyTorch's
    selective-checkpoint cache hands out each saved tensor once ("Trying to backward an extra time").
    Full AC recomputes the whole block each time and runs. TorchTitan runs its zero-bubble
    schedules with full AC for the same reason."""
    if pp > 1 and ac == "selective" and schedule in SPLIT_BACKWARD_SCHEDULES:
        return SAC_SPLIT_BACKWARD
    return None


def check_runtime_rules(plan: Plan) -> None:
    """One-line error for a rule the plan breaks; fields still 'auto' are left to the planner."""
    p, mem = plan.parallel, plan.memory
    if AUTO in (p.pp, p.pp_schedule, mem.activation_checkpointing):
        return
    if ac_schedule_reason(p.pp, p.pp_schedule, mem.activation_checkpointing):
        raise InputError("memory.activation_checkpointing",
                         f"selective does not run with pp_schedule {p.pp_schedule}, which splits backward into "
                         "input- and weight-gradient passes that each recompute a checkpointed block (PyTorch's "
                         "selective-checkpoint cache serves a saved tensor once); use full or none, or a schedule "
                         f"other than {', '.join(SPLIT_BACKWARD_SCHEDULES)}")


def stack_reason(stack: str, command: str) -> str | None:
    """Why `meshplan <command>` (run, or a search: plan, or estimate filling 'auto' fields) cannot take a
    plan of another stack, or None: both cover meshplan's own runtime, whose layouts the search builds;
    `estimate` prices a complete plan on any stack."""
    if stack == MESHPLAN:
        return None
    return (f"must be {MESHPLAN} for `meshplan {command}`, which covers meshplan's own runtime, got {stack}; "
            f"`meshplan estimate` prices a complete plan (no 'auto' field) on {stack}")


# How a plan's MoE dispatch and combine cross nodes (parallel.ep_dispatch; Layout.ep_dispatch): NCCL's
# all-to-all, or DeepEP's normal kernels, which Megatron-Core's flex dispatcher runs (its deepep backend);
# meshplan's runtime and TorchTitan's plans here send all-to-alls.
EP_DISPATCHERS = ("all_to_all", "deepep")
DEEPEP_STACKS = (MEGATRON_CORE,)


def ep_dispatch_reason(stack: str, dispatch: str, ep) -> str | None:
    """Why a plan cannot dispatch its tokens with `dispatch`, or None (`ep` may still be 'auto')."""
    if dispatch == "all_to_all":
        return None
    if stack not in DEEPEP_STACKS:
        return (f"must be all_to_all on stack {stack}, which sends NCCL all-to-alls, got {dispatch}; "
                f"stack {MEGATRON_CORE} runs DeepEP (moe_token_dispatcher_type flex, backend deepep)")
    if ep == 1:
        return f"{dispatch} applies only with ep > 1, which dispatches tokens to their experts' ranks, got ep 1"
    return None


# Megatron-Core's EP overlap (overlap_moe_expert_parallel_comm, with delay_wgrad_compute): one micro-batch's
# forward merged with another's backward, layer by layer, each all-to-all on its own stream under the other's
# compute (timing.ep_exposed). meshplan's runtime and TorchTitan issue the all-to-alls in line. Megatron-Core
# asserts the rest (transformer_config.py, Megatron-LM d98e8a6): virtual stages under a pipeline, no full
# recompute, bf16 or fp16 weights, at most one MTP module.
EP_OVERLAP_STACKS = (MEGATRON_CORE,)


def ep_overlap_reason(stack: str, ep, pp, v, ac, dtype, mtp_layers: int) -> str | None:
    """Why a plan cannot overlap its all-to-alls (parallel.ep_overlap), or None; fields still 'auto' pass."""
    if stack not in EP_OVERLAP_STACKS:
        return (f"applies only on stack {MEGATRON_CORE} (overlap_moe_expert_parallel_comm), got stack {stack}, "
                "which issues the all-to-alls in line")
    if ep == 1:
        return "applies only with ep > 1, which has all-to-alls to overlap, got ep 1"
    if pp not in (1, AUTO) and v == 1:
        return f"needs pp_virtual_stages > 1 with pp > 1 (Megatron-Core asserts it), got pp {pp} and 1 virtual stage"
    if ac == "full":
        return "does not run with activation_checkpointing: full (Megatron-Core asserts it)"
    if dtype == "fp32":
        return "needs training.dtype bf16 (Megatron-Core asserts bf16 or fp16), got fp32"
    if mtp_layers > 1:
        return f"runs with at most 1 MTP module (Megatron-Core asserts it), got training.mtp_layers {mtp_layers}"
    return None


# Megatron-Core's shared-expert overlap (moe_shared_expert_overlap): an MoE layer's shared experts on their own
# stream, their gate and up projections beside the dispatch all-to-all and their down projection beside the
# combine (token_dispatcher.py MoEAlltoAllTokenDispatcher, shared_experts.py SharedExpertMLP; timing.
# shared_expert_exposed). meshplan's runtime and TorchTitan run the shared experts in line. Megatron-Core
# refuses it beside EP overlap and with the shared experts recomputed (transformer_config.py, Megatron-LM d98e8a6).
SHARED_EXPERT_OVERLAP_STACKS = (MEGATRON_CORE,)


def shared_expert_overlap_reason(stack: str, shared_experts: int, ep, ep_overlap: bool,
                                 recompute_modules) -> str | None:
    """Why a plan cannot overlap its shared experts with its all-to-alls (parallel.shared_expert_overlap), or
    None; an ep still 'auto' passes."""
    if stack not in SHARED_EXPERT_OVERLAP_STACKS:
        return (f"applies only on stack {MEGATRON_CORE} (moe_shared_expert_overlap), got stack {stack}, "
                "which runs the shared experts in line")
    if not shared_experts:
        return "applies only to a model with shared experts (moe.shared_experts > 0), got none"
    if ep == 1:
        return "applies only with ep > 1, whose all-to-alls the shared experts run beside, got ep 1"
    if ep_overlap:
        return "cannot run with parallel.ep_overlap (Megatron-Core asserts it)"
    if recompute_modules and "shared_experts" in recompute_modules:
        return "cannot run with the shared_experts recompute module (Megatron-Core asserts it)"
    return None


# Stacks that train multi-token-prediction modules (training.mtp_layers): Megatron-Core's mtp_num_layers.
# meshplan's runtime builds none, and neither does TorchTitan's DeepSeek-V3.
MTP_STACKS = (MEGATRON_CORE,)


def mtp_reason(stack: str, mtp_layers: int) -> str | None:
    """Why a plan cannot train `mtp_layers` multi-token-prediction modules on `stack`, or None."""
    if mtp_layers == 0 or stack in MTP_STACKS:
        return None
    return (f"must be 0 on stack {stack}, which trains no multi-token-prediction modules, got {mtp_layers}; "
            f"stack {MEGATRON_CORE} runs them (mtp_num_layers)")


# Megatron-Core's cross-entropy (training.cross_entropy_fusion): none, its default (ModelParallelConfig.
# cross_entropy_loss_fusion False), or fused (--cross-entropy-loss-fusion) by its own kernel ("native",
# fused_vocab_parallel_cross_entropy, the default cross_entropy_fusion_impl) or Transformer Engine's ("te",
# which Megatron-Bridge's performance scripts set). The other stacks' losses are their own (Layout.loss_kernel).
CROSS_ENTROPY_FUSIONS = ("none", "native", "te")
CROSS_ENTROPY_STACKS = (MEGATRON_CORE,)


def megatron_core_only(stack: str, feature: str, instead: str) -> str:
    """The one line a field of Megatron-Core's alone says on another stack."""
    return f"applies only on stack {MEGATRON_CORE} ({feature}); stack {stack} {instead}: remove the field"


def cross_entropy_fusion_reason(stack: str, fusion: str | None) -> str | None:
    """Why a plan cannot name its cross-entropy kernel on `stack`, or None (not named: the stack's own)."""
    if fusion is None or stack in CROSS_ENTROPY_STACKS:
        return None
    return megatron_core_only(stack, "its cross_entropy_loss_fusion and cross_entropy_fusion_impl", "runs its own loss")


# Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer; OptimizerConfig exp_avg_dtype and
# exp_avg_sq_dtype, main_grads_dtype): AdamW's two moments and the main gradients each fp32 (the default) or bf16,
# as DeepSeek-V3's recipes keep them (memory.optimizer_state_dtype, memory.main_grads_dtype). The other stacks'
# optimizers (torch.optim's AdamW) keep fp32 states beside fp32 parameters.
OPTIMIZER_DTYPES = ("fp32", "bf16")
PRECISION_AWARE_STACKS = (MEGATRON_CORE,)


def precision_aware_reason(stack: str, state_dtype: str | None, grads_dtype: str | None) -> tuple[str, str] | None:
    """(field, why) a plan cannot keep its optimizer states or main gradients in that dtype on `stack`, or None."""
    if stack in PRECISION_AWARE_STACKS:
        return None
    for name, value in (("memory.optimizer_state_dtype", state_dtype), ("memory.main_grads_dtype", grads_dtype)):
        if value is not None:
            return name, megatron_core_only(stack, "its precision-aware optimizer",
                                            "keeps fp32 optimizer states and gradients")
    return None


# The dtype data-parallel gradients are reduced in (memory.grad_reduce_dtype; None: the stack's own).
# meshplan's runtime and TorchTitan reduce in fp32 under bf16: FSDP2's reduce_dtype as they set it (TorchTitan's
# training.mixed_precision_reduce "float32"). Megatron-Core reduces in the parameters' dtype: its
# DistributedDataParallelConfig.grad_reduce_in_fp32 is False by default (the grad buffer in param.dtype,
# param_and_grad_buffer.py), and Megatron-Bridge's performance scripts set it False for every model they run
# (v0.2.1 to v0.5.0), as the stack's other features follow those recipes (cost_models/stacks.py); Megatron-LM's
# own training script turns it on under bf16 with fp32 main gradients ("bfloat16 requires gradient accumulation
# and all-reduce to be done in fp32", arguments.py), which a plan names as fp32. bf16 halves the bytes each
# reduction sends and the buffers gradients accumulate in: FSDP2's MixedPrecisionPolicy reduce_dtype bf16
# (TorchTitan's mixed_precision_reduce "bfloat16", which "only takes effect when data_parallel_shard_degree > 1",
# through fully_shard), Megatron-Core's grad buffer in bf16 (--grad-reduce-in-bf16).
GRAD_REDUCE_DTYPES = ("fp32", "bf16")


def grad_reduce_dtype(stack: str, chosen: str | None, dtype: str) -> str:
    """The dtype a plan's data-parallel gradients are reduced in: the one it names, else its stack's own
    (Megatron-Core's is the parameters' dtype, the plan's training.dtype)."""
    if chosen is not None:
        return chosen
    return "bf16" if stack == MEGATRON_CORE and dtype == "bf16" else "fp32"


def grad_reduce_dtype_reason(stack: str, chosen: str | None, dtype: str, fsdp_size: int | None,
                             main_grads_dtype: str | None) -> str | None:
    """Why a plan cannot reduce its gradients in `chosen` (memory.grad_reduce_dtype), or None (it can, or names
    none). fsdp_size = dp_shard * cp, or None where a degree is still auto."""
    if chosen != "bf16":
        if stack == MEGATRON_CORE and chosen == "fp32" and main_grads_dtype == "bf16":
            return "fp32 needs fp32 main gradients (Megatron-LM asserts it): set memory.main_grads_dtype fp32 or drop this"
        return None
    if dtype == AUTO:  # the search may pick fp32, whose gradients cannot be reduced in bf16
        return "bf16 applies only with training.dtype bf16, and training.dtype is auto: set it to bf16"
    if dtype != "bf16":
        return f"bf16 applies only with training.dtype bf16 (an {dtype} plan's gradients are {dtype}): remove the field"
    if stack == TORCHTITAN and fsdp_size == 1:
        return ("bf16 applies on stack torchtitan only through fully_shard (its mixed_precision_reduce needs "
                "dp_shard * cp > 1): remove the field")
    return None


# Megatron-Core's fine-grained activation offloading (--fine-grained-activation-offloading --offload-modules;
# TransformerConfig.offload_modules): each named module's input goes to host memory after its forward and
# comes back before its backward (docs/user-guide/features/fine_grained_activation_offloading.md at d98e8a6).
# fused_group_mlp (the op fuser's whole grouped MLP) and gdp_qkv (a Mamba-style mixer) are not offered.
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
OFFLOAD_STACKS = (MEGATRON_CORE,)


def offload_modules_reason(stack: str, modules) -> str | None:
    """Why a plan cannot offload these modules' inputs on `stack`, or None (None or empty: nothing offloaded)."""
    if not modules:
        return None
    if stack not in OFFLOAD_STACKS:
        return megatron_core_only(stack, "its fine-grained activation offloading", "keeps its activations on the GPU")
    if "attn_proj" in modules and "core_attn" not in modules:
        return "attn_proj needs core_attn too (Megatron-Core asserts it: they share the attention's output)"
    return None


# Megatron-Core's selective recompute (recompute_granularity "selective", TransformerConfig.recompute_modules):
# the modules whose forward runs again in backward instead of keeping their outputs; its default is
# ["core_attn"]. The plan's memory.recompute_modules names them on stack megatron-core, where they take the
# place of memory.sac_ops (activations.megatron_recompute_drops, timing.megatron_recompute_time). "moe" (the whole
# MoE layer, its all-to-alls again) is not priced, so not accepted.
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act", "shared_experts")
MEGATRON_DEFAULT_RECOMPUTE = ("core_attn",)


def recompute_modules_reason(stack: str, ac: str, modules, sac_ops) -> tuple[str, str] | None:
    """(field, why) a plan's selective-recompute fields do not fit its stack, or None: recompute_modules is
    Megatron-Core's and needs selective AC; sac_ops (op kinds saved) is the other stacks'."""
    if modules is not None:
        if stack != MEGATRON_CORE:
            return ("memory.recompute_modules", f"applies only on stack {MEGATRON_CORE}, got stack {stack}; "
                                                "use memory.sac_ops")
        if ac not in ("selective", AUTO):
            return "memory.recompute_modules", f"applies only with activation_checkpointing: selective, got {ac}"
    if stack == MEGATRON_CORE and sac_ops not in (None, AUTO):
        return ("memory.sac_ops", f"does not apply on stack {MEGATRON_CORE}, which recomputes modules; "
                                  "use memory.recompute_modules")
    return None


def tied_embeddings_reason(tied: bool, tp: int, pp: int) -> str | None:
    """Why a model with tied embeddings cannot run in this layout, or None: the runtime ties the
    output projection to tok_embeddings.weight, which TP's vocab sharding and a pipeline cut split."""
    if tied and (tp > 1 or pp > 1):
        return "the runtime supports tied embeddings only with tp = pp = 1"
    return None


MICROBATCHES = "micro-batch count not accepted by the pipeline schedule"


def microbatch_rounds(pp: int, n_micro: int) -> int:
    """How many rounds PyTorch's interleaved schedules split the micro-batches into: n_micro // pp,
    at least one."""
    return max(1, n_micro // pp)


def microbatch_reason(schedule: str, pp: int, v: int, n_micro: int) -> str | None:
    """PyTorch's pipelining rules (torch.distributed.pipelining.schedules): interleaved schedules
    run whole rounds of min(n_micro, pp) micro-batches; V-shaped ones need at least one micro-batch
    per stage. Fewer micro-batches than stages is fine otherwise (run on gloo: Interleaved1F1B,
    InterleavedZeroBubble and LoopedBFS at pp 2, v 2 with 2 micro-batches train)."""
    from meshplan.specs.plan import V_SHAPED_SCHEDULES

    if pp == 1:
        return None
    if schedule in ("Interleaved1F1B", "InterleavedZeroBubble", "LoopedBFS") and v > 1:
        if n_micro % microbatch_rounds(pp, n_micro):
            return MICROBATCHES
    if schedule in V_SHAPED_SCHEDULES and n_micro < pp * v:
        return MICROBATCHES
    return None
