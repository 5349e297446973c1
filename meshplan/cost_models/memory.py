"""Peak memory per rank: model states, FSDP buffers, activations in flight, loss buffers, overheads.

Mixed precision follows FSDP2 as TorchTitan uses it: fp32 sharded parameters, fp32 sharded
gradients, fp32 AdamW moments (16 bytes per parameter, divided by dp_shard), parameters
all-gathered in the compute dtype. fp32 runs (CPU) gather fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from meshplan.cost_models.activations import (Convention, activation_bytes_per_token, convention_of,
                                              offloaded_bytes_per_token, offloaded_names,
                                              recompute_peak_bytes_per_token)
from meshplan.cost_models.layout import Layout, stage_kinds
from meshplan.cost_models.moe import rank_block_params
from meshplan.cost_models.pipeline import stage_rank
from meshplan.cost_models.stacks import MegatronRecompute
from meshplan.profiles.schema import Overheads
from meshplan.specs.rules import SPLIT_BACKWARD_SCHEDULES, uses_fully_shard

GIB = 1024.0 ** 3
# The memory phases (pipeline ScheduleResult.phases) of an unpipelined step: one activation set.
ONE_RANK_PHASES = (((1.0, 0.0, 1.0),),)
STATE_BYTES = {"params": 4.0, "grads": 4.0, "optimizer": 8.0}
# AdamW's foreach step (torch.optim's _multi_tensor_adam; the runtime and TorchTitan run it) allocates one
# fp32 temporary per parameter: the square root of the second moments, before it divides the first.
OPTIMIZER_STEP_TEMP_BYTES = 4.0


@dataclass
class StageParams:
    """Parameters one pipeline rank holds (TP- and EP-sharded, before FSDP sharding)."""

    layers: int
    block: float  # the largest of its blocks' parameters on a rank
    embedding: float  # input embedding (first stage)
    head: float  # final norm + output projection (last stage)
    blocks: float  # all of its blocks' parameters on a rank
    routed: float = 0.0  # of which routed experts: FSDP shards them over ep_fsdp, not dp_shard x cp
    kinds: tuple[tuple[int, int], ...] = ()  # (representative layer, count) of its blocks (layout.stage_kinds)

    @property
    def total(self) -> float:
        return self.blocks + self.embedding + self.head

    def sharded(self, fsdp_shard: int, routed_shard: int) -> float:
        """What one rank keeps of them once FSDP has sharded them (rules.ep_fsdp for the routed experts)."""
        return (self.total - self.routed) / fsdp_shard + self.routed / routed_shard


@dataclass
class RankMemory:
    rank: int
    parts: dict[str, float] = field(default_factory=dict)  # bytes

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def gib(self) -> dict[str, float]:
        return {k: v / GIB for k, v in self.parts.items()}


def stage_params(lay: Layout, rank: int, reached: int | None = None) -> StageParams:
    """Parameters of rank `rank`'s stages; with `reached`, of only the first `reached` of them that the
    backward pass reaches (the highest stage first)."""
    return _stage_params(lay.spec, lay.pp, lay.schedule, lay.stage_layers, lay.tp, rank, reached, lay.ep,
                         lay.mtp_layers)


@lru_cache(maxsize=65536)
def _stage_params(spec, pp: int, schedule: str, stage_layers: tuple[int, ...], tp: int, rank: int,
                  reached: int | None = None, ep: int = 1, mtp: int = 0) -> StageParams:
    n_stages = len(stage_layers)
    stages = [s for s in reversed(range(n_stages)) if stage_rank(s, pp, schedule) == rank][:reached]
    per_stage = stage_kinds(spec, stage_layers, mtp)
    counts: dict[int, int] = {}
    for s in stages:
        for k, n in per_stage[s]:
            counts[k] = counts.get(k, 0) + n
    layers = sum(counts.values())
    last = (n_stages - 1) in stages
    held = {k: rank_block_params(spec, k, tp, ep) for k in counts}
    block = max((held[k][0] for k in counts), default=rank_block_params(spec, spec.n_layers - 1, tp, ep)[0])
    blocks = sum(n * held[k][0] for k, n in counts.items())
    routed = sum(n * held[k][1] for k, n in counts.items())
    first = 0 in stages
    emb = spec.embedding_params() / tp if first else 0.0
    head = (spec.head_params() - spec.dim) / tp + spec.dim if last else 0.0
    if last:  # each MTP module's input projection (2 dim -> dim, over TP) and its three norms
        head += mtp * (2 * spec.dim * spec.dim / tp + 3 * spec.dim)
    if (spec.tied_embeddings or mtp) and last and not first:
        # The tied matrix lives on both ends; so does the embedding the MTP modules look the next tokens up in
        # (Megatron-Core's GPTModel builds it where pre_process or mtp_process).
        head += spec.vocab_size * spec.dim / tp
    return StageParams(layers, block, emb, head, blocks, routed, tuple(sorted(counts.items())))


def state_bytes(lay: Layout) -> tuple[float, float, float]:
    """Bytes per (sharded) parameter of its fp32 copy, its gradient and AdamW's moments: STATE_BYTES, with the
    gradient and the moments as the layout keeps them (Layout.main_grad_bytes, optimizer_state_bytes). Where
    gradients accumulate in one buffer allocated with the model (Layout.contiguous_grads: Megatron-Core's
    distributed optimizer), the optimizer's shard of them is a view into that buffer when the dtypes agree
    (counted in the buffer, contiguous_grad_bytes) and a copy when they do not (a bf16 buffer, fp32 main
    gradients: DistributedOptimizer._copy_model_grads_to_main_grads casts each shard)."""
    grads = lay.main_grad_bytes
    if lay.contiguous_grads and lay.main_grad_bytes == lay.grad_reduce_bytes:
        grads = 0.0
    return STATE_BYTES["params"], grads, lay.optimizer_state_bytes


def contiguous_grad_bytes(lay: Layout, sp: StageParams) -> float:
    """The gradient buffer a stack with contiguous gradients allocates with the model, live the whole step:
    Megatron-Core's ParamAndGradBuffer holds every local parameter's gradient, unsharded (the distributed
    optimizer reduce-scatters into it in place), in the dtype gradients are reduced in (grad_reduce_in_fp32).
    0 for the other stacks."""
    return lay.grad_reduce_bytes * sp.total if lay.contiguous_grads else 0.0


@dataclass(frozen=True)
class _RankBasis:
    """What a rank's memory is made of apart from its load (in flight, kept, losses, accumulating, loss
    live): computed once per (layout, rank), since the planner prices each in many memory phases."""

    sp: StageParams
    state: tuple[float, float, float]  # params, grads, optimizer
    fsdp_buffers: float
    accumulates: bool
    unit: float
    ac_transient: float
    saved: float  # one micro-batch's loss kept from forward to backward (last pipelined stage)
    loss_buffer: float
    pp_buffers: float
    logits: float
    cp_buffers: float
    grads_live: bool
    offload_resident: float  # offload_resident_bytes
    grad_buffer: float  # contiguous_grad_bytes


@lru_cache(maxsize=65536)
def _rank_basis(lay: Layout, rank: int) -> _RankBasis:
    sp = stage_params(lay, rank)
    local = sp.sharded(lay.fsdp_shard, lay.routed_fsdp_shard)
    state = tuple(b * local for b in state_bytes(lay))
    tokens = lay.tokens_per_micro
    ac_transient = 0.0
    if lay.ac != "none":
        ac_transient = tokens * max(_recomputed_bytes_per_token(lay, k) for k, _ in sp.kinds) if sp.kinds else 0.0
    saved = loss_saved_bytes(lay) if sp.head and lay.pp > 1 else 0.0
    pp_buffers = 0.0
    if lay.pp > 1 and lay.pp_recv_up_front:
        hidden = tokens * lay.hidden_bytes_per_token
        receiving = 2 * lay.v - (1 if sp.embedding else 0) - (1 if sp.head else 0)
        pp_buffers = lay.n_micro * hidden * receiving
    cp_buffers = 2 * lay.micro_batch * lay.seq_len * lay.cp_kv_dim / lay.tp * lay.act_bytes if lay.cp > 1 else 0.0
    return _RankBasis(sp, state, _fsdp_buffers(lay, sp), pp_accumulates(lay), activation_unit_bytes(lay, sp),
                      ac_transient, saved, loss_buffer_bytes(lay) if sp.head else 0.0, pp_buffers,
                      logits_bytes(lay) if sp.head else 0.0, cp_buffers, _grads_live_at_peak(lay),
                      offload_resident_bytes(lay, sp), contiguous_grad_bytes(lay, sp))


def rank_memory(lay: Layout, rank: int, in_flight: float, overheads: Overheads, kept: float = 0.0,
                accumulating: int | None = None, loss_live: bool = True, losses: float = 1.0) -> RankMemory:
    """Peak bytes on pipeline rank `rank`; in_flight = (stage, micro-batch) activation sets held at peak,
    kept = stage outputs held to the step's end at that moment, in the same units (see kept_output_units);
    accumulating = how many of the rank's stages hold gradient accumulators at that moment (None: all;
    see pp_accumulates); loss_live = whether the last stage (if on this rank) still has a loss to run
    backward through; losses = its micro-batches whose loss graph is alive (pipelined ranks only)."""
    b = _rank_basis(lay, rank)
    sp = b.sp
    mem = RankMemory(rank)
    mem.parts["params"], mem.parts["grads"], mem.parts["optimizer"] = b.state
    mem.parts["fsdp_buffers"] = b.fsdp_buffers
    if b.grad_buffer:
        mem.parts["grad_accumulators"] = b.grad_buffer
        # The distributed optimizer's fp32 copy of its shard (state_bytes) exists from its step to the next
        # step's zero_grad, which frees it before the first forward (DistributedOptimizer.zero_grad sets the
        # shard groups' grads to None): the optimizer step's memory holds it, the passes' do not.
        mem.parts["grads"] = 0.0
    elif b.accumulates:
        # FSDP2 accumulates unsharded gradients in its reduce dtype (FSDPParam.to_accumulated_grad_if_needed)
        mem.parts["grad_accumulators"] = lay.grad_reduce_bytes * stage_params(lay, rank, accumulating).total
    mem.parts["activations"] = b.unit * in_flight
    if b.offload_resident:
        mem.parts["offload_buffers"] = b.offload_resident
    transient = b.ac_transient
    saved = b.saved
    if sp.head and lay.pp > 1:
        # The schedule computes each micro-batch's loss at its forward and backpropagates it later: its
        # saved tensors live from one to the other, and only the backward's own buffers are transient.
        mem.parts["losses"] = losses * saved
    if sp.head and loss_live:
        transient = max(transient, b.loss_buffer - saved)
    mem.parts["transient"] = transient
    if lay.pp > 1:
        # torch.distributed.pipelining allocates receive buffers for every micro-batch up front:
        # the stage input in forward and its gradient in backward, for each stage on this rank.
        # The first stage receives no input and the last no gradient. A stack that allocates each receive
        # when it is posted (Layout.pp_recv_up_front False: none in the basis) holds none beyond the activations.
        if b.pp_buffers:
            mem.parts["pp_buffers"] = b.pp_buffers
        if kept:
            # The logits of micro-batches whose loss graph is alive are counted with it already.
            current = losses * b.logits if sp.head else 0.0
            mem.parts["pp_outputs"] = max(0.0, kept * b.unit - current)
    if lay.cp > 1:
        # All-gathered keys and values of one layer, for the whole sequence.
        mem.parts["cp_buffers"] = b.cp_buffers
    stranded = 0.0
    if not b.grads_live:
        # Without accumulation the peak is at the start of backward, before any gradient exists
        # (zero_grad sets them to None); gradients grow only as activations are freed.
        held = mem.parts["activations"] + mem.parts["transient"] + mem.parts.get("losses", 0.0)
        gone = min(mem.parts["grads"], held)
        mem.parts["grads"] -= gone
        if (lay.caching_allocator and uses_fully_shard(lay.fsdp_shard, lay.dp_replicate, lay.dtype)
                and not lay.contiguous_grads):
            # FSDP2 allocates the sharded gradients on its reduce-scatter stream, and the caching
            # allocator keeps a stream's freed blocks for that stream: the previous step's gradients
            # stay reserved, and the activations cannot use them. A stack whose gradients live in one
            # buffer allocated with the model frees none.
            stranded = gone
    live = mem.total
    mem.parts["overhead"] = overheads.context_gib * GIB + fragmentation(lay, overheads) * live + stranded
    return mem


def _recomputed_bytes_per_token(lay: Layout, layer: int) -> float:
    """What block `layer` materialises again before its backward: the whole block's backward set under a
    wrapper that replays the block, or what Megatron-Core's recompute modules dropped (the rest is kept)."""
    conv = _convention(lay)
    whole = recompute_peak_bytes_per_token(lay.spec, lay.seq_len, lay.tp, lay.sp, lay.act_bytes, conv, layer, lay.ep,
                                           lay.moe_imbalance)
    if not isinstance(lay.sac_ops, MegatronRecompute):
        return whole
    return whole - activation_bytes_per_token(lay.spec, lay.seq_len, lay.tp, lay.sp, lay.ac, lay.sac_ops, lay.act_bytes,
                                              conv, layer, lay.ep, lay.moe_imbalance)


def optimizer_step_memory(lay: Layout, rank: int, overheads: Overheads) -> RankMemory:
    """A rank's memory while AdamW steps: its model states, every sharded gradient and the step's
    temporary (OPTIMIZER_STEP_TEMP_BYTES); no activations. The peak of plans that hold few activations
    (full AC on few devices): 20 bytes per local parameter."""
    params = _rank_basis(lay, rank).state[0]
    return _states_and(lay, rank, overheads, optimizer_step=OPTIMIZER_STEP_TEMP_BYTES * params / STATE_BYTES["params"])


def _states_and(lay: Layout, rank: int, overheads: Overheads, **parts: float) -> RankMemory:
    """A rank's memory outside its passes (no activations): its model states, `parts`, and the slack."""
    mem = RankMemory(rank)
    b = _rank_basis(lay, rank)
    mem.parts["params"], mem.parts["grads"], mem.parts["optimizer"] = b.state
    if b.grad_buffer:
        mem.parts["grad_accumulators"] = b.grad_buffer
    mem.parts.update(parts)
    mem.parts["overhead"] = overheads.context_gib * GIB + fragmentation(lay, overheads) * mem.total
    return mem


def training_metric_memory(lay: Layout, rank: int, overheads: Overheads) -> RankMemory | None:
    """The last stage's memory while the trainer's metric losses run (Layout.metric_losses), after the
    backward: model states, every gradient, and one metric's buffers at a time over the still-held logits
    (the fp32 upcast and its log-softmax beside the compute-dtype logits); no activations. None where no
    metric runs on this rank."""
    b = _rank_basis(lay, rank)
    if lay.metric_losses == 0 or not b.sp.head:
        return None
    return _states_and(lay, rank, overheads, fsdp_buffers=b.fsdp_buffers,
                       transient=logit_count(lay) * (lay.act_bytes + 8.0))


def fragmentation(lay: Layout, overheads: Overheads) -> float:
    """The caching allocator's slack on live tensors (reserved / allocated - 1 at the peak)."""
    return getattr(overheads, fragmentation_field(lay, overheads))


def fragmentation_field(lay: Layout, overheads: Overheads) -> str:
    """Which of the profile's overheads prices this layout's allocator slack: the pipelined one where FSDP2
    accumulates gradients across a pipeline's micro-batches, the one it was fitted on (TorchTitan's)."""
    if overheads.pp_memory_fragmentation is not None and pp_accumulates(lay):
        return "pp_memory_fragmentation"
    return "memory_fragmentation"


def _convention(lay: Layout) -> Convention:
    """Which tensors a block keeps on this layout's kernels (eager or compiled, fused or composite norm)."""
    return convention_of(lay.attention_kernel, lay.norm_fp32, lay.compile, lay.float8,
                         te=lay.elementwise_kernels == "megatron")


def activation_unit_bytes(lay: Layout, sp: StageParams) -> float:
    """One in-flight unit: one stage's layers for one micro-batch (the rank's stages' average), plus the
    hidden state handed on."""
    offloaded = offloaded_names(lay.offload_modules)
    layers = sum(n * activation_bytes_per_token(lay.spec, lay.seq_len, lay.tp, lay.sp, lay.ac, lay.sac_ops,
                                                lay.act_bytes, _convention(lay), k, lay.ep, lay.moe_imbalance,
                                                offloaded)
                 for k, n in sp.kinds)
    return lay.tokens_per_micro * (layers / lay.v + lay.hidden_bytes_per_token)


def offloaded_block_bytes(lay: Layout, layer: int) -> float:
    """What Megatron-Core's activation offloading (Layout.offload_modules) moves to host memory and back for
    one micro-batch through block `layer`."""
    offloaded = offloaded_names(lay.offload_modules)
    return lay.tokens_per_micro * offloaded_bytes_per_token(lay.spec, lay.seq_len, lay.tp, lay.sp, lay.ac,
                                                            lay.sac_ops, lay.act_bytes, _convention(lay), layer,
                                                            lay.ep, lay.moe_imbalance, offloaded)


def offload_resident_bytes(lay: Layout, sp: StageParams) -> float:
    """What offloading leaves on the GPU at the peak: the offloaded tensors of one block in flight to host
    memory and of one block back for its backward (Megatron-Core's offload manager reloads a layer group
    ahead of the backward that needs it), the rank's heaviest kind of block, one micro-batch each."""
    if not lay.offload_modules or not sp.kinds:
        return 0.0
    return 2 * max(offloaded_block_bytes(lay, k) for k, _ in sp.kinds)


def weight_pass_share(lay: Layout) -> float:
    """Split-backward (zero-bubble) schedules: what a stage's activation set weighs from its input-gradient
    pass to its weight pass, as a share of itself. PyTorch keeps the whole graph for the weight pass
    (retain_graph) and adds the gradient at every weight's input node, which the weight pass starts
    from (stage_backward_input's param_groups "intermediates"): the block's linear outputs (the
    row-parallel ones at full width, before their reduce) and its two norms' outputs."""
    if lay.schedule not in SPLIT_BACKWARD_SCHEDULES:
        return 1.0
    spec, tp = lay.spec, lay.tp
    outputs = (spec.dim + 2 * spec.kv_dim + 2 * spec.ffn_dim) / tp + 2 * spec.dim + 2 * spec.dim / (tp if lay.sp else 1)
    held = activation_bytes_per_token(spec, lay.seq_len, tp, lay.sp, lay.ac, lay.sac_ops, lay.act_bytes,
                                      _convention(lay))
    return 1.0 + outputs * lay.act_bytes / held


def logit_count(lay: Layout) -> float:
    """One micro-batch's logits on one rank: vocab sharded by loss parallel under TP."""
    return lay.tokens_per_micro * lay.spec.vocab_size / lay.tp


def head_input_bytes(lay: Layout) -> float:
    """The final norm's output the head matmul saves for its backward, one micro-batch."""
    return lay.tokens_per_micro * lay.spec.dim * lay.act_bytes


def logits_bytes(lay: Layout) -> float:
    """One micro-batch's logits as the last stage returns them: in the compute dtype (the fp32
    upcast happens inside the loss)."""
    return logit_count(lay) * lay.act_bytes


def kept_output_units(lay: Layout) -> list[float]:
    """Per stage, what one forward leaves held until the step ends when the schedule returns every
    micro-batch's output (Layout.pp_keeps_outputs), in activation units of the stage's rank: the
    hidden state handed on, or on the last stage the logits."""
    out = []
    for s in range(lay.n_stages):
        sp = stage_params(lay, stage_rank(s, lay.pp, lay.schedule))
        kept = logits_bytes(lay) if s == lay.n_stages - 1 else lay.tokens_per_micro * lay.hidden_bytes_per_token
        out.append(kept / activation_unit_bytes(lay, sp))
    return out


def peak_rank_memory(lay: Layout, rank: int, phases, overheads: Overheads) -> RankMemory:
    """A pipeline rank's peak over the memory phases of its step (ScheduleResult.phases): phases[2j + d]
    = (activation units, kept outputs, live losses) at the highest point while j of its stages hold
    gradient accumulators, d = 1 once the last stage's losses are all backpropagated; None where never
    entered."""
    during = (phase_memory(lay, rank, i, p, overheads) for i, p in heaviest_phases(enumerate(phases)))
    after = (m for m in (training_metric_memory(lay, rank, overheads), optimizer_step_memory(lay, rank, overheads))
             if m is not None)
    return max((*during, *after), key=lambda m: m.total)


def heaviest_phases(indexed) -> list[tuple[int, tuple[float, float, float]]]:
    """Of (phase, load) pairs, those no other outweighs: memory grows with activations held, outputs
    kept, live loss graphs, accumulators (the phase // 2) and a loss still to run (an even phase), so a
    phase that another matches or beats in all five cannot hold the peak."""
    cands = [(i, p) for i, p in indexed if p is not None]

    def beats(b, a) -> bool:
        (i, p), (k, q) = b, a
        return (p[0] >= q[0] and p[1] >= q[1] and p[2] >= q[2] and i // 2 >= k // 2 and i % 2 <= k % 2
                and b != a)

    return [a for a in cands if not any(beats(b, a) for b in cands)]


def passed_phases(lay: Layout) -> tuple:
    """Memory phases (as in ScheduleResult.phases) that every pipeline rank of this layout passes
    through, whatever the schedule's timing: what a lower bound on its peak may price. Its first forward
    done (one set held, nothing accumulated) and its last backward done (every accumulator, nothing
    held, no loss left); with one stage per rank and two or more micro-batches, also one set held with
    every accumulator and a loss still to run (after its first backward either a forward follows, or
    all forwards came first and the other micro-batches are still held). Unpipelined: its one state."""
    if lay.pp == 1:
        return ONE_RANK_PHASES[0]
    n = 2 * lay.v + 2
    phases: list = [None] * n
    phases[0], phases[n - 1] = (1.0, 0.0, 1.0), (0.0, 0.0, 0.0)
    if lay.v == 1 and lay.n_micro >= 2:
        phases[2] = (1.0, 0.0, 1.0)
    return tuple(phases)


def phase_memory(lay: Layout, rank: int, phase: int, load: tuple[float, float, float],
                 overheads: Overheads) -> RankMemory:
    """A pipeline rank's memory in one phase (see peak_rank_memory) at load = (activation units, kept
    outputs, live losses of the last stage)."""
    accumulating = phase // 2 if pp_accumulates(lay) else None
    return rank_memory(lay, rank, load[0], overheads, load[1], accumulating, not phase % 2, load[2])


def pp_accumulates(lay: Layout) -> bool:
    """Whether FSDP2 accumulates this pipelined plan's gradients unsharded, in its reduce dtype, across
    micro-batches.

    Pipelining defers FSDP2's gradient reduction to the last micro-batch (torch.distributed.pipelining's
    stage sets requires_gradient_sync(False)); each FSDP parameter group then casts its unsharded
    gradient to the reduce dtype in its first post-backward and adds into it after
    (FSDPParam.to_accumulated_grad_if_needed). So a stage's accumulators exist from its first weight
    gradient to the step's end, not before: the simulation tracks when each stage reaches that point.
    A stack whose gradients live in one buffer allocated with the model (Layout.contiguous_grads,
    contiguous_grad_bytes) accumulates there instead, for the whole step.
    """
    if lay.pp == 1 or lay.contiguous_grads:
        return False
    return not (lay.fsdp_shard == 1 and (lay.dp_replicate > 1 or lay.dtype == "fp32"))


def _grads_live_at_peak(lay: Layout) -> bool:
    """Sharded gradients exist at the peak when micro-batches accumulate into them. With PP over
    FSDP the accumulation happens in FSDP's unsharded buffers instead (see pp_accumulates)."""
    if lay.n_micro == 1:
        return False
    return not (lay.pp > 1 and lay.fsdp_shard > 1)


def loss_saved_bytes(lay: Layout) -> float:
    """What one micro-batch's loss keeps from its forward to its backward on the last pipeline stage:
    the logits (the stage output the schedule caches for the backward), the log-softmax result the
    cross-entropy saves (fp32; a compiled loss saves per-token statistics instead, negligible), and the
    final norm output the head matmul saved. Transformer Engine's fused loss (Layout.loss_kernel "te")
    writes the logits' gradient over them in its forward and keeps that alone; flash-attn's (loss_kernel
    "xentropy") keeps the logits and a per-token fp32 log-sum-exp."""
    if lay.loss_compiled or lay.loss_kernel in ("te", "xentropy"):
        per = lay.act_bytes
    else:
        per = lay.act_bytes + 4.0 if lay.act_bytes < 4 else 8.0
    return logit_count(lay) * per + head_input_bytes(lay)


def loss_buffer_bytes(lay: Layout) -> float:
    """Logits and cross-entropy buffers at the peak of the loss's backward on the last stage.

    The compute-dtype logits; in fp32 the saved log-softmax, the gradient nll_loss's backward hands it
    and the input gradient log_softmax's backward makes (the upcast is freed after the forward). Also
    the final norm output the head matmul saved. Counted on the runtime's loss with live storages:
    14 bytes per logit in bf16, 16 in fp32 (tests/runtime/test_saved_activations.py). Compiled
    (Layout.loss_compiled), the logits and their gradient in the compute dtype alone, measured the same way.
    Transformer Engine's fused loss (Layout.loss_kernel "te") computes the gradient into the logits' own
    storage and scales it there in backward (timing.TE_LOSS_BYTES): the logits alone. flash-attn's
    (loss_kernel "xentropy", not in place as llm-foundry builds it) writes the gradient into a new buffer in
    the compute dtype: the logits and their gradient, as compiled.
    """
    if lay.loss_kernel == "te":
        return logit_count(lay) * lay.act_bytes + head_input_bytes(lay)
    if lay.loss_compiled or lay.loss_kernel == "xentropy":
        return logit_count(lay) * 2 * lay.act_bytes + head_input_bytes(lay)
    per = lay.act_bytes + 12.0
    if lay.tp > 1:
        # Loss parallel's log-softmax is built from DTensor ops (amax, x - max, exp, sum, log): its
        # backward holds the fp32 result, the incoming gradient, exp(result) and the input
        # gradient at once, ~18-20 bytes per logit with the compute-dtype logits, vs ~14 fused.
        per += 6.0
    return logit_count(lay) * per + head_input_bytes(lay)


def _fsdp_buffers(lay: Layout, sp: StageParams) -> float:
    """Unsharded parameters and gradients FSDP materialises (compute dtype; float8 gathers 1 byte)."""
    if lay.fsdp_shard == 1 and lay.dp_replicate > 1:
        # Replicated (DDP via FSDP2's replicate, or DDP's gradient buckets): one more full
        # parameter-sized buffer in the compute dtype, plus a block's gradients in flight.
        return sp.total * lay.act_bytes + 2 * sp.block * lay.act_bytes
    if lay.fsdp_shard == 1 and lay.dtype == "fp32":
        return 0.0  # no data parallelism and no casts: the parameters are the compute copies
    # FSDP, and a bf16 plan without data parallelism, which the runtime still wraps in fully_shard on
    # one rank for its mixed precision (runtime/data_parallel.py): the same bf16 copies are gathered.
    # float8 parameters are gathered in 1 byte only where there is a group to gather over (runtime/parallelize.py)
    gather_bytes = 1.0 if lay.float8 and lay.fsdp_shard > 1 else lay.act_bytes
    grad_bytes = lay.act_bytes
    # The root unit (final norm, head, and the embedding unless it is a unit of its own, resharded after its
    # forward: Layout.fsdp_embedding_unit) stays unsharded for the whole step. A tied embedding is the head's.
    embedding = 0.0 if lay.fsdp_embedding_unit and not lay.spec.tied_embeddings else sp.embedding
    root = (embedding + sp.head) * lay.act_bytes
    if lay.params_held:
        held = sp.blocks * gather_bytes
        # Under pipelining the fp32 accumulators are counted apart (grad_accumulators); the current
        # block's compute-dtype gradients sit beside them.
        grads = sp.block * grad_bytes if lay.pp > 1 else 2 * sp.block * grad_bytes
        return held + grads + root
    # The current block's parameters plus the prefetched next block's; one block of unsharded
    # gradients, released as its reduce-scatter completes.
    return 2 * sp.block * gather_bytes + sp.block * grad_bytes + root
