"""Time of one micro-batch through one block or the head, and of the per-step collectives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from meshplan.cost_models import constants, forms
from meshplan.cost_models.activations import (attention_core_only, megatron_recomputed_matmuls,
                                              megatron_recomputed_norms, recomputed_kinds, replay_stops_early)
from meshplan.cost_models.comm import GroupSpan, collective_time, runs_nccl
from meshplan.cost_models.compute import attention_tflops, matmul_time, memory_bound_time
from meshplan.cost_models.flops import (Matmul, attention_flops_per_token, block_matmuls, expert_matmuls,
                                       logits_matmul, sac_kind, shared_expert_matmuls)
from meshplan.cost_models.host import block_host, embedding_host, head_host, host_added, host_beyond
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import offloaded_block_bytes
from meshplan.cost_models.moe import (Routing, ep_comm_forward, ep_span, megatron_act_recompute_elems,
                                      megatron_expert_eager_elems, moe_elementwise_elems, routed_expert_times, routing)
from meshplan.cost_models.stacks import MegatronRecompute
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.model import ModelSpec
from meshplan.specs.rules import GATHER

# Pass counts and FLOP ratios live in constants.MODEL, each with its source.


@dataclass
class BlockTime:
    """Seconds for one micro-batch through one block on one rank."""

    forward: float = 0.0  # compute
    backward_input: float = 0.0
    backward_weight: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0  # exposed
    cp_comm: float = 0.0  # exposed
    ep_comm: float = 0.0  # exposed: the MoE dispatch and combine all-to-alls (moe.py)
    forward_passes: int = 1  # forward passes whose TP/CP/EP comm is paid: 2 under full AC (recompute)
    tp_comm_issued: float = 0.0  # before async TP hides its share
    cp_comm_issued: float = 0.0  # before the attention hides its share
    ep_comm_issued: float = 0.0
    kinds: BlockCompute | None = None  # the compute above by kind of work (block_compute)
    host: float = 0.0  # host work in forward and backward_input above (in line, or beyond the kernels on a GPU)

    @property
    def total(self) -> float:
        return (self.forward + self.backward_input + self.backward_weight + self.recompute + self.tp_comm
                + self.cp_comm + self.ep_comm)

    @property
    def comm_per_pass(self) -> float:
        """Exposed TP + CP + EP comm of one pass (a forward, the recompute or the backward)."""
        return (self.tp_comm + self.cp_comm + self.ep_comm) / (self.forward_passes + 1)

    @property
    def forward_with_comm(self) -> float:
        return self.forward + self.comm_per_pass

    @property
    def backward_input_with_comm(self) -> float:
        """Input-gradient pass, with the recompute that precedes it and both passes' comm."""
        return self.backward_input + self.recompute + self.forward_passes * self.comm_per_pass


@dataclass
class BlockCompute:
    """One micro-batch through one block on one rank, seconds by kind of work (host time apart)."""

    matmul_by_kind: dict[str, float]  # forward; the backward runs each again for inputs and for weights
    attention_forward: float  # ring attention's merging included
    attention_backward: float
    elementwise_forward: float  # memory-bound kernels
    elementwise_backward: float
    float8_cast: float  # over the forward and both backward passes

    @property
    def matmul_forward(self) -> float:
        return sum(self.matmul_by_kind.values())


def block_time(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan], layer: int | None = None) -> BlockTime:
    """Block `layer` (default: the last; any layer of a uniform model)."""
    layer = lay.spec.n_layers - 1 if layer is None else layer
    c = block_compute(lay, prof, layer)
    mm_fwd = c.matmul_forward
    bt = BlockTime(kinds=c)
    bt.forward = mm_fwd + c.attention_forward + c.elementwise_forward + c.float8_cast / 3
    bt.backward_input = mm_fwd + c.attention_backward + c.elementwise_backward + c.float8_cast / 3
    bt.backward_weight = mm_fwd + c.float8_cast / 3
    if lay.ac == "selective" and isinstance(lay.sac_ops, MegatronRecompute):
        bt.recompute = megatron_recompute_time(lay, prof, spans, layer, c.matmul_by_kind, c.attention_forward)
    else:
        bt.recompute = _recompute_time(lay, c.matmul_by_kind, c.attention_forward, c.elementwise_forward,
                                       replay_stops_early(lay, layer, runs_nccl(prof)))
    colls = _tp_collectives(lay, prof, spans, layer) if lay.tp > 1 else {}
    bt.forward_passes = 2 if lay.ac == "full" else 1
    tp_total = bt.tp_comm_issued = sum(colls.values()) * (bt.forward_passes + 1)
    bt.tp_comm = _async_tp_exposed(lay, prof, colls, c.matmul_by_kind, tp_total, bt.forward_passes + 1)
    if lay.tp_comm_overlap and lay.sp:
        bt.tp_comm += overlap_contention(prof, tp_total - bt.tp_comm, spans["tp"])
    # Backward moves K/V twice over: ring attention rotates K/V again and their gradients back;
    # the gather path re-gathers K/V (saved local only) and reduce-scatters their gradients.
    cp_pass = _cp_comm(lay, prof, spans)
    bt.cp_comm_issued = cp_pass * (bt.forward_passes + CP_BACKWARD_GATHERS)
    bt.cp_comm = cp_exposed(lay, cp_pass, c.attention_forward, c.attention_backward, bt.forward_passes) * (
        1 - prof.overheads.cp_overlap)
    bt.cp_comm += overlap_contention(prof, bt.cp_comm_issued - bt.cp_comm, spans["cp"])
    # Host work first: where the host outlasts the kernels, Megatron's EP overlap hides the all-to-alls under
    # that time too (ep_exposed).
    _add_host(bt, lay, prof, layer)
    _add_moe_host(bt, lay, prof, layer)
    _add_offload(bt, lay, prof, layer)
    if lay.spec.is_moe_layer(layer) and lay.ep > 1:
        r = _routing(lay)
        ep_fwd = ep_comm_forward(lay.spec, r, lay.ep, lay.act_bytes, prof, ep_span(spans, lay.ep, lay.cp, lay.tp),
                                 lay.ep_dispatch)
        bt.ep_comm_issued = ep_fwd * (bt.forward_passes + 1)
        if lay.shared_expert_overlap:
            shared = _token_matmuls(lay, prof, shared_expert_matmuls(lay.spec, lay.tp), _matmul_dtype(lay, prof))
            bt.ep_comm = shared_expert_exposed(ep_fwd, shared.get("expert_in", 0.0), shared.get("expert_out", 0.0),
                                               bt.forward_passes)
        else:
            bt.ep_comm = ep_exposed(lay, bt.ep_comm_issued, bt.forward + bt.backward_input + bt.backward_weight
                                    + bt.recompute)
        span = ep_span(spans, lay.ep, lay.cp, lay.tp)

        def node_share() -> float:
            on_node = ep_comm_forward(lay.spec, r, lay.ep, lay.act_bytes, prof, GroupSpan(lay.ep, lay.ep),
                                      lay.ep_dispatch)
            return on_node / ep_fwd if ep_fwd else 1.0

        bt.ep_comm += overlap_contention(prof, bt.ep_comm_issued - bt.ep_comm, span, node_share)
    return bt


def overlap_contention(prof: ClusterProfile, hidden: float, span: GroupSpan,
                       node_share: Callable[[], float] | None = None) -> float:
    """What collectives a mechanism hides inside a block cost the compute beside them, under forms.py's
    overlap_contention every: overheads.comm_compute_slowdown times their hidden time, at the node level's
    rate under the contention form kernel_work (`node_share()`, the share of their time their kernels' work
    takes at that rate, asked only for a group across nodes: 1 inside one), as estimate.contended prices the
    data-parallel ones. Charged to the collectives' own exposed time. 0 under data_parallel, the shipped
    form, which computes nothing more."""
    if forms.FORMS.overlap_contention != "every" or hidden <= 0.0:
        return 0.0
    across = forms.FORMS.contention != "hidden_time" and span.nodes > 1 and node_share is not None
    return prof.overheads.comm_compute_slowdown * hidden * (node_share() if across else 1.0)


def ep_exposed(lay: Layout, issued: float, compute: float) -> float:
    """The all-to-all time a block's micro-batch leaves on the critical path. In line (meshplan's runtime,
    TorchTitan, Megatron-Core by default) all of it. Megatron-Core's EP overlap
    (overlap_moe_expert_parallel_comm) merges one micro-batch's forward with another's backward, layer by
    layer, and runs each all-to-all on its own stream under the other's attention, expert and
    weight-gradient work (with delay_wgrad_compute): what exceeds that window stays exposed. The passes
    its schedule runs alone (ep_alone_share) keep theirs in line."""
    if not lay.ep_overlap or lay.n_micro < 2:
        return issued
    alone = ep_alone_share(lay)
    return alone * issued + (1.0 - alone) * max(0.0, issued - compute)


def shared_expert_exposed(ep_forward: float, fc1: float, fc2: float, forward_passes: int) -> float:
    """The all-to-all time a block's micro-batch leaves on the critical path under Megatron-Core's shared-expert
    overlap (moe_shared_expert_overlap; rules.shared_expert_overlap_reason): the shared experts run on their own
    stream, their gate and up projections (`fc1`, forward seconds) beside the dispatch and their down projection
    (`fc2`) beside the combine (MoEAlltoAllTokenDispatcher.token_dispatch / token_combine, Megatron-LM d98e8a6),
    and in backward each projection's input and weight gradients (twice its forward) beside the same all-to-all's
    backward. Dispatch and combine move the same bytes, half of `ep_forward` each (moe.ep_comm_forward). Each
    forward pass (the recompute's too, under full AC) and the backward leave what each all-to-all exceeds the
    matmuls beside it. The shared experts' activation is left out of the window, and so is the slowdown of the
    matmuls beside the sends (overlap_contention's question)."""
    half = ep_forward / 2
    forward = max(0.0, half - fc1) + max(0.0, half - fc2)
    backward = max(0.0, half - 2 * fc1) + max(0.0, half - 2 * fc2)
    return forward_passes * forward + backward


def ep_alone_share(lay: Layout) -> float:
    """The share of a rank's forward passes, and of its backward passes, that Megatron-Core's combined 1F1B
    runs unpaired, their all-to-alls in line. Without a pipeline, the first forward and the last backward of
    n_micro (combined_1f1b_schedule_for_no_pipelining). With one (the overlap needs virtual stages there),
    rank r's warm-up forwards, (pp - r - 1) * 2 + (v - 1) * pp + 1 of its n_micro * v chunk passes (the
    +1 the extra forward the overlap schedules: schedules.get_pp_rank_microbatches, Megatron-LM d98e8a6),
    and as many cool-down backwards: over the ranks, pp * v on average, a share pp / n_micro either way."""
    return min(1.0, lay.pp / lay.n_micro)


def _routing(lay: Layout) -> Routing:
    return routing(lay.spec, lay.tokens_per_micro, lay.tp, lay.ep, lay.moe_imbalance)


def _forward_matmuls(lay: Layout, prof: ClusterProfile, layer: int, dtype: str) -> dict[str, float]:
    """Forward seconds of block `layer`'s matmuls by kind: every token through the attention's, the dense
    MLP's, the router's and the shared experts' (flops.block_matmuls); an MoE layer's routed experts as
    the grouped GEMMs of its routing (moe.py)."""
    out = _token_matmuls(lay, prof, block_matmuls(lay.spec, layer, lay.tp, routed=False), dtype)
    if lay.spec.is_moe_layer(layer):
        for kind, t in routed_expert_times(lay.spec, _routing(lay), prof, dtype).items():
            out[kind] = out.get(kind, 0.0) + t / prof.overheads.kernel_efficiency
    return out


def _token_matmuls(lay: Layout, prof: ClusterProfile, matmuls: list[Matmul], dtype: str) -> dict[str, float]:
    """Forward seconds by kind of matmuls every token of a micro-batch runs."""
    dev, T, eff = prof.device, lay.tokens_per_micro, prof.overheads.kernel_efficiency
    out: dict[str, float] = {}
    for mm in matmuls:
        out[mm.kind] = out.get(mm.kind, 0.0) + matmul_time(dev, T, mm.n, mm.k, dtype) / eff
    return out


def _matmul_dtype(lay: Layout, prof: ClusterProfile) -> str:
    """The dtype a block's matmuls run in: float8 where the plan casts to it and the part has fp8 tensor cores."""
    return "fp8" if lay.float8 and "fp8" in prof.device.peak_tflops else lay.dtype


def block_compute(lay: Layout, prof: ClusterProfile, layer: int | None = None) -> BlockCompute:
    """Matmuls, attention, memory-bound kernels and float8 casts of block `layer` (default: the last) for
    one micro-batch."""
    dev, K = prof.device, constants.MODEL
    spec = lay.spec
    layer = spec.n_layers - 1 if layer is None else layer
    T = lay.tokens_per_micro
    eff = prof.overheads.kernel_efficiency
    mm_dtype = _matmul_dtype(lay, prof)
    fwd_by_kind = _forward_matmuls(lay, prof, layer, mm_dtype)
    if lay.attention_kernel == "eager":
        att_fwd, att_bwd = _eager_attention(lay, prof)
    else:
        att_flops = attention_flops_per_token(spec, lay.seq_len, causal=True, layer=layer) * T / lay.tp
        window, kernel = spec.attention_window(layer), lay.attention_kernel
        att_dtype = lay.attention_dtype or lay.dtype
        fwd_rate = attention_tflops(dev, lay.seq_len, att_dtype, spec.head_dim, window=window, kernel=kernel)
        bwd_rate = attention_tflops(dev, lay.seq_len, att_dtype, spec.head_dim, backward=True, window=window,
                                    kernel=kernel)
        att_fwd = att_flops / (fwd_rate * 1e12) / eff
        att_bwd = K.attention_backward_factor * att_flops / (bwd_rate * 1e12) / eff
        if lay.attention_kernel == "triton":  # the profile measures FlashAttention-2 (SDPA, flash-attn)
            att_fwd *= K.triton_attention_forward_slowdown
            att_bwd *= K.triton_attention_backward_slowdown
    ring_fwd, ring_bwd = _ring_attention_bookkeeping(lay, prof)
    att_fwd, att_bwd = att_fwd + ring_fwd, att_bwd + ring_bwd
    elem_fwd, elem_bwd = elementwise_times(lay, prof, layer)
    cast = 0.0
    if lay.float8:
        cast = memory_bound_time(dev, float8_cast_elems(lay, layer) * K.float8_cast_passes)
        if lay.compile:
            cast /= prof.overheads.compile_speedup
    return BlockCompute(fwd_by_kind, att_fwd, att_bwd, elem_fwd, elem_bwd, cast)


def float8_cast_elems(lay: Layout, layer: int) -> float:
    """Elements block `layer`'s float8 casts read for one micro-batch: each matmul's input and output
    gradient, a token's (a routed pair's, for a routed expert) at a time, and the weights the rank holds (the
    block's own and its local experts', not the experts a token is routed to), once a forward, or a share of
    one cast a step where the stack keeps float8 weights across micro-batches (Layout.float8_weight_cache)."""
    spec, T = lay.spec, lay.tokens_per_micro
    held = block_matmuls(spec, layer, lay.tp, routed=False)
    if spec.is_moe_layer(layer):
        held = held + expert_matmuls(spec, lay.tp, _routing(lay).local_experts)
    weights = sum(mm.k * mm.n for mm in held)
    if lay.float8_weight_cache:
        weights /= lay.n_micro
    return sum(T * (mm.k + mm.n) for mm in block_matmuls(spec, layer, lay.tp)) + weights


def _add_host(bt: BlockTime, lay: Layout, prof: ClusterProfile, layer: int) -> None:
    """Host dispatch and collective-call time of the block's passes (host.py): in line on a CPU; on a GPU,
    what a pass's host work takes beyond its kernels (host_beyond)."""
    if not lay.host_counted or (lay.host_ahead and lay.compile):
        # One graph call a pass launching Inductor's fused kernels: llama3.2-3b compiled on the H200
        # (benchmarks/results/ops-*-2026-11-27) had its host waiting on a full command queue.
        return
    f, b, r = block_host(lay, layer)
    o = prof.overheads
    fwd = host_added(lay, bt.forward, f.seconds(o))
    if lay.host_ahead:  # the recompute's host work overlaps the backward's kernels with the rest
        bwd = host_added(lay, bt.backward_input + bt.backward_weight + bt.recompute, b.seconds(o) + r.seconds(o))
    else:
        bwd = host_added(lay, bt.backward_input, b.seconds(o))
        bt.recompute += r.seconds(o)
    bt.forward += fwd
    bt.backward_input += bwd
    bt.host = fwd + bwd


# Host work of an eager MoE layer's backward over its forward's: Transformer Engine's fused grouped MLP on a
# GB200 with 64 experts took 2.1 ms of host time backward to 1.2 ms forward (TransformerEngine#2897;
# docs/sources/megatron-bridge-moe-recipes.md): the backward launches a data- and a weight-gradient GEMM
# per expert where the forward launches one.
MOE_HOST_BACKWARD_RATIO = 2.1 / 1.2


def _add_moe_host(bt: BlockTime, lay: Layout, prof: ClusterProfile, layer: int) -> None:
    """Where the stack syncs host and device in every MoE layer (Layout.moe_host_sync), the host cannot run
    ahead across it: the layer's forward and backward each take the longer of their kernels and their
    experts' host work, overheads.moe_expert_host_s per local expert (host.host_beyond)."""
    if not (lay.moe_host_sync and lay.spec.is_moe_layer(layer)):
        return
    forward = _routing(lay).local_experts * prof.overheads.moe_expert_host_s
    fwd = host_beyond(bt.forward, forward)
    bwd = host_beyond(bt.backward_input + bt.backward_weight, MOE_HOST_BACKWARD_RATIO * forward)
    bt.forward += fwd
    bt.backward_input += bwd
    bt.host += fwd + bwd


def _add_offload(bt: BlockTime, lay: Layout, prof: ClusterProfile, layer: int) -> None:
    """Megatron-Core's activation offloading (Layout.offload_modules): the block's offloaded tensors go to host
    memory on a side stream during its forward and come back during its backward, over the device's host
    link (device.host_link_gbs); each pass takes the longer of its kernels and its copy."""
    if not lay.offload_modules:
        return
    if prof.device.host_link_gbs is None:
        raise ValueError(f"offloading needs device.host_link_gbs, which {prof.name} lacks")
    copy = offloaded_block_bytes(lay, layer) / (prof.device.host_link_gbs * 1e9)
    bt.forward += max(0.0, copy - bt.forward)
    bt.backward_input += max(0.0, copy - (bt.backward_input + bt.backward_weight))


# Eager attention's passes over the (heads x s x s) scores: constants.MODEL.eager_score_passes_*.


def _eager_attention(lay: Layout, prof: ClusterProfile) -> tuple[float, float]:
    """Unfused attention, (forward, backward) seconds: batched matmuls over the full (masked) score
    matrix (two forward, four backward) and memory-bound softmax and dropout passes over it."""
    spec, dev = lay.spec, prof.device
    heads = spec.n_heads // lay.tp
    seqs = lay.micro_batch / lay.cp
    s, hd = lay.seq_len, spec.head_dim
    mm = 2 * heads * seqs * matmul_time(dev, s, s, hd, lay.dtype) / prof.overheads.kernel_efficiency
    score_bytes = heads * seqs * s * s * lay.act_bytes
    K = constants.MODEL
    return (mm + memory_bound_time(dev, score_bytes * K.eager_score_passes_fwd),
            2 * mm + memory_bound_time(dev, score_bytes * K.eager_score_passes_bwd))


def _recompute_time(lay: Layout, fwd_by_kind: dict[str, float], att_fwd: float, elem_fwd: float,
                    early_stop: bool = False) -> float:
    """The forward work run again in backward: the recomputed matmuls (activations.recomputed_kinds: compiled,
    full AC does not run ffn_out again), the attention core, and the memory-bound kernels between them."""
    if lay.ac == "none":
        return 0.0
    # A selective policy that saves every matmul and the attention still replays the block's memory-bound
    # ops (norms, RoPE, activations): the wrapper recomputes whatever the policy does not save.
    kinds = recomputed_kinds(lay.ac, lay.sac_ops, lay.spec.arch, lay.attention_kernel, lay.compile, early_stop)
    spec = lay.spec
    t = 0.0
    for mm_kind, secs in fwd_by_kind.items():
        kind = sac_kind(mm_kind)
        if kind in kinds:
            t += secs
        elif f"{kind}_partial" in kinds:
            # TorchTitan's op policy recomputes k of q/k/v and w3 of w1/w3 (every other matmul).
            if kind == "qkv":
                t += secs * spec.kv_dim / (spec.q_dim + 2 * spec.kv_dim)
            elif kind == "ffn_in" and spec.arch == "llama":
                t += secs / 2
    if "attention" in kinds:
        t += att_fwd
    if attention_core_only(lay.ac, lay.sac_ops, lay.attention_kernel):
        return t  # Megatron checkpoints the attention core alone; its softmax and dropout are in att_fwd
    if lay.compile and lay.elementwise_kernels == "pytorch":
        # Inductor fuses the recomputed memory-bound ops into the backward kernels that read their inputs
        # anyway: llama3.2-3b on an H200 (benchmarks/results/ops-*-9816110) ran AC full's recomputed norms
        # in 0.7 ms over 28 blocks (31 ms priced as their own passes), and a policy saving every matmul
        # and the attention took 1 % longer than AC none.
        return t
    return t + elem_fwd


def megatron_recompute_time(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan], layer: int,
                            fwd_by_kind: dict[str, float], att_fwd: float) -> float:
    """What Megatron-Core's recompute modules (MegatronRecompute) run again of block `layer`'s forward for
    one micro-batch: their matmuls (activations.megatron_recomputed_matmuls), the attention core
    (core_attn), their fused kernels' forward passes (the norms, activations.megatron_recomputed_norms;
    MLA's RoPE; a dense MLP's, the routed experts' or the shared experts' activation, with the experts'
    eager clamp, moe.megatron_act_recompute_elems) and, with a dense MLP or shared experts, their TP
    collectives again."""
    spec, dev, modules = lay.spec, prof.device, lay.sac_ops.modules
    moe_layer = spec.is_moe_layer(layer)
    mm_dtype = _matmul_dtype(lay, prof)
    eff = prof.overheads.kernel_efficiency
    t = sum(matmul_time(dev, lay.tokens_per_micro, mm.n, mm.k, mm_dtype)
            for mm in megatron_recomputed_matmuls(spec, layer, lay.tp, lay.sac_ops)) / eff
    if "core_attn" in modules:
        t += att_fwd
    passes = MEGATRON_CORE_LLAMA_PASSES if spec.arch == "llama" else MEGATRON_PASSES
    act = passes["swiglu" if spec.arch == "llama" else "gelu"][0]
    elems = passes["norm"][0] * megatron_recomputed_norms(spec, layer, modules) * spec.dim / (lay.tp if lay.sp else 1)
    if "mla_up_proj" in modules and spec.mla is not None:
        elems += MEGATRON_CORE_LLAMA_PASSES["rope"][0] * (spec.q_dim + spec.kv_dim) / lay.tp
    if "mlp" in modules and not moe_layer:
        elems += act * _activation_width(spec, layer) / lay.tp
        t += _mlp_tp_exposed(lay, prof, spans, layer, fwd_by_kind)
    if "moe_act" in modules and moe_layer:
        elems += megatron_act_recompute_elems(spec, lay.ep, lay.moe_imbalance, lay.tp, act, not lay.moe_fused_mlp)
    if "shared_experts" in modules and moe_layer and spec.moe.shared_experts:
        elems += act * spec.moe.shared_experts * spec.moe.expert_ffn_dim / lay.tp
        t += _mlp_tp_exposed(lay, prof, spans, layer, fwd_by_kind)  # the MLP pair is the shared experts' here
    return t + memory_bound_time(dev, elems * lay.tokens_per_micro * lay.act_bytes)


def elementwise_times(lay: Layout, prof: ClusterProfile, layer: int | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of block `layer`'s (default: the last) memory-bound elementwise kernels."""
    dev = prof.device
    layer = lay.spec.n_layers - 1 if layer is None else layer
    if lay.elementwise_kernels == "megatron":
        fwd, bwd = (_megatron_elementwise_bytes(lay) if lay.spec.arch == "gpt"
                    else _megatron_core_llama_elementwise_bytes(lay, layer))
        return memory_bound_time(dev, fwd), memory_bound_time(dev, bwd)
    if lay.compile and lay.spec.arch != "gpt" and runs_nccl(prof) and forms.FORMS.compiled_elementwise == "fused":
        fwd, bwd = _fused_llama_elementwise_bytes(lay, layer)
        return memory_bound_time(dev, fwd), memory_bound_time(dev, bwd)
    if lay.spec.arch == "gpt":
        fwd_bytes, bwd_bytes = _aten_gpt_elementwise_bytes(lay)
    else:
        fwd_bytes = _pytorch_elementwise_bytes(lay, layer)
        bwd_bytes = 2 * fwd_bytes
    fwd, bwd = memory_bound_time(dev, fwd_bytes), memory_bound_time(dev, bwd_bytes)
    if lay.compile:
        fwd, bwd = fwd / prof.overheads.compile_speedup, bwd / prof.overheads.compile_speedup
    return fwd, bwd


# A GPT block in eager PyTorch (meshplan's runtime, nanoGPT, MPT): LayerNorm and GELU are each one ATen
# kernel (layer_norm's fused CUDA kernel reads x and writes y, keeping one fp32 mean and rstd per
# token; gelu reads and writes once), unlike the Llama block's composite fp32 RMSNorm and RoPE. Passes
# per element, forward and backward. Forward: LayerNorm (2, twice); residual add reads two and writes
# one (3, twice); GELU (2 per FFN element); the attention output's transpose to (batch, seq, heads)
# copies it (2). Backward: LayerNorm reads the gradient and the input and writes (3, twice); the
# residual stream's gradient accumulation (3, twice); GELU reads the gradient and its input and writes
# (3); the copy back (2).
ATEN_GPT_PASSES = {"norm": (2, 3), "residual": (3, 3), "gelu": (2, 3), "attn_out_copy": (2, 2)}


def _kernel_pass_bytes(lay: Layout, passes: dict[str, tuple[float, float]], elems: dict[str, float],
                       extra: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """(forward, backward) bytes of a block's elementwise kernels, each making its (forward, backward)
    `passes` over its `elems` elements per token (plus `extra` (forward, backward) element passes), in the
    activation dtype, for one micro-batch."""
    scale = lay.tokens_per_micro * lay.act_bytes
    return (scale * (sum(n * passes[k][0] for k, n in elems.items()) + extra[0]),
            scale * (sum(n * passes[k][1] for k, n in elems.items()) + extra[1]))


def _aten_gpt_elementwise_bytes(lay: Layout) -> tuple[float, float]:
    spec = lay.spec
    sp_div = lay.tp if lay.sp else 1
    elems = {"norm": 2 * spec.dim / sp_div, "residual": 2 * spec.dim / sp_div, "gelu": spec.ffn_dim / lay.tp,
             "attn_out_copy": spec.attn_out_dim / lay.tp}
    return _kernel_pass_bytes(lay, ATEN_GPT_PASSES, elems)


# A fused RMSNorm kernel's forward (Layout.norm_kernel "fused"): it reads x and writes y, 2 passes per
# element (the per-token rstd it keeps is negligible); its backward, read x and the gradient, write the
# input gradient and the weight gradient's partial sums, is the twice-forward every eager pass is given.
FUSED_NORM_PASSES = 2.0


def _pytorch_elementwise_bytes(lay: Layout, layer: int) -> float:
    """Bytes one Llama-style block's forward elementwise kernels move, as eager PyTorch runs them.

    Per element, in units of the activation size: two RMSNorms computed in fp32 (cast, square, mean,
    scale, cast back: ~20 passes each; 2 as one fused kernel, Layout.norm_kernel), two residual adds (3),
    RoPE on q and k via fp32 complex multiply (~15), the SwiGLU activation (5) and attention layout copies
    (8). Backward moves about twice this. torch.compile fuses it (forms.py compiled_elementwise:
    _fused_llama_elementwise_bytes). GPT blocks: _aten_gpt_elementwise_bytes.
    """
    spec, K = lay.spec, constants.MODEL
    sp_div = lay.tp if lay.sp else 1
    norm = K.norm_passes if lay.norm_kernel == "composite" else FUSED_NORM_PASSES
    per_token = (2 * norm + 2 * K.residual_passes) * spec.dim / sp_div
    rope = K.rope_passes * (spec.q_dim + spec.kv_dim) if spec.arch == "llama" else 0
    per_token += (rope + K.layout_passes * (spec.q_dim + spec.kv_dim + spec.v_dim)
                  + K.activation_passes * _activation_width(spec, layer)) / lay.tp
    if spec.is_moe_layer(layer):
        per_token += moe_elementwise_elems(spec, lay.ep, lay.moe_imbalance, lay.tp)
    return lay.tokens_per_micro * per_token * lay.act_bytes


# Megatron-LM's hand-fused kernels, passes per element (activation-size units; a 1-byte dropout mask
# is half a pass of 2-byte activations). Forward: fused LayerNorm reads and writes (2, twice);
# bias-dropout-add reads the input and the residual and writes the sum and the mask (3.5, twice);
# bias-GeLU reads and writes (2); the attention context's permute to [s, b, h] copies it (2).
# Backward: LayerNorm reads the gradient and the input and writes (3, twice); dropout-add reads the
# gradient and the mask and writes (2.5, twice); GeLU reads the gradient and its input and writes
# (3); the permute copies back (2).
MEGATRON_PASSES = {"norm": (2, 3), "dropout_add": (3.5, 2.5), "gelu": (2, 3), "permute": (2, 2)}


def _megatron_elementwise_bytes(lay: Layout) -> tuple[float, float]:
    spec = lay.spec
    sp_div = lay.tp if lay.sp else 1
    elems = {"norm": 2 * spec.dim / sp_div, "dropout_add": 2 * spec.dim / sp_div,
             "gelu": spec.ffn_dim / lay.tp, "permute": spec.dim / lay.tp}
    return _kernel_pass_bytes(lay, MEGATRON_PASSES, elems)


# Megatron-Core's fused kernels for Llama-style blocks, as its performance recipes switch them on
# (Transformer Engine's RMSNorm, apply_rope_fusion, bias_activation_fusion's SwiGLU,
# bias_dropout_fusion's residual add): passes per element, each reading its inputs and writing its
# outputs once. Forward: RMSNorm reads and writes (2, twice); the residual add reads two and writes
# one (3, twice); RoPE on q and k reads and writes (2); SwiGLU reads gate and up and writes (3 per
# FFN element); the attention context's permute (2). Backward: RMSNorm reads the gradient and the
# input and writes (3, twice); the residual gradient's accumulation (3, twice); RoPE (2); SwiGLU
# reads the gradient, gate and up and writes two gradients (5); the permute (2).
MEGATRON_CORE_LLAMA_PASSES = {"norm": (2, 3), "residual": (3, 3), "rope": (2, 2), "swiglu": (3, 5), "permute": (2, 2)}
# Megatron-Core's unfused RoPE (rope_utils._apply_rotary_pos_emb_bshd), which it runs where the rotation
# carries YaRN's temperature (apply_rotary_pos_emb takes the fused kernel only with mscale 1; Megatron-Bridge
# also turns apply_rope_fusion off for position_embedding_type "yarn", utils/fusions.py
# validate_rope_fusion_compatibility; Megatron-Core 0d8e0714 to cd4afffa): passes per element of q and k.
# Forward: t * cos (2), _rotate_half's negation of one half (1) and torch.cat of the halves (2), * sin (2),
# the sum (3), torch.cat((t, t_pass)) with t_pass empty (2). Backward: each product's gradient (2 + 2), the
# negation's (1), chunk's gradient concatenating the halves (2), the two paths' gradients summed (3), and the
# slice t[..., :rot_dim]'s gradient written into a zeroed tensor (3).
MEGATRON_UNFUSED_ROPE_PASSES = (12, 13)


def _activation_width(spec: ModelSpec, layer: int) -> int:
    """Elements per token the block's SwiGLU/GELU runs over: an MoE layer's every routed pair's and shared
    expert's width (moe.py), else the dense MLP's."""
    if not spec.is_moe_layer(layer):
        return spec.ffn_dim
    moe = spec.moe
    return (moe.top_k + moe.shared_experts) * moe.expert_ffn_dim


def _fused_llama_elems(lay: Layout, layer: int) -> dict[str, float]:
    """Elements per token each of a Llama-style block's fused elementwise kernels runs over
    (MEGATRON_CORE_LLAMA_PASSES' keys)."""
    spec = lay.spec
    sp_div = lay.tp if lay.sp else 1
    return {"norm": 2 * spec.dim / sp_div, "residual": 2 * spec.dim / sp_div,
            "rope": (spec.q_dim + spec.kv_dim) / lay.tp, "swiglu": _activation_width(spec, layer) / lay.tp,
            "permute": spec.attn_out_dim / lay.tp}


def _megatron_core_llama_elementwise_bytes(lay: Layout, layer: int) -> tuple[float, float]:
    spec = lay.spec
    elems = _fused_llama_elems(lay, layer)
    passes = MEGATRON_CORE_LLAMA_PASSES
    if spec.yarn_mscale != 1.0:  # YaRN's temperature in the rotation: the unfused RoPE
        passes = {**passes, "rope": MEGATRON_UNFUSED_ROPE_PASSES}
    if not spec.is_moe_layer(layer):
        return _kernel_pass_bytes(lay, passes, elems)
    # An MoE layer's router and token permutation (moe_permute_fusion): the same passes as eager, each way;
    # and what its experts run eagerly (GPT-OSS's clamp and down-projection bias).
    routing = moe_elementwise_elems(spec, lay.ep, lay.moe_imbalance, lay.tp)
    fwd, bwd = (0.0, 0.0) if lay.moe_fused_mlp else megatron_expert_eager_elems(spec, lay.ep, lay.moe_imbalance,
                                                                                  lay.tp)
    return _kernel_pass_bytes(lay, passes, elems, (routing + fwd, routing + bwd))


# A complex RoPE under torch.compile (Layout.rope_complex), passes per element of q and k in units of the bf16
# activation: forward, the upcast to fp32 Inductor fuses (reads 2 bytes, writes 4: 3), the complex multiply
# it leaves to an eager fallback kernel (reads 4, writes 4: 4), the cast back (reads 4, writes 2: 3);
# backward the same three in reverse (the multiply by the conjugate, eager again).
COMPILED_COMPLEX_ROPE_PASSES = (10, 10)


def _fused_llama_elementwise_bytes(lay: Layout, layer: int) -> tuple[float, float]:
    """A compiled Llama-style block under forms.FORMS.compiled_elementwise "fused": Megatron-Core's fused
    passes (each kernel reads its inputs and writes its outputs once); an MoE layer's routing and token
    permutation as eager PyTorch moves them, each way."""
    spec = lay.spec
    routing = moe_elementwise_elems(spec, lay.ep, lay.moe_imbalance, lay.tp) if spec.is_moe_layer(layer) else 0.0
    passes = MEGATRON_CORE_LLAMA_PASSES
    if lay.rope_complex:
        passes = {**passes, "rope": COMPILED_COMPLEX_ROPE_PASSES}
    return _kernel_pass_bytes(lay, passes, _fused_llama_elems(lay, layer), (routing, routing))


def _tp_collectives(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan], layer: int) -> dict[str, float]:
    """One pass's TP collectives of block `layer`, seconds, by the matmul kind each runs beside: with SP, the
    all-gathers before the qkv and ffn_in projections and the reduce-scatters after attn_out and ffn_out;
    without it, the all-reduces after attn_out and ffn_out. An MoE layer has its MLP pair only where
    something gathers the sequence over TP (_moe_gathers_over_tp)."""
    payload = lay.tokens_per_micro * lay.spec.dim * lay.act_bytes
    mlp = not lay.spec.is_moe_layer(layer) or _moe_gathers_over_tp(lay)
    if lay.sp:
        ag = collective_time(prof, "all_gather", payload, spans["tp"])
        rs = collective_time(prof, "reduce_scatter", payload, spans["tp"])
        return {"qkv": ag, "attn_out": rs, **({"ffn_in": ag, "ffn_out": rs} if mlp else {})}
    ar = collective_time(prof, "all_reduce", payload, spans["tp"])
    return {"attn_out": ar, **({"ffn_out": ar} if mlp else {})}


def _moe_gathers_over_tp(lay: Layout) -> bool:
    """Whether an MoE layer all-gathers its sequence shard over TP and reduce-scatters its output. TorchTitan
    does around the whole layer (its PrepareModuleInputOutput to Replicate, Layout.moe_tp_gather); with expert
    TP 1, Megatron-Core's alltoall and flex dispatchers route each TP rank's own shard (their TP group is
    expert TP's), as meshplan's runtime does (runtime/tensor_parallel.moe_tp_plan), and only the shared
    experts, TP-sharded like a dense MLP, gather and reduce-scatter (SharedExpertMLP's column- and
    row-parallel linears)."""
    return lay.moe_tp_gather or lay.spec.moe.shared_experts > 0


def _async_tp_exposed(lay: Layout, prof: ClusterProfile, colls: dict[str, float], matmuls: dict[str, float],
                      issued: float, passes: int, kinds: tuple[str, ...] | None = None) -> float:
    """What a block's TP collectives (`colls`, one pass's by kind: _tp_collectives; those beside `kinds` of
    matmul, default all; `issued` their time) leave
    exposed over its passes: under Transformer Engine's userbuffers (Layout.tp_comm_overlap, with SP) each
    collective beyond (tp - 1) / tp of its matmul; else all of them without async TP; with it, as
    forms.FORMS.async_tp says, either the fitted share tp_async_overlap of the traffic hidden, or each
    collective hidden under that share of the matmul it is fused with (_tp_collectives; in backward, their
    gradients' beside the same ops' input-gradient matmuls)."""
    if lay.tp_comm_overlap and lay.sp:
        # Transformer Engine's userbuffers: tp GEMM chunks, tp - 1 exchanges, each under one chunk.
        return passes * _hidden_under_matmuls(colls, matmuls, (lay.tp - 1) / lay.tp, kinds)
    share = prof.overheads.tp_async_overlap
    if not lay.async_tp:
        return issued
    if forms.FORMS.async_tp == "traffic":
        return issued * (1 - share)
    return passes * _hidden_under_matmuls(colls, matmuls, share, kinds)


def _hidden_under_matmuls(colls: dict[str, float], matmuls: dict[str, float], window: float,
                          kinds: tuple[str, ...] | None = None) -> float:
    """One pass's TP collectives `colls` (those beside `kinds` of matmul, default all) left exposed when each
    runs under `window` of the matmul it is fused with."""
    by_kind: dict[str, float] = {}
    for kind, t in matmuls.items():
        by_kind[sac_kind(kind)] = by_kind.get(sac_kind(kind), 0.0) + t
    return sum(max(0.0, c - window * by_kind.get(kind, 0.0)) for kind, c in colls.items()
               if kinds is None or kind in kinds)


def _mlp_tp_exposed(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan], layer: int,
                    matmuls: dict[str, float]) -> float:
    """A block's MLP TP collectives (a dense MLP's, or an MoE layer's shared experts') in one forward pass
    (its recompute's), exposed as the block's are."""
    if lay.tp == 1:
        return 0.0
    kinds = ("ffn_in", "ffn_out")
    colls = _tp_collectives(lay, prof, spans, layer)
    issued = sum(c for kind, c in colls.items() if kind in kinds)
    return _async_tp_exposed(lay, prof, colls, matmuls, issued, 1, kinds)


# PyTorch's ring attention (context_parallel, as TorchTitan runs it) merges each non-local ring step's
# partial output into the running one in fp32 and rebuilds the concatenated K/V every step. Bytes read
# and written per element of the local query-side tensor (batch x local tokens x heads x head dim) or
# key/value-side tensor, per ring step, from its forward and backward, as a helper read torch's
# _attention.py (2024 and 2.6 copies; a later read of 2.13 counts ~35 forward per query element and
# ~44 backward per K/V element, which about cancel):
# - forward, each of the cp - 1 non-local steps: the block output cast to fp32, the sigmoid-weighted
#   update of the running output and its log-sum-exp, and the partial-update rebuild: ~50 per query
#   element; torch.cat of the local K and V into one send buffer (read + write, 2 bytes): 8 per K/V element;
# - backward, each of the cp steps: dQ accumulated in fp32 and its partial-update copy, ~20 per query
#   element; dK and dV accumulated in fp32 and concatenated into the ring's send buffer, ~20 per K/V element.
CP_BACKWARD_GATHERS = 2


def cp_exposed(lay: Layout, per_pass: float, attention_forward: float, attention_backward: float,
               forward_passes: int) -> float:
    """The K/V exchange a block's attention leaves exposed, `per_pass` being one pass's exchange and the
    attention times the block's whole local attention (cp steps of it), by how the stack runs the ring:
    - Transformer Engine's P2P ring (Megatron-Core; Layout.cp_ring_overlap; AttnFuncWithCPAndKVP2P "overlaps
      current-step compute with next-step communication"): each of the cp - 1 exchanges runs under one
      step's attention, forward, and the K/V and their gradients' exchanges under the backward's steps;
    - PyTorch's ring attention (the runtime, TorchTitan) and the gather path (gloo): in line. TorchTitan's
      CP rows say so: fitted, the share of it hidden came out 0.001 (0 to 0.21 leaving one table out,
      2026-11-27). PyTorch's "allgather" rotater issues its gather before the local step and waits after
      it, so the first of the cp steps could hide it; priced that way, TorchTitan's CP tables scored worse
      out of sample (Table 6 5.2 % against 3.1 %, the dense rows 4.4 % against 4.0 %)."""
    if lay.cp == 1:
        return 0.0
    if lay.cp_ring_overlap and lay.cp_attention != GATHER:
        window = (lay.cp - 1) / lay.cp
        return (forward_passes * max(0.0, per_pass - window * attention_forward)
                + max(0.0, CP_BACKWARD_GATHERS * per_pass - window * attention_backward))
    return per_pass * (forward_passes + CP_BACKWARD_GATHERS)


RING_FWD_BYTES = {"q": 50.0, "kv": 8.0}
RING_BWD_BYTES = {"q": 20.0, "kv": 20.0}


def _ring_attention_bookkeeping(lay: Layout, prof: ClusterProfile) -> tuple[float, float]:
    """(forward, backward) seconds of ring attention's memory-bound merging, for one call of one block."""
    if lay.cp == 1 or lay.cp_attention != "ring":
        return 0.0, 0.0
    q_elems = lay.tokens_per_micro * lay.spec.dim / lay.tp
    kv_elems = lay.tokens_per_micro * lay.cp_kv_dim / lay.tp
    fwd = (lay.cp - 1) * (RING_FWD_BYTES["q"] * q_elems + RING_FWD_BYTES["kv"] * kv_elems)
    bwd = lay.cp * (RING_BWD_BYTES["q"] * q_elems + RING_BWD_BYTES["kv"] * kv_elems)
    return memory_bound_time(prof.device, fwd), memory_bound_time(prof.device, bwd)


def _cp_comm(lay: Layout, prof: ClusterProfile, spans: dict[str, GroupSpan]) -> float:
    """One block's CP key/value all-gather (forward) for the full sequence."""
    if lay.cp == 1:
        return 0.0
    payload = 2 * lay.micro_batch * lay.seq_len * lay.cp_kv_dim / lay.tp * lay.act_bytes
    return collective_time(prof, "all_gather", payload, spans["cp"])


@dataclass
class HeadTime:
    forward: float
    backward: float


# Bytes per logit the loss kernels move, (forward, backward), besides the head matmul that writes the logits:
# - Inductor's compiled cross-entropy (Layout.loss_compiled under forms.py compiled_loss "fused"): two
#   reductions read the compute-dtype logits forward (their max, then the sum of exponentials; the upcast is
#   fused into both), one pointwise kernel reads them backward and writes their gradient. torch 2.13's
#   scheduler counts 4.0 and 4.0 (torch._inductor.metrics.num_bytes_accessed over F.cross_entropy(logits.float())
#   in bf16, and with OLMo-core's z-loss on the same log-sum-exp: tests/runtime/test_compiled_loss_bytes.py).
# - Transformer Engine's fused cross-entropy (Layout.loss_kernel "te"; Triton, transformer_engine/common/
#   triton/cross_entropy.py, before v2.18): online_softmax_kernel reads the logits, cross_entropy_kernel reads
#   them again and writes the gradient over them in place; backward, element_mul_kernel reads and writes it
#   once more (Megatron-Core hands it a per-token loss gradient, not the 1.0 it skips). v2.18 (01bbe3eea,
#   2026-07) keeps that gradient in fp32 instead, after every row priced with it.
# - flash-attn's CUDA cross-entropy (Layout.loss_kernel "xentropy"; csrc/xentropy/xentropy_kernel.cu at
#   v1.0.9, apex's kernel made to run bf16): cunn_SoftMaxXEntropyForward reads each logit twice (ilpReduce for
#   the max, then for the sum of exponentials) and writes fp32 per token only; backward reads the logits once
#   and writes their gradient into a new buffer (inplace false, flash_attn/losses/cross_entropy.py's default).
#   In logits of the compute dtype, so in units of it.
COMPILED_LOSS_BYTES = (4.0, 4.0)
TE_LOSS_BYTES = (6.0, 4.0)
XENTROPY_LOSS_PASSES = (2.0, 2.0)


def eager_loss_bytes() -> float:
    """Bytes a logit eager PyTorch's cross-entropy moves each way: loss_passes passes over fp32 logits."""
    return constants.MODEL.loss_passes * 4


def loss_times(lay: Layout, prof: ClusterProfile, logits: float) -> tuple[float, float]:
    """(forward, backward) seconds of the cross-entropy over `logits` logits, memory-bound, as the stack runs it:
    eager PyTorch's upcast, log-softmax and gather (about constants.MODEL.loss_passes passes over fp32 logits each
    way; compiled, shrunk by compile_speedup where forms.py compiled_loss says "speedup" or on a CPU profile,
    whose calibrated terms carry its compiled loss), Inductor's fused kernels, Transformer Engine's or flash-attn's."""
    dev = prof.device
    if lay.loss_kernel == "te":
        per = TE_LOSS_BYTES
    elif lay.loss_kernel == "xentropy":
        per = (XENTROPY_LOSS_PASSES[0] * lay.act_bytes, XENTROPY_LOSS_PASSES[1] * lay.act_bytes)
    elif lay.loss_compiled and runs_nccl(prof) and forms.FORMS.compiled_loss == "fused":
        per = COMPILED_LOSS_BYTES
    else:
        eager = eager_loss_bytes() / (prof.overheads.compile_speedup if lay.loss_compiled else 1.0)
        per = (eager, eager)
    return memory_bound_time(dev, logits * per[0]), memory_bound_time(dev, logits * per[1])


def head_time(lay: Layout, prof: ClusterProfile) -> HeadTime:
    """Output projection plus cross-entropy (memory-bound over the logits) for one micro-batch."""
    dev = prof.device
    T = lay.tokens_per_micro
    mm = logits_matmul(lay.spec, lay.tp)
    fwd_mm = matmul_time(dev, T, mm.n, mm.k, lay.dtype) / prof.overheads.kernel_efficiency
    logits = T * lay.spec.vocab_size / lay.tp
    loss_fwd, loss_bwd = loss_times(lay, prof, logits)
    # The trainer's metric losses run after the backward, one eager forward each (Layout.metric_losses).
    metrics = lay.metric_losses * memory_bound_time(dev, logits * eager_loss_bytes())
    fwd, bwd = fwd_mm + loss_fwd, 2 * fwd_mm + loss_bwd + metrics
    host_f, host_b = head_host(lay)
    o = prof.overheads
    return HeadTime(fwd + host_added(lay, fwd, host_f.seconds(o)), bwd + host_added(lay, bwd, host_b.seconds(o)))


def mtp_extra_time(lay: Layout, prof: ClusterProfile, head: HeadTime) -> tuple[float, float, float]:
    """(forward, backward, weight-gradient) seconds one micro-batch's multi-token-prediction modules
    (Layout.mtp_layers) add on the last stage beside their blocks, which are priced as blocks of the last
    layer's kind: each one's input projection (2 dim -> dim, column-parallel over TP; its input and weight
    gradients in backward) and one more pass through the output head and loss."""
    if lay.mtp_layers == 0:
        return 0.0, 0.0, 0.0
    d = lay.spec.dim
    proj = matmul_time(prof.device, lay.tokens_per_micro, d / lay.tp, 2 * d, lay.dtype) / prof.overheads.kernel_efficiency
    n = lay.mtp_layers
    return n * (proj + head.forward), n * (proj + head.backward), n * proj


def embedding_time(lay: Layout, prof: ClusterProfile) -> float:
    lookup = memory_bound_time(prof.device, 3 * lay.tokens_per_micro * lay.spec.dim * lay.act_bytes)
    return lookup + host_added(lay, lookup, embedding_host(lay).seconds(prof.overheads))
