"""A complete plan's numbers in one place: degrees, micro-batches, stage splits and dtypes."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.cost_models import constants
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.cost_models.stacks import MegatronRecompute, stack_changes
from meshplan.specs.rules import (COMPOSITE, NCCL, cp_attention_kind, cp_kv_repeated, ep_fsdp, grad_reduce_dtype,
                                  loss_compiled, profile_backend, rms_norm_kernel)

# Bytes per element of each compute dtype (tf32 is stored as fp32).
DTYPE_BYTES = {"fp8": 1.0, "bf16": 2.0, "fp16": 2.0, "tf32": 4.0, "fp32": 4.0}


@dataclass(frozen=True)
class Layout:
    """Everything the cost model needs from a complete plan, derived once."""

    spec: ModelSpec
    gpus: int
    seq_len: int
    global_batch: int
    micro_batch: int
    dtype: str
    dp_replicate: int
    dp_shard: int
    tp: int
    sp: bool
    async_tp: bool
    pp: int
    schedule: str
    v: int
    stage_layers: tuple[int, ...]
    cp: int
    ac: str
    # op kinds saved by selective AC (None: DEFAULT_SAC_OPS), or a named policy: TorchTitan's op policy,
    # Megatron-Core's recompute modules (stacks.py)
    sac_ops: tuple[str, ...] | str | MegatronRecompute | None
    float8: bool
    reshard_after_forward: bool
    compile: bool
    # cudnn (cuDNN's fused attention, what meshplan's runtime runs through SDPA and Transformer Engine's choice
    # on Hopper and newer: the profile's `kernel: cudnn` points where it has them, else its untagged ones) |
    # flash (FlashAttention-2, or the kernel the profile's untagged points measure: TorchTitan's published runs,
    # stacks.py) | triton (FlashAttention in Triton, MosaicML's MPT runs: constants.MODEL.triton_attention_*) |
    # eager (materialised scores, Megatron 2021). The default is meshplan's runtime's, as every default here.
    attention_kernel: str = "cudnn"
    # pytorch (eager ops, fused by torch.compile when `compile`) | megatron (Megatron-LM's fused LayerNorm,
    # bias-GeLU and bias-dropout-add kernels)
    elementwise_kernels: str = "pytorch"
    # Whether the optimizer steps with torch.optim's foreach AdamW and clips with a foreach scale (meshplan's
    # runtime, TorchTitan) or with one fused kernel, scaling only when clipping (Megatron-Core): the bytes it
    # moves per parameter (constants.MODEL.adamw_*; estimate._optimizer_time).
    optimizer_foreach: bool = True
    # When data-parallel gradients are reduced while micro-batches accumulate: every_microbatch (FSDP2,
    # HSDP and composable DDP as the runtime and TorchTitan run them) | last_microbatch (Megatron's DDP).
    grad_sync: str = "every_microbatch"
    # Bytes per gradient element the data-parallel reductions move, and the buffers gradients accumulate in
    # hold (memory.contiguous_grad_bytes, FSDP2's pipelined accumulators): 4 where gradients are reduced in
    # fp32 (FSDP2's reduce_dtype as the runtime and TorchTitan set it; Megatron-LM forces fp32 all-reduce
    # under bf16), 2 where the stack reduces in bf16 (the plan's memory.grad_reduce_dtype, rules.
    # grad_reduce_dtype; FSDP1 with a bf16 MixedPrecision reduce_dtype: IBM's fms-fsdp bfSixteen, Composer's PURE).
    grad_reduce_bytes: float = 4.0
    # What compute the data-parallel collectives run under (estimate.data_parallel_comm): prefetch (FSDP1
    # and FSDP2 gather the next unit and reduce the last one beside each unit's compute, every micro-batch:
    # the runtime, TorchTitan, Composer) | buckets (Megatron-Core's overlap_param_gather and
    # overlap_grad_reduce: the gathers under the first micro-batch's forward, the reductions under the
    # last one's backward) | none (Megatron-LM's local DDP of 2021-22: one all-reduce after the backward).
    dp_overlap: str = "prefetch"
    # Whether FSDP copies each unit's parameters out of the all-gather's flat output and its gradients into
    # the reduce-scatter's flat input on the compute stream (FSDP2's per-parameter sharding: fully_shard's
    # foreach_all_gather_copy_out, split_with_sizes_copy after the gather's wait, and
    # foreach_reduce_scatter_copy_in, chunk_cat into the reduce dtype before the reduce-scatter stream
    # waits; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): meshplan's runtime, TorchTitan,
    # OLMo-core. FSDP1's flat parameter is gathered into the buffer its parameters view and its gradients
    # already lie flat (Composer, fms-fsdp): no copies. estimate.data_parallel_comm prices them.
    fsdp_copies: bool = True
    # Whether a bf16 plan without FSDP still runs fully_shard on a one-rank mesh for its mixed precision
    # (meshplan's runtime, runtime/data_parallel.py; specs/rules.py uses_fully_shard): no collective, but each
    # unshard casts the fp32 parameters to the compute dtype and copies them into the unsharded ones, and each
    # reduction copies the gradients in (FSDPParamGroup.wait_for_unshard's world_size == 1 branch,
    # foreach_reduce's copy-in; torch 2.13). TorchTitan runs one device under autocast instead, and has no
    # mixed precision for TP or PP without FSDP. estimate.one_rank_copy_time prices them.
    fsdp_one_rank: bool = True
    # Whether full AC's replay stops once every tensor the forward saved is recomputed (torch.utils.checkpoint's
    # non-reentrant implementation, set_checkpoint_early_stop, on by default from PyTorch 2.1: meshplan's runtime
    # and TorchTitan through checkpoint_wrapper, Composer and fms-fsdp through CheckpointImpl.NO_REENTRANT), so a
    # dense block's last matmul is not run again (activations.replay_stops_early), or runs the whole forward again
    # (Megatron's CheckpointFunction).
    checkpoint_early_stop: bool = True
    # Whether a float8 plan's weights are cast once a step, their float8 copies kept across its micro-batches
    # (Transformer Engine's weight cache, which Megatron-Core refreshes at each step's first micro-batch), or at
    # every forward (torchao's Float8Linear, meshplan's runtime and TorchTitan). timing.float8_cast_elems.
    float8_weight_cache: bool = False
    # Whether the pipeline schedule keeps every micro-batch's stage output until the step ends (the
    # logits on the last stage): torch.distributed.pipelining before `return_outputs` (TorchTitan
    # 2024). The runtime passes return_outputs=False.
    pp_keeps_outputs: bool = False
    # Context parallelism only: whether keys and values reach attention expanded to every query head
    # (TorchTitan 2024's repeat_kv before SDPA), so that CP gathers, holds and merges them at that width.
    kv_repeated: bool = False
    # How CP computes attention: gather (all-gather K/V, block-causal chunks merged in fp32: meshplan's
    # runtime on gloo) | ring (PyTorch's context_parallel: a ring step per rank, each merged in fp32;
    # meshplan's runtime on NCCL, and TorchTitan). runtime_paths() sets it from the cluster's backend.
    cp_attention: str = "gather"
    # How an eager Llama block's RMSNorm runs (timing._pytorch_elementwise_bytes): composite (fp32 ops,
    # constants.MODEL.norm_passes: TorchTitan's RMSNorm module, meshplan's runtime) | fused (one kernel
    # each way: TorchTitan's Triton fused_rmsnorm of 2024, norm_type "fused_rmsnorm"). A published row's
    # override; plans do not choose it.
    norm_kernel: str = "composite"
    # Whether RMSNorm saves fp32 copies for its backward (no fused kernel on the backend, sub-fp32 dtype):
    # runtime_paths() sets it from the cluster's backend (specs/rules.py rms_norm_kernel).
    norm_fp32: bool = False
    # Expert parallelism (specs/rules.ep_reason) and the busiest EP rank's routed load over the mean
    # (moe.routing): 1 where routing is force-balanced; layout_of sets the dropless default for MoE models.
    ep: int = 1
    moe_imbalance: float = 1.0
    # Whether the stack runs one micro-batch's dispatch and combine all-to-alls under another's compute
    # (Megatron-Core's overlap_moe_expert_parallel_comm, opt-in; meshplan's runtime and TorchTitan issue
    # them in line): timing.ep_exposed prices what is left.
    ep_overlap: bool = False
    # Whether the stack runs an MoE layer's shared experts on their own stream beside the dispatch and combine
    # all-to-alls (Megatron-Core's moe_shared_expert_overlap, opt-in; meshplan's runtime and TorchTitan run them
    # in line): timing.shared_expert_exposed prices what is left.
    shared_expert_overlap: bool = False
    # How dispatch and combine cross nodes (moe.ep_comm_forward): all_to_all (NCCL's all-to-all, a copy
    # per token-expert pair: meshplan's runtime, TorchTitan, Megatron-Core's alltoall dispatcher) |
    # deepep (DeepEP's normal internode kernels, Megatron-Core's flex dispatcher with the deepep
    # backend: a token crosses the network once per destination node). Inside one NVLink domain the two
    # cost the same. The plan's parallel.ep_dispatch (specs/rules.py ep_dispatch_reason).
    ep_dispatch: str = "all_to_all"
    # Multi-token-prediction modules the stack runs after the last block, on the last pipeline stage
    # (DeepSeek-V3's MTP; Megatron-Core's mtp_num_layers): each a block of the last layer's kind behind a
    # projection of the normed hidden state and the next token's embedding (2 dim -> dim), then its own
    # pass through the output head and loss (stage_kinds places the blocks; timing.mtp_extra_time and
    # memory.stage_params price the rest). The plan's training.mtp_layers; meshplan's runtime and
    # TorchTitan run none (specs/rules.py mtp_reason).
    mtp_layers: int = 0
    # Whether FSDP shards the token embedding as a unit of its own, resharded after its forward (TorchTitan
    # since 2025-07-28), so that it is not unsharded at the backward's peak; else the root unit keeps it
    # unsharded with the final norm and the head for the whole step (meshplan's runtime; TorchTitan before).
    # memory._fsdp_buffers.
    fsdp_embedding_unit: bool = False
    # Whether the stack compiles the loss where it compiles the blocks (meshplan's runtime does, by
    # specs/rules.py loss_compiled; TorchTitan 2024 compiled the blocks alone): see loss_compiled.
    compiles_loss: bool = True
    # The cross-entropy kernel where the loss runs eager: pytorch (the upcast, log-softmax and gather as
    # separate ops; Megatron-Core's unfused and "native" fused losses, which materialize fp32 logits alike,
    # move about as much) | te (Transformer Engine's fused Triton cross-entropy, in place over the logits:
    # Megatron-Core's cross_entropy_fusion_impl "te", which Megatron-Bridge's performance scripts set) |
    # xentropy (flash-attn's CUDA cross-entropy, apex's xentropy kernel in the compute dtype, its gradient
    # in a new logits-sized buffer: llm-foundry's MPT loss_fn default "fused_crossentropy").
    # timing.loss_times and memory.loss_buffer_bytes price it.
    loss_kernel: str = "pytorch"
    # AdamW's two moments per parameter, and a main gradient, in bytes: fp32 (torch.optim's AdamW; Megatron-Core's
    # default), or bf16 under Megatron-Core's precision-aware optimizer (the plan's memory.optimizer_state_dtype
    # and memory.main_grads_dtype): memory.rank_memory's optimizer and gradient parts, estimate's optimizer step.
    optimizer_state_bytes: float = 8.0
    main_grad_bytes: float = 4.0
    # Modules whose inputs Megatron-Core offloads to host memory between forward and backward (the plan's
    # memory.offload_modules; activations.OFFLOADED_INPUTS): not resident while in flight (memory.py), and
    # moved over the device's host link beside the block's passes (timing._add_offload).
    offload_modules: tuple[str, ...] = ()
    # Eager cross-entropies the trainer runs over each micro-batch's logits after its backward, forward
    # only, for its training metrics: Composer (0.14-0.17, Trainer._train_microbatch -> _eval_train_metrics)
    # updates every train metric at every micro-batch, and llm-foundry's MPT has two (LanguageCrossEntropy,
    # LanguagePerplexity: torch.nn.CrossEntropyLoss under autocast, the fp32 upcast and log-softmax) unless
    # use_train_metrics is set false. timing.head_time and memory.training_metric_memory price them.
    metric_losses: int = 0
    # Whether gradients accumulate in place in one buffer allocated with the model (Megatron-Core's
    # distributed optimizer), not in tensors each micro-batch allocates and frees (FSDP2): the allocator slack
    # fitted on FSDP2's accumulation under pipelining (memory.fragmentation_field) does not apply.
    contiguous_grads: bool = False
    # Whether tensors live in CUDA's caching allocator, whose per-stream pools keep FSDP2's freed gradients
    # reserved (memory.rank_memory); runtime_paths() sets it from the backend (not on gloo's CPU ranks).
    caching_allocator: bool = True
    # Whether the host runs ahead of the kernels (a GPU: each pass takes the longer of its kernels and its
    # host work, host.py) or is the device (gloo's CPU ranks: host work adds in line); runtime_paths() sets
    # it from the backend.
    host_ahead: bool = True
    # Whether host.py's op counts describe the stack's modules (meshplan's runtime; TorchTitan's are alike:
    # eager PyTorch, DTensor TP). Megatron's own modules (its fused kernels, no DTensor) are not counted,
    # and their host work is left unpriced.
    host_counted: bool = True
    # Whether the stack syncs host and device in every MoE layer (the token counts per expert) and runs its
    # experts eager: each MoE layer pass then takes the longer of its kernels and its experts' host work
    # (overheads.moe_expert_host_s per local expert; timing._add_moe_host). Megatron-Core's dropless
    # dispatchers do (stacks.py); its sync-free recipes under full-iteration CUDA graphs do not
    # (published.full_iteration_graphs). meshplan's runtime has no such sync, and host.py counts its ops.
    moe_host_sync: bool = False
    # Whether the stack runs an MoE layer's grouped MLP through one fused kernel chain, its activation's
    # clamp and its down projection's bias inside it (Transformer Engine's op fuser: Megatron-Core's
    # use_transformer_engine_op_fuser, off by default, on in Megatron-Bridge's full-iteration MXFP8
    # recipes), not as the eager passes moe.megatron_expert_eager_elems prices.
    moe_fused_mlp: bool = False
    # Whether an MoE layer all-gathers its sequence shard over TP before routing and reduce-scatters its output
    # (TorchTitan's PrepareModuleInputOutput around the layer), or each TP rank routes its own shard, only the
    # shared experts gathering (meshplan's runtime, Megatron-Core with expert TP 1): timing._moe_gathers_over_tp.
    moe_tp_gather: bool = False
    # Whether ring attention overlaps each of its cp - 1 K/V exchanges with a step of attention (Transformer
    # Engine's P2P ring, Megatron-Core's) or runs them in line (PyTorch's ring attention as the runtime and
    # TorchTitan run it): timing.cp_exposed.
    cp_ring_overlap: bool = False
    # Whether the stack's ring hands K/V on at their KV heads whatever the runtime's path would (Transformer
    # Engine's P2P ring, which Megatron-Core feeds grouped K/V): runtime_paths() then leaves kv_repeated off.
    cp_kv_grouped: bool = False
    # Whether sequence-parallel TP's all-gathers and reduce-scatters run chunk by chunk under the GEMMs they
    # feed and drain (Transformer Engine's userbuffers comm-GEMM overlap, Megatron-Core's tp_comm_overlap):
    # timing._async_tp_exposed.
    tp_comm_overlap: bool = False
    # Whether pipeline receive buffers are allocated up front for every micro-batch (torch.distributed.pipelining,
    # which meshplan's runtime and TorchTitan run: memory.rank_memory's pp_buffers) or per transfer, the
    # received tensor becoming the stage input its activations already count (Megatron-Core's p2p_communication
    # allocates each receive in _communicate).
    pp_recv_up_front: bool = True
    # Whether RoPE rotates q and k as complex numbers (view_as_complex, a complex multiply, view_as_real:
    # TorchTitan's Llama) rather than with real cos/sin (meshplan's runtime, OLMo-core, Megatron-Core's
    # fused kernel). torch.compile's Inductor generates no code for complex dtypes and runs the multiply as
    # an eager fallback kernel, so a compiled block pays it in fp32 (timing.COMPILED_COMPLEX_ROPE_PASSES).
    rope_complex: bool = False
    # The dtype attention's kernels run in, where a published row's recipe ran them in another than the
    # block's (Megatron-Bridge's full-iteration MXFP8 recipes set fp8_dot_product_attention: "mxfp8",
    # compute.ATTENTION_DTYPES); None: the plan's dtype, as meshplan's runtime runs SDPA.
    attention_dtype: str | None = None

    @property
    def loss_compiled(self) -> bool:
        """Whether the loss runs compiled: its buffers and its passes over the logits."""
        return self.compiles_loss and loss_compiled(self.compile, self.tp)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def with_(self, **changes) -> "Layout":
        """dataclasses.replace without re-running __init__ (the planner makes ~10^5 of these)."""
        new = object.__new__(Layout)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    @property
    def fsdp_shard(self) -> int:
        """Ranks a parameter is sharded over: CP ranks hold the same weights, so FSDP shards across them too."""
        return self.dp_shard * self.cp

    @property
    def routed_fsdp_shard(self) -> int:
        """Ranks the routed experts are FSDP-sharded over (rules.ep_fsdp): fsdp_shard without EP."""
        return ep_fsdp(self.ep, self.dp_shard, self.cp, self.tp)

    @property
    def n_micro(self) -> int:
        """Micro-batches per optimizer step on each data-parallel rank (PP micro-batches or accumulation)."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def params_held(self) -> bool:
        """Whether gathered parameters stay unsharded from the first forward to the step's end: under a
        pipeline schedule (FSDP2 keeps them across micro-batches) or without reshard after forward."""
        return self.pp > 1 or not self.reshard_after_forward

    @property
    def grad_reductions(self) -> int:
        """Data-parallel gradient reductions per step: a pipeline schedule holds the sync back to the
        last micro-batch; without one, FSDP2 and DDP reduce after every backward unless told not to."""
        return 1 if self.pp > 1 or self.grad_sync == "last_microbatch" else self.n_micro

    @property
    def tokens_per_micro(self) -> int:
        """Tokens one rank processes per micro-batch (after CP splits the sequence)."""
        return self.micro_batch * self.seq_len // self.cp

    @property
    def act_bytes(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def hidden_bytes_per_token(self) -> float:
        """The hidden state one token carries between blocks and stages (sequence-sharded under SP)."""
        return self.spec.dim * self.act_bytes / (self.tp if self.sp else 1)

    @property
    def cp_kv_dim(self) -> int:
        """Width of the keys (or values) context parallelism moves per token, before TP: every query head's
        where they are expanded to the query heads, else the KV heads'."""
        return self.spec.q_dim if self.kv_repeated else self.spec.kv_dim

    @property
    def n_stages(self) -> int:
        return self.pp * self.v


@lru_cache(maxsize=65536)
def stage_block_kinds(spec: ModelSpec, stage_layers: tuple[int, ...]) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per stage, (representative layer, count) for each kind of block it holds (ModelSpec.block_kind):
    the stages hold consecutive layers, `stage_layers[s]` each. A uniform model has one kind."""
    out, start = [], 0
    for n in stage_layers:
        counts: dict[int, int] = {}
        for layer in range(start, start + n):
            r = spec.representative_layer(layer)
            counts[r] = counts.get(r, 0) + 1
        out.append(tuple(sorted(counts.items())))
        start += n
    return tuple(out)


def stage_kinds(spec: ModelSpec, stage_layers: tuple[int, ...], mtp: int = 0) -> tuple[tuple[tuple[int, int], ...], ...]:
    """stage_block_kinds plus the model's multi-token-prediction modules (Layout.mtp_layers): each a block
    of the last layer's kind, on the last stage (Megatron-Core builds them after the final block). Their
    projections and second head are not blocks: timing.mtp_extra_time and memory.stage_params price them."""
    kinds = stage_block_kinds(spec, stage_layers)
    if not mtp:
        return kinds
    last = dict(kinds[-1])
    k = spec.representative_layer(spec.n_layers - 1)
    last[k] = last.get(k, 0) + mtp
    return kinds[:-1] + (tuple(sorted(last.items())),)


def representative_layers(spec: ModelSpec) -> tuple[int, ...]:
    """One layer of each block kind: the ones the cost model prices."""
    return tuple(layers[0] for layers in spec.block_kinds().values())


@lru_cache(maxsize=4096)
def even_split(n_layers: int, n_stages: int) -> tuple[int, ...]:
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (1 if i < extra else 0) for i in range(n_stages))


def default_imbalance(spec: ModelSpec) -> float:
    """The routed load the cost model assumes of a plan: dropless routing with a real router for an MoE
    model (constants.MODEL.moe_dropless_imbalance); validation sets 1 for force-balanced runs."""
    return constants.MODEL.moe_dropless_imbalance if spec.is_moe else 1.0


def runtime_paths(lay: Layout, prof) -> Layout:
    """`lay` with the CP attention path and the RMSNorm kernel meshplan's runtime takes on the profile's
    backend (ring and fused on NCCL, gather and fp32 composite on gloo; specs/rules.py), so the estimate
    prices what `meshplan run` runs."""
    backend = profile_backend(prof.provenance)
    kind = cp_attention_kind(backend)
    norm_fp32 = lay.spec.arch == "llama" and lay.dtype != "fp32" and rms_norm_kernel(backend) == COMPOSITE
    kv_repeated = cp_kv_repeated(kind) and not lay.cp_kv_grouped
    return lay.with_(cp_attention=kind, kv_repeated=kv_repeated, norm_fp32=norm_fp32,
                     caching_allocator=backend == NCCL, host_ahead=backend == NCCL)


def layout_of(plan: Plan) -> Layout:
    p, t, m = plan.parallel, plan.training, plan.memory
    if not plan.is_complete():
        raise ValueError(f"plan has auto fields: {plan.auto_fields()}")
    pp, v = p.pp, (p.pp_virtual_stages if p.pp > 1 else 1)
    layers = tuple(p.pp_layers) if p.pp_layers else even_split(plan.model.n_layers, pp * v)
    sac_ops = tuple(m.sac_ops) if m.sac_ops is not None else None
    modules = tuple(m.recompute_modules) if m.recompute_modules else None
    lay = Layout(
        spec=plan.model, gpus=plan.gpus, seq_len=t.seq_len, global_batch=t.global_batch,
        micro_batch=t.micro_batch, dtype=t.dtype, dp_replicate=p.dp_replicate, dp_shard=p.dp_shard,
        tp=p.tp, sp=bool(p.sequence_parallel) and p.tp > 1, async_tp=bool(p.async_tp) and p.tp > 1,
        pp=pp, schedule=p.pp_schedule if pp > 1 else "1F1B", v=v, stage_layers=layers, cp=p.cp,
        ac=m.activation_checkpointing, sac_ops=sac_ops,
        float8=bool(m.float8), reshard_after_forward=bool(m.reshard_after_forward), compile=bool(plan.compile),
        ep=int(p.ep), moe_imbalance=default_imbalance(plan.model), mtp_layers=int(t.mtp_layers),
        ep_dispatch=p.ep_dispatch, ep_overlap=bool(p.ep_overlap),
        shared_expert_overlap=bool(p.shared_expert_overlap),
    )
    lay = lay.with_(**stack_changes(plan.stack, lay.ac, sac_ops, modules),
                    optimizer_state_bytes=2 * DTYPE_BYTES[m.optimizer_state_dtype or "fp32"],
                    main_grad_bytes=DTYPE_BYTES[m.main_grads_dtype or "fp32"],
                    grad_reduce_bytes=DTYPE_BYTES[grad_reduce_dtype(plan.stack, m.grad_reduce_dtype, t.dtype)],
                    offload_modules=tuple(m.offload_modules or ()))
    if t.cross_entropy_fusion is not None:
        # Megatron-Core's named loss (rules.CROSS_ENTROPY_FUSIONS): Transformer Engine's fused kernel, or
        # priced as the eager loss, as its own fused one is (it upcasts the logits and keeps fp32 exponentials).
        lay = lay.with_(loss_kernel="te" if t.cross_entropy_fusion == "te" else "pytorch")
    return lay
