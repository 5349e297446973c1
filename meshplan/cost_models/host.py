"""Host-side time of a step: the ops eager PyTorch dispatches and the collective calls it issues, counted from the plan.

Every op costs host time beyond its FLOPs and bytes (Python binding, dispatcher, autograd bookkeeping,
launch). On a CPU the host is the device, so it adds in line, and for a small model it is most of the step.
On a GPU the host runs ahead of the kernels and this hides unless they are small: a pass takes the longer
of its kernels and its host work (host_beyond; Layout.host_ahead), and an eager step of a small model is
bound by it (moe-1b on an H200: ~15 us an op, thousands of ops, the GPU busy a quarter to two fifths of
the step). Compiled blocks on a GPU launch Inductor's fused kernels, a few a pass: not priced there
(timing._add_host).

Ops through a Python `__torch_dispatch__` cost more (interpreted Python per op): DTensor's (sharding
propagation and wrapping, for tensor parallelism and for the optimizer on DTensor parameters) and the
selective-AC policy's dispatch mode (every op of a checkpointed block's forward and replay). Activation checkpointing itself costs Python per op
of the block it wraps (saved-tensor hooks forward, the replay and its unpacking backward): several times an
op's dispatch, so on a CPU a full-AC block's recomputation costs far more than its FLOPs. Every collective
call also waits for its whole group: rank skew, and with more processes than cores the wait for the peers
to be scheduled, which back-to-back micro-benchmarks do not see.

The profile prices each kind (overheads.op_dispatch_s, python_dispatch_s, collective_sync_s, checkpoint_op_s,
sac_op_s; the built-in GPU profiles carry the host costs measured on one H200 machine's host,
benchmarks/host_costs.py). An MoE layer's own ops cost more than a plain op (moe_op_s, MOE_OP_COST_RATIO
below): the routing runs Python between its ops. The counts are of the runtime's own modules
(meshplan/runtime, PyTorch 2.13, eager) per micro-batch, counted with a TorchDispatchMode;
tests/calibrate/test_host_costs.py counts them again, so they cannot drift from the runtime unnoticed.
Pipeline transfers are priced where the schedule simulation counts them (comm.p2p_time).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost_models.layout import Layout, stage_block_kinds
from meshplan.cost_models.moe import moe_host_ops, routed_tensors
from meshplan.cost_models.pipeline import stage_rank
from meshplan.profiles.schema import ClusterProfile, Overheads
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import SINGLE_STAGE_SCHEDULES
from meshplan.specs.rules import GATHER, SPLIT_BACKWARD_SCHEDULES, cp_gather_tiles


@dataclass(frozen=True)
class HostOps:
    """Host work: ops, how many of them also pass through DTensor's Python dispatch, collective calls,
    forward ops run under an AC wrapper (replayed in backward) and under a selective policy's dispatch mode,
    and how many of the ops are an MoE layer's own (each costing overheads.moe_op_s, not op_dispatch_s)."""

    ops: float = 0.0
    python: float = 0.0
    calls: float = 0.0
    checkpointed: float = 0.0
    policy: float = 0.0
    moe: float = 0.0

    # Field by field: dataclasses.astuple deep-copies, and showed in the planner's profile.
    def __add__(self, other: HostOps) -> HostOps:
        return HostOps(self.ops + other.ops, self.python + other.python, self.calls + other.calls,
                       self.checkpointed + other.checkpointed, self.policy + other.policy, self.moe + other.moe)

    def __mul__(self, k: float) -> HostOps:
        return HostOps(self.ops * k, self.python * k, self.calls * k, self.checkpointed * k, self.policy * k,
                       self.moe * k)

    def seconds(self, o: Overheads) -> float:
        return (self.ops * o.op_dispatch_s + self.python * o.python_dispatch_s + self.calls * o.collective_sync_s
                + self.checkpointed * checkpoint_op_s(o) + self.policy * sac_op_s(o) + self.moe * moe_op_extra_s(o))


@dataclass(frozen=True)
class PassCounts:
    """Counts per micro-batch of one block (or the head): forward, backward, and recomputation under AC."""

    forward: float
    backward: float
    recompute: float = 0.0


# Every op of one block. Llama's RoPE (about 25 ops for each of q and k) and decomposed RMSNorm make it the
# larger; recomputation replays the forward plus checkpoint's unpacking of saved tensors (~1.5x the forward).
BLOCK_OPS = {"llama": PassCounts(109, 145, 163), "gpt": PassCounts(39, 93, 78)}
# Of those, the ops on DTensors under TP, by (arch, sequence parallel): the sharded linears' inputs, weights
# and outputs, plus with SP the sequence-sharded norms and residual adds.
TP_DTENSOR_OPS = {("llama", True): PassCounts(42, 102, 86), ("llama", False): PassCounts(28, 66, 54),
                  ("gpt", True): PassCounts(26, 80, 58), ("gpt", False): PassCounts(24, 74, 46)}
# TP collective calls per block. SP: all-gather + reduce-scatter around attention and MLP, mirrored in backward,
# plus the all-reduce of each norm weight's (partial) gradient. Without SP: the row-parallel outputs'
# all-reduces forward, the column-parallel inputs' gradients backward.
TP_CALLS = {True: PassCounts(4, 6, 4), False: PassCounts(2, 2, 2)}
# CP's gather path (gloo; runtime/context_parallel.py): K and V all-gathered, then attention in Python tile
# by tile with an online softmax, backward re-gathers K/V and reduce-scatters their gradients. Per block and
# micro-batch, counted on tiny-4l at seq 128 and 2048 (5 and 18 visible tiles on each of 2 ranks, 2 and 4 of
# them diagonal): a fixed part (the SDPA call it replaces taken off), one set per visible query x key tile
# pair, and the causal mask's 3 more on the diagonal ones. The ring path (NCCL, on GPUs) is not counted
# (block_host).
CP_GATHER_OPS = PassCounts(19, 23)
CP_GATHER_TILE_OPS = PassCounts(44, 69)
CP_GATHER_MASK_OPS = 3
CP_CALLS = PassCounts(2, 2, 2)
# Final norm, output projection and cross-entropy (last stage); the token embedding (first stage). Under TP
# they all run on DTensors (loss_parallel), with SP's reduce-scatter / all-gather at both ends and the final
# norm weight's gradient all-reduce.
HEAD_OPS = PassCounts(14, 28)
HEAD_TP_CALLS = PassCounts(1, 2)
EMBEDDING_OPS = PassCounts(2, 3)
EMBEDDING_TP_CALLS = PassCounts(1, 1)
# FSDP2 / replicate hooks per unit and micro-batch: pre/post forward and backward hooks and the copies into
# and out of the flat communication buffers, a fixed part plus one view per parameter tensor.
UNIT_OPS = 46.0
UNIT_OPS_PER_TENSOR = 1.4
# torch.optim.AdamW (single-tensor implementation, the CPU default) per parameter tensor, zero_grad included;
# on DTensor parameters (DDP's replicate, FSDP, TP) all but two of them are DTensor ops.
OPTIMIZER_OPS_PER_TENSOR = 10.0
OPTIMIZER_DTENSOR_OPS_PER_TENSOR = 8.0


def checkpoint_op_s(o: Overheads) -> float:
    """Per forward op of a checkpointed block: measured (bench/host.py), or for a profile measured before
    it was, the replay's counted ops of a Llama block at op_dispatch_s each."""
    if o.checkpoint_op_s is not None:
        return o.checkpoint_op_s
    llama = BLOCK_OPS["llama"]
    return o.op_dispatch_s * llama.recompute / llama.forward


# What an op of an MoE layer's own work costs the host, over op_dispatch_s (the chain's multiply): the
# routing's Python between ops, its custom autograd functions, sort and grouped GEMM's host paths. Measured
# by benchmarks/host_costs.py as the runtime's MoE blocks' time less the dense blocks', over the ops the MoE
# layer adds (tiny-moe against tiny-4l, same dims; 207 and 337 ops a block on CUDA under PyTorch 2.11), on
# the hosts of two lent H200 machines (2026-11-28, bf16): 2.18 (gpu_session-NVIDIA_H200-19a97d1:
# (337 x 24.87 - 207 x 16.59) / 130 = 38.0 us against the chain's 17.48, its counts taken from the second
# machine's run, that script not yet printing them) and 1.78 (gpu_session-NVIDIA_H200-0a9dd74: 30.43 us
# against 17.11, rounds interleaved); the mean of the two. 1.64-2.90 in three runs on this project's 2-core
# CPU VM (fp32; benchmarks/results/host_costs-CPU-ec3c41f.txt), whose host's speed drifts between the
# chain's timing and the blocks'. Not fitted to any step time.
MOE_OP_COST_RATIO = 1.98


def moe_op_extra_s(o: Overheads) -> float:
    """What an MoE layer's own op costs beyond a plain one: overheads.moe_op_s where the profile measured
    it, else MOE_OP_COST_RATIO times its op_dispatch_s, less op_dispatch_s."""
    moe_op = o.moe_op_s if o.moe_op_s is not None else MOE_OP_COST_RATIO * o.op_dispatch_s
    return max(0.0, moe_op - o.op_dispatch_s)


def sac_op_s(o: Overheads) -> float:
    """Per forward op under a selective policy: measured, or one Python dispatch per op of the forward and
    of the replay (the policy's mode sees both) for a profile measured before it was."""
    if o.sac_op_s is not None:
        return o.sac_op_s
    llama = BLOCK_OPS["llama"]
    return o.python_dispatch_s * (llama.forward + llama.recompute) / llama.forward

def block_tensors(spec: ModelSpec, layer: int | None = None) -> int:
    """Parameter tensors of one block (of block `layer`, an MoE one where the model says): two norms and the
    linears (GPT: with biases, LayerNorm with bias)."""
    linears = 4 + spec.ffn_matrices
    dense = 2 + linears if spec.arch == "llama" else 2 * 2 + 2 * linears
    return dense + (routed_tensors(spec) if layer is not None and spec.is_moe_layer(layer) else 0)


def root_tensors(spec: ModelSpec, first: bool, last: bool) -> int:
    """Parameter tensors outside the blocks: embeddings on the first stage, final norm and output on the last."""
    emb = (1 if spec.arch == "llama" else 2) if first else 0
    head = ((1 if spec.arch == "llama" else 2) + (0 if spec.tied_embeddings else 1)) if last else 0
    return emb + head


def block_host(lay: Layout, layer: int | None = None) -> tuple[HostOps, HostOps, HostOps]:
    """(forward, backward, recompute) host work of one block (block `layer`: an MoE layer adds its own,
    cost_models/moe.py) for one micro-batch."""
    arch = lay.spec.arch
    ops = BLOCK_OPS[arch]
    # The runtime wraps every block under AC (runtime/activation_checkpoint.py), and the wrapper replays its
    # whole forward, whatever a selective policy saves.
    replay = 0.0 if lay.ac == "none" else 1.0
    f, b, r = HostOps(ops.forward), HostOps(ops.backward), HostOps()
    if layer is not None and lay.spec.is_moe_layer(layer):
        (mf, mb), (cf, cb) = moe_host_ops(lay.spec, lay.ep)
        f, b = f + HostOps(mf, calls=cf, moe=mf), b + HostOps(mb, calls=cb, moe=mb)
        # The replay runs the layer's Python again: its ops' extra beyond the wrapper's per-op price.
        r += HostOps(calls=cf, moe=mf) * replay
    if lay.tp > 1:
        dt, calls = TP_DTENSOR_OPS[(arch, lay.sp)], TP_CALLS[lay.sp]
        f += HostOps(python=dt.forward, calls=calls.forward)
        b += HostOps(python=dt.backward, calls=calls.backward)
        r += HostOps(python=dt.recompute, calls=calls.recompute) * replay
    if lay.cp > 1 and lay.cp_attention == GATHER:
        # The gather path's tiles (gloo). PyTorch's ring attention (NCCL) is not counted: its host work,
        # a few ops per ring step, is left unpriced.
        cp_f, cp_b = cp_gather_ops(lay)
        f += HostOps(cp_f, calls=CP_CALLS.forward)
        b += HostOps(cp_b, calls=CP_CALLS.backward)
        r += HostOps(calls=CP_CALLS.recompute) * replay
    r += HostOps(checkpointed=f.ops * replay)
    if lay.ac == "selective":
        # The policy's dispatch mode sees every op of the block's forward and of its replay: half each.
        f += HostOps(policy=f.ops / 2)
        r += HostOps(policy=f.ops / 2)
    return f, b, r


def cp_gather_ops(lay: Layout) -> tuple[float, float]:
    """(forward, backward) ops CP's gather path adds to one block for one micro-batch."""
    visible, diagonal = cp_gather_tiles(lay.seq_len, lay.cp)
    mask = CP_GATHER_MASK_OPS * diagonal
    return (CP_GATHER_OPS.forward + CP_GATHER_TILE_OPS.forward * visible + mask,
            CP_GATHER_OPS.backward + CP_GATHER_TILE_OPS.backward * visible + mask)


def _end_host(lay: Layout, ops: PassCounts, tp_calls: PassCounts) -> tuple[HostOps, HostOps]:
    if lay.tp == 1:
        return HostOps(ops.forward), HostOps(ops.backward)
    # Same counts with or without SP: the head's cost-model memo does not key on it (the difference is one call).
    return (HostOps(ops.forward, python=ops.forward, calls=tp_calls.forward),
            HostOps(ops.backward, python=ops.backward, calls=tp_calls.backward))


def head_host(lay: Layout) -> tuple[HostOps, HostOps]:
    """(forward, backward) host work of the final norm, output projection and loss for one micro-batch."""
    return _end_host(lay, HEAD_OPS, HEAD_TP_CALLS)


def embedding_host(lay: Layout) -> HostOps:
    """Forward plus backward host work of the token embedding for one micro-batch."""
    f, b = _end_host(lay, EMBEDDING_OPS, EMBEDDING_TP_CALLS)
    return f + b


def step_host(lay: Layout, rank: int) -> HostOps:
    """Host work of pipeline rank `rank` outside the blocks' passes: data-parallel hooks and their
    collective calls over the step's micro-batches, the optimizer, and the step's own all-reduces."""
    stages = [s for s in range(lay.n_stages) if stage_rank(s, lay.pp, lay.schedule) == rank]
    kinds = stage_block_kinds(lay.spec, lay.stage_layers)
    held = [(layer, n) for s in stages for layer, n in kinds[s]]  # (representative layer, blocks of its kind)
    blocks = sum(n for _, n in held)
    first, last = 0 in stages, lay.n_stages - 1 in stages
    tensors = sum(n * block_tensors(lay.spec, layer) for layer, n in held) + root_tensors(lay.spec, first, last)
    dtensor_params = lay.dp > 1 or lay.fsdp_shard > 1 or lay.tp > 1
    host = HostOps(OPTIMIZER_OPS_PER_TENSOR * tensors,
                   python=OPTIMIZER_DTENSOR_OPS_PER_TENSOR * tensors if dtensor_params else 0.0)
    # Under EP each MoE layer's routed experts are an FSDP2 unit of their own (runtime/data_parallel.py): its
    # hooks run, and it communicates where EP leaves more than one rank to shard over (rules.ep_fsdp).
    expert_units = sum(n for layer, n in held if lay.spec.is_moe_layer(layer)) if lay.ep > 1 else 0
    units = blocks + (1 if first or last else 0)
    host += _data_parallel_host(lay, units + expert_units, len(stages), tensors,
                                silent_units=expert_units if lay.routed_fsdp_shard == 1 else 0)
    # The loss all-reduce; with PP also the gradient-norm all-reduce across stages.
    return host + HostOps(calls=1 + (lay.pp > 1))


def _data_parallel_host(lay: Layout, fsdp_units: int, parts: int, tensors: int, silent_units: int = 0) -> HostOps:
    """FSDP2 / HSDP / replicate hooks and calls; gradients are reduced lay.grad_reductions times a step.
    `silent_units` of the units run their hooks over a group of one rank: no collective."""
    m = lay.n_micro
    if lay.fsdp_shard > 1:
        ops = m * (fsdp_units * UNIT_OPS + tensors * UNIT_OPS_PER_TENSOR)
        units = fsdp_units - silent_units
        reduce_calls = lay.grad_reductions * units * (1 + (lay.dp_replicate > 1))  # reduce-scatter, HSDP's all-reduce
        if lay.pp > 1:
            return HostOps(ops, calls=m * units + reduce_calls)
        regather = units - 1 if lay.reshard_after_forward else 0  # the last block stays unsharded
        return HostOps(ops, calls=m * (units + regather) + reduce_calls)
    if lay.dp_replicate > 1:
        ops = m * (parts * UNIT_OPS + tensors * UNIT_OPS_PER_TENSOR)
        return HostOps(ops, calls=parts * lay.grad_reductions)
    return HostOps()


def pipeline_action_s(lay: Layout, o: Overheads) -> tuple[float, float]:
    """Host time of one pipeline action on the runtime the plan's schedule runs on: (a forward or backward,
    a weight pass: 0 where the schedule folds it into the backward); 0 without PP."""
    if lay.pp == 1:
        return 0.0, 0.0
    act = o.pipeline_action_s if lay.schedule in SINGLE_STAGE_SCHEDULES else o.pipeline_multi_action_s
    return act, (act if lay.schedule in SPLIT_BACKWARD_SCHEDULES else 0.0)


def pipeline_actions(lay: Layout, rank: int) -> int:
    """Actions pipeline rank `rank` runs in a step: forward and backward (and weight, where the schedule
    splits it) of each of its stages for every micro-batch."""
    stages = sum(stage_rank(s, lay.pp, lay.schedule) == rank for s in range(lay.n_stages))
    return lay.n_micro * stages * (3 if lay.schedule in SPLIT_BACKWARD_SCHEDULES else 2)


def priced(prof: ClusterProfile) -> bool:
    """Whether the profile prices host work at all (the built-in GPU profiles do not)."""
    o = prof.overheads
    return bool(o.op_dispatch_s or o.python_dispatch_s or o.collective_sync_s or o.checkpoint_op_s or o.sac_op_s
                or o.pipeline_action_s or o.pipeline_multi_action_s)


def host_beyond(device_s: float, host_s: float) -> float:
    """What a pass's host work adds where the host runs ahead of the kernels (a GPU): the kernels queue
    while the host issues the next ones, so a pass takes the longer of the two. Per block pass, as a
    sync-free eager step runs them (the H200 moe-1b rows, benchmarks/plans/gpu_rows.csv)."""
    return max(0.0, host_s - device_s)


def host_added(lay: Layout, device_s: float, host_s: float) -> float:
    """Seconds a pass's host work adds to its kernels' `device_s`: none where the counts are not the stack's
    modules (Layout.host_counted), all of it in line on a CPU, what outlasts the kernels on a GPU."""
    if not lay.host_counted:
        return 0.0
    return host_beyond(device_s, host_s) if lay.host_ahead else host_s


def step_host_time(lay: Layout, prof: ClusterProfile, rank: int) -> float:
    """The optimizer's and the data-parallel hooks' host work, in line on a CPU. On a GPU 0: the optimizer
    runs foreach kernels there (a few launches per group of tensors, not OPTIMIZER_OPS_PER_TENSOR ops per
    tensor), and the hooks run between block passes whose kernels they queue behind."""
    if lay.host_ahead or not lay.host_counted or not priced(prof):
        return 0.0
    return step_host(lay, rank).seconds(prof.overheads)
