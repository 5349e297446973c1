"""What each software stack runs differently from meshplan's runtime, as the estimate prices it (plan
field `stack`; the names are specs/rules.py STACKS). Each feature names its source; a stack that differs
in nothing else is priced as meshplan's runtime. The published rows' own versions of a stack (TorchTitan
as of December 2024, say) add what that version did (published.py layout overrides)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from meshplan.specs.rules import MEGATRON_CORE, MEGATRON_DEFAULT_RECOMPUTE, MESHPLAN, RECOMPUTE_MODULES, TORCHTITAN

# TorchTitan's default selective policy ("op"), by name: activations.saved_names lists what it saves.
TORCHTITAN_OP_POLICY = "torchtitan_op"


@dataclass(frozen=True)
class MegatronRecompute:
    """Megatron-Core's selective recompute as a layout's selective policy (Layout.sac_ops): the modules
    (specs/rules.py RECOMPUTE_MODULES; the plan's memory.recompute_modules) whose forward runs again in
    backward, every other output kept (activations.megatron_recompute_drops; timing.megatron_recompute_time)."""

    modules: tuple[str, ...]


@dataclass(frozen=True)
class Stack:
    # What `activation_checkpointing: selective` saves when the plan lists no sac_ops: None for
    # meshplan's DEFAULT_SAC_OPS, else an op-kind tuple or a named policy (activations.saved_names); a stack
    # that recomputes modules (recomputes_modules) takes MegatronRecompute's instead.
    selective_default: tuple[str, ...] | str | None
    compiles_loss: bool  # the loss compiled with the blocks (Layout.compiles_loss)
    grad_sync: str  # every_microbatch | last_microbatch (Layout.grad_sync)
    sources: tuple[str, ...]
    # pytorch (eager ops, fused by torch.compile where the plan compiles) | megatron (the stack's own fused
    # kernels, compiled or not): Layout.elementwise_kernels
    elementwise_kernels: str = "pytorch"
    dp_overlap: str = "prefetch"  # Layout.dp_overlap
    fsdp_copies: bool = True  # Layout.fsdp_copies: FSDP2's per-parameter copy-out and copy-in
    fsdp_one_rank: bool = True  # Layout.fsdp_one_rank: fully_shard on one rank, for mixed precision alone
    checkpoint_early_stop: bool = True  # Layout.checkpoint_early_stop: full AC's replay stops at the last saved tensor
    host_counted: bool = True  # Layout.host_counted: host.py's op counts are of eager PyTorch modules
    optimizer_foreach: bool = True  # Layout.optimizer_foreach: torch.optim's foreach AdamW, not a fused one
    moe_host_sync: bool = False  # Layout.moe_host_sync: a host sync in every MoE layer, experts eager
    moe_tp_gather: bool = False  # Layout.moe_tp_gather: an MoE layer gathers its sequence over TP
    cp_ring_overlap: bool = False  # Layout.cp_ring_overlap: each ring step's K/V exchange under a step's attention
    cp_kv_grouped: bool = False  # Layout.cp_kv_grouped: the ring moves K/V at their KV heads, not expanded
    tp_comm_overlap: bool = False  # Layout.tp_comm_overlap: SP's collectives chunk by chunk under their GEMMs
    attention_kernel: str = "cudnn"  # Layout.attention_kernel
    pp_recv_up_front: bool = True  # Layout.pp_recv_up_front: a receive buffer per micro-batch, allocated up front
    rope_complex: bool = False  # Layout.rope_complex: RoPE as a complex multiply, which Inductor leaves eager
    float8_weight_cache: bool = False  # Layout.float8_weight_cache: float8 weights cast once a step
    fsdp_embedding_unit: bool = False  # Layout.fsdp_embedding_unit: the embedding a fully_shard unit of its own
    contiguous_grads: bool = False  # Layout.contiguous_grads: gradients accumulate in one preallocated buffer
    # Whether selective AC recomputes named modules (MegatronRecompute, the plan's memory.recompute_modules)
    # rather than saving op kinds (memory.sac_ops)
    recomputes_modules: bool = False
    # Whether the plan's `compile` (torch.compile of the blocks) applies: a stack that runs its own fused
    # kernels and does not compile its model prices a plan the same either way (Layout.compile false)
    torch_compile: bool = True


STACKS: dict[str, Stack] = {
    MESHPLAN: Stack(None, True, "every_microbatch",
                    ("meshplan's runtime (docs/runtime.md)",
                     "PyTorch's SDPA runs cuDNN's fused attention on Hopper and newer: PyTorch 2.11 on a lent H200 ran "
                     "aten::_cudnn_attention_forward and _backward (benchmarks/results/"
                     "ops-llama3.2-3b-planner_1-NVIDIA_H200-9816110.txt)",
                     "a bf16 plan without FSDP runs fully_shard on a one-rank mesh for its mixed precision "
                     "(runtime/data_parallel.py), which casts and copies the parameters at each unshard and copies "
                     "the gradients in at each reduction: the same H200 profile ran aten::_chunk_cat (9.8 ms) and "
                     "device-to-device copies (12.4 ms) in a 572 ms step of one GPU")),
    TORCHTITAN: Stack(
        TORCHTITAN_OP_POLICY, True, "every_microbatch",
        ("selective AC 'op': save SDPA's output and every other matmul's (torchtitan apply_ac, _save_list)",
         "loss compiled with the model when compiling (torchtitan components/loss.py build_cross_entropy_loss)",
         "FSDP2 reduce-scatters gradients at every micro-batch, as meshplan's runtime",
         "FSDP2 prefetches the next block's all-gather in forward and backward and reduce-scatters each block's "
         "gradients as its backward ends (torch.distributed.fsdp fully_shard), as meshplan's runtime",
         "AdamW with torch.optim's foreach implementation (torchtitan OptimizersContainer, implementation "
         "'foreach' by default) and torch.nn.utils.clip_grad_norm_, as meshplan's runtime",
         "SDPA's FlashAttention-2 on Hopper, as its published runs ran it: on H100 SDPA dispatched "
         "FLASH_ATTENTION as of 2025-04 (torchtitan#1042), and TorchTitan pins cuDNN's attention on B200 only "
         "(torchtitan#1209); the part's default points elsewhere",
         "under TP an MoE layer all-gathers its sequence shard and reduce-scatters its output around the "
         "whole layer, shared experts inside (apply_moe_ep_tp: PrepareModuleInputOutput to Replicate, "
         "output Partial to Shard(1)); meshplan's runtime and Megatron-Core route each TP rank's own shard "
         "and gather only for the shared experts",
         "RoPE as a complex multiply (torchtitan models/llama apply_rotary_emb: view_as_complex, the product with "
         "freqs_cis, view_as_real); Inductor generates no code for complex dtypes and runs such ops as eager "
         "fallback kernels (pytorch#98155, 'Fallback on complex64 kernels'; its lowering warns 'Torchinductor does "
         "not support code generation for complex operators'), so compiled blocks pay the rotation in fp32",
         "no fully_shard without FSDP: mixed_precision_param 'takes effect via fully_shard when "
         "data_parallel_shard_degree > 1 or context_parallel_degree > 1; it takes effect via torch.autocast when "
         "data_replicate_degree >= 1 and no other parallelism is enabled' (torchtitan config/configs.py at b5bcd76c6), "
         "so a plan without FSDP copies nothing (Layout.fsdp_one_rank)",
         "the token embedding a fully_shard unit of its own, resharded after its forward, and the final norm with "
         "the output head one kept unsharded until their backward (apply_fsdp since 83e694105, 'Improve "
         "reshard_after_forward logic', #1094, 2025-07-28); before, the root unit held all three for the whole "
         "step, as meshplan's runtime does (Layout.fsdp_embedding_unit)"),
        attention_kernel="flash", moe_tp_gather=True, rope_complex=True, fsdp_one_rank=False, fsdp_embedding_unit=True),
    MEGATRON_CORE: Stack(
        None, False, "last_microbatch",
        ("no torch.compile of the model: its kernels are Transformer Engine's and its own fused ones (the plan's "
         "compile is moot: estimated as false, so full recompute replays whole, float8 needs no compile)",
         "selective recompute by module (recompute_granularity 'selective' with TransformerConfig."
         "recompute_modules, default ['core_attn']; the plan's memory.recompute_modules): core_attn checkpoints "
         "the attention core, layernorm, moe_act and mla_up_proj discard their outputs once consumed and run "
         "again before the backward needs them (CheckpointWithoutOutput, transformer_layer.py, experts.py, "
         "multi_latent_attention.py), mlp and shared_experts checkpoint the dense MLP and the shared experts; "
         "every other output kept",
         "gradients reduced once per step, at the last micro-batch (DistributedDataParallel's no_sync over "
         "micro-batches; the distributed optimizer)",
         "cross-entropy unfused by default (ModelParallelConfig.cross_entropy_loss_fusion False): priced as "
         "the eager loss, as is its 'native' fused one (fused_vocab_parallel_cross_entropy upcasts the logits "
         "and keeps fp32 exponentials); Transformer Engine's fused one (cross_entropy_fusion_impl 'te', which "
         "Megatron-Bridge's performance scripts set) is Layout.loss_kernel 'te', in place over the logits",
         "fused elementwise kernels as the performance recipes switch them on (TransformerConfig "
         "apply_rope_fusion, bias_activation_fusion, bias_dropout_fusion; Transformer Engine's RMSNorm): "
         "each reads its inputs and writes its outputs once (timing.MEGATRON_CORE_LLAMA_PASSES), with or "
         "without torch.compile",
         "GPT-OSS's experts run their SwiGLU's clamp and their down projection's bias eagerly: "
         "fused_bias_geglu.weighted_bias_quick_geglu_impl clamps and concatenates fc1's halves before its "
         "compiled GLU, and TEGroupedMLP builds fc2 with skip_bias_add and adds the bias per expert "
         "(experts._apply_bias; Megatron-Core 0d8e0714 to cd4afffa, moe.MEGATRON_CLAMP_PASSES); Transformer "
         "Engine's op fuser (use_transformer_engine_op_fuser, off by default) fuses both",
         "data-parallel traffic overlapped as the performance recipes run it (DistributedDataParallelConfig "
         "overlap_grad_reduce and overlap_param_gather with the distributed optimizer): parameter all-gathers "
         "bucket by bucket in the first micro-batch's forward, gradient reduce-scatters in the last "
         "micro-batch's backward, the first and the last bucket exposed; under the interleaved schedule a model "
         "chunk at a time (pipeline_parallel/schedules.py at d98e8a6: param_sync_func for the next chunk as a "
         "chunk's first micro-batch starts its forward, grad_sync_func for a chunk after its last micro-batch's "
         "backward), each chunk's collectives beside the passes of the chunks after it",
         "the distributed optimizer gathers parameters into and reduce-scatters gradients out of contiguous "
         "per-bucket buffers that the parameters and their main gradients view (distributed/"
         "param_and_grad_buffer.py: 'all_gather_into_tensor writes directly into a contiguous output buffer and "
         "does not need a copy-back step'): no copies around its collectives, where FSDP2 copies each unit's "
         "parameters out and gradients in (Layout.fsdp_copies)",
         "fused Adam (the distributed optimizer's default optimizer 'adam' is Apex/Transformer Engine FusedAdam, "
         "one multi-tensor kernel per step); gradients scaled only where the norm exceeds clip_grad",
         "dropless MoE layers sync host and device for the tokens per expert (the alltoall dispatcher copies "
         "its splits to the CPU, TEGroupedMLP calls tokens_per_expert.tolist(); token_dispatcher.py, "
         "experts.py of Megatron-Core 0.16-0.17) and run the experts eager: Transformer Engine's "
         "GroupedLinear launches one cuBLAS GEMM per expert (multi_stream_cublas_gemm; its CUTLASS grouped GEMM "
         "is opt-in and Hopper-only, cublaslt_gemm.cu), with allocations per expert "
         "(TransformerEngine#1499); the sync-free recipes under full-iteration CUDA graphs opt out",
         "context parallelism through Transformer Engine's P2P ring (AttnFuncWithCPAndKVP2P, context_parallel.py), "
         "which overlaps each step's attention with the next step's K/V exchange, and sends K and V as attention "
         "gets them (torch.cat((k.view(-1), v.view(-1)))): grouped, at the model's KV heads, since Megatron-Core "
         "hands Transformer Engine its query groups unexpanded (TEDotProductAttention num_gqa_groups = "
         "num_query_groups, extensions/transformer_engine.py; only its local DotProductAttention repeat_interleaves "
         "them, transformer/dot_product_attention.py; Megatron-LM d98e8a6)",
         "tensor-parallel communication overlapped as the performance recipes run it (tp_comm_overlap with "
         "sequence parallelism: Transformer Engine's userbuffers split each all-gather and reduce-scatter into "
         "tp chunks exchanged under the GEMM chunks they feed or drain, te.module.base initialize_ub)",
         "cuDNN's fused attention on Hopper and newer: Transformer Engine's DotProductAttention drops "
         "FlashAttention 'to give FusedAttention preference on Hopper+ for performance reasons' "
         "(dot_product_attention/utils.py get_attention_backend); FlashAttention-2 on Ampere",
         "full recompute (recompute_granularity 'full') through tensor_parallel.checkpoint, whose "
         "CheckpointFunction runs the checkpointed forward again whole before its backward (tensor_parallel/"
         "random.py), the last matmul of each block included",
         "pipeline receive buffers allocated per transfer, not up front for every micro-batch: P2PCommunicator."
         "_communicate creates each receive tensor with torch.empty when it is posted "
         "(pipeline_parallel/p2p_communication.py), and the tensor received is the stage's input",
         "float8 weights cast once a step: the schedules call set_is_first_microbatch at each step's first "
         "micro-batch under an fp8 recipe (pipeline_parallel/schedules.py, transformer/module.py: 'TE modules will "
         "update their fp8 parameter cache'), and Transformer Engine's linear and grouped linear layers quantize "
         "their weights only when is_first_microbatch is set, reusing the cached copies after "
         "(extensions/transformer_engine.py forward(..., is_first_microbatch); Megatron-LM d98e8a6)",
         "gradients accumulated in place in one buffer allocated with the model (distributed/"
         "param_and_grad_buffer.py; Transformer Engine's weight-gradient GEMMs add into main_grad under "
         "gradient_accumulation_fusion), every local parameter's gradient unsharded for the whole step (the "
         "distributed optimizer reduce-scatters into it in place), in the dtype gradients are reduced in "
         "(grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype; the plan's memory.grad_reduce_dtype, "
         "memory.contiguous_grad_bytes); no micro-batch allocates gradients: the allocator slack FSDP2's "
         "accumulation under pipelining leaves (overheads.pp_memory_fragmentation) is not priced",
         "Transformer Engine's modules keep what their fused kernels need (activations.Convention te): a fused "
         "norm its input, the fused SwiGLU its input alone, under an fp8 recipe each linear its input quantized, "
         "column-wise only (module/linear.py, grouped_linear.py at v2.8); the experts weigh their activation by the "
         "router's probabilities and keep no output for the combine (experts.py, since 2659630721)"),
        elementwise_kernels="megatron", dp_overlap="buckets", fsdp_copies=False, checkpoint_early_stop=False,
        fsdp_one_rank=False,
        host_counted=False,
        optimizer_foreach=False, moe_host_sync=True, cp_ring_overlap=True, cp_kv_grouped=True, tp_comm_overlap=True,
        attention_kernel="cudnn", pp_recv_up_front=False, recomputes_modules=True, float8_weight_cache=True,
        contiguous_grads=True, torch_compile=False),
}


def stack_changes(stack: str, ac: str, sac_ops, recompute_modules: tuple[str, ...] | None = None) -> dict:
    """Layout fields that `stack` sets on a plan's layout (layout.layout_of)."""
    s = STACKS[stack]
    # Every field but these four is a Layout field of the same name.
    out: dict = {f.name: getattr(s, f.name) for f in fields(s)
                 if f.name not in ("selective_default", "sources", "recomputes_modules", "torch_compile")}
    if not s.torch_compile:
        out["compile"] = False
    if ac == "selective" and s.recomputes_modules:
        chosen = set(recompute_modules or MEGATRON_DEFAULT_RECOMPUTE)  # in one order: one cache entry a set
        out["sac_ops"] = MegatronRecompute(tuple(m for m in RECOMPUTE_MODULES if m in chosen))
    elif ac == "selective" and sac_ops is None and s.selective_default is not None:
        out["sac_ops"] = s.selective_default
    return out
