"""What one transformer block keeps for backward, tensor by tensor, and what recompute costs.

Each saved tensor has a size per token and a sharding rule. The PyTorch convention (flash
attention, no dropout, DTensor TP saving the all-gathered input of column-parallel matmuls) is
what the runtime and TorchTitan do; the Megatron convention (eager attention with its s^2 score
tensors, dropout masks, sequence parallel re-gathering its inputs) reproduces Korthikanti et
al. (2022) Table 2 exactly, which tests check.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.cost_models import forms
from meshplan.cost_models.flops import Matmul, mla_up_matmuls, mlp_matmuls, shared_expert_matmuls
from meshplan.cost_models.moe import moe_recompute_drops, moe_tensors
from meshplan.cost_models.saved_tensor import ActivationTensor
from meshplan.cost_models.stacks import TORCHTITAN_OP_POLICY, MegatronRecompute
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import DEFAULT_SAC_OPS

# Sharding of a saved tensor across the TP group:
#   "tp"       always split (head- or FFN-sharded activations)
#   "sp"       split only with sequence parallel (norm inputs, residual stream)
#   "gathered" the all-gathered input of a column-parallel matmul: split only if SP re-gathers it
#   "none"     never split (Partial outputs of row-parallel matmuls before their reduction)
SHARDINGS = ("tp", "sp", "gathered", "none")

# TorchTitan's default selective policy ("op"): save SDPA outputs, every other matmul output
# (wq, wv, w1, w2 of a Llama block) and reduce-scatter outputs. Names of ActivationTensor below.
# What selective AC saves on the torchtitan stack (stacks.py) and on TorchTitan's published runs
# (sac_ops = TORCHTITAN_OP_POLICY); meshplan's own default is DEFAULT_SAC_OPS.
TORCHTITAN_OP_SAC = ("block_in", "q_mm", "v_mm", "attn_core_out", "ffn_in_0", "ffn_out_mm", "attn_out_rs", "ffn_out_rs")
# What a block's backward reads of its forward: ffn_out's output (the block's output) is not among it.
BACKWARD_NEEDS = frozenset({"qkv", "attention", "attn_out", "ffn_in"})
# The block's output, before and after its reduce-scatter: no op of the block's backward reads it.
BLOCK_OUTPUT = frozenset({"ffn_out_mm", "ffn_out_rs"})


@dataclass(frozen=True)
class Convention:
    attention: str = "flash"  # flash | eager
    dropout: bool = False
    sp_regathers: bool = False  # Megatron SP keeps the sharded input and all-gathers it again in backward
    # RMSNorm without a fused kernel (PyTorch's composite on CPU) in a sub-fp32 dtype: it upcasts, and saves
    # the fp32 input copy and the fp32 normalised output instead of the input (specs/rules.py rms_norm_kernel)
    norm_fp32: bool = False
    # torch.compile'd blocks: AOTAutograd's min-cut partitioner recomputes the cheap pointwise outputs
    # (SiLU's, the residual sum before the FFN norm) in backward instead of keeping them, and fuses the
    # norms (no fp32 copies). Seen with saved-tensor hooks on a compiled runtime block, fp32 and bf16.
    compiled: bool = False
    # Compiled float8 linears (torchao): with no AC the partitioner also recomputes each linear's input that
    # is pointwise in saved tensors (the two norms' outputs, the attention output's contiguous copy, the
    # SwiGLU product) for the float8 casts, keeping the FFN norm's input instead. Seen with saved-tensor
    # hooks (benchmarks/saved_tensors.py, emulated on CPU) and in the H200 runs' peaks: a float8 block
    # without AC allocates what the default selective set keeps (benchmarks/results/gpu_truth-*).
    float8: bool = False
    # Megatron-Core's Transformer Engine modules (the megatron-core stack's cuDNN attention, fused norms and
    # activations): each fused norm keeps its input, the fused SwiGLU its input alone (bias_swiglu /
    # weighted_bias_swiglu), and the attention's output is the output projection's input, no copy. Under an
    # fp8 recipe (float8) every linear keeps its input quantized, column-wise data only, for its weight
    # gradient (TE_QUANTIZED_BYTES). The experts apply the router's probabilities inside their activation
    # (experts.py TEGroupedMLP, since 2659630721, 2025-04), so the combine weighs nothing and keeps nothing.
    te: bool = False


# What Transformer Engine keeps of a linear's input under an fp8 recipe, bytes an element: the column-wise
# fp8 data and, for MXFP8, one E8M0 scale per 32 elements; the row-wise copy is discarded after the forward
# GEMM (module/linear.py and grouped_linear.py at v2.8: "Discard row-wise data since it is not needed in
# backward pass"; layernorm_linear.py alike for the norm's output).
TE_QUANTIZED_BYTES = 1.0 + 1.0 / 32


PYTORCH = Convention()
MEGATRON = Convention(attention="eager", dropout=True, sp_regathers=True)


def convention_of(attention_kernel: str, norm_fp32: bool = False, compiled: bool = False,
                  float8: bool = False, te: bool = False) -> Convention:
    """A layout's convention: eager attention is Megatron-LM's (the only system modelled with it); `te`,
    Megatron-Core's Transformer Engine modules (compiled or not: their kernels are their own)."""
    if attention_kernel == "eager":
        return MEGATRON
    if te:
        return Convention(float8=float8, te=True)
    if compiled:
        return Convention(compiled=True, float8=float8)
    return Convention(norm_fp32=True) if norm_fp32 else PYTORCH


def attention_core_only(ac: str, sac_ops, attention: str) -> bool:
    """Korthikanti's selective recompute: with eager attention and no op list, selective AC drops and
    recomputes only the s^2 attention core (scores, softmax, dropout)."""
    return ac == "selective" and attention == "eager" and sac_ops is None


def block_tensors(spec: ModelSpec, seq_len: int, conv: Convention = PYTORCH, layer: int | None = None,
                  ep: int = 1, imbalance: float = 1.0) -> list[ActivationTensor]:
    """Tensors block `layer` (default: the last) produces that backward may need, per token (seq_len: keys
    each query sees); an MoE layer's MLP part is its own (moe.moe_tensors, with its EP degree and imbalance)."""
    layer = spec.n_layers - 1 if layer is None else layer
    d, kv, a = spec.dim, spec.kv_dim, spec.n_heads
    q, v, o = spec.q_dim, spec.v_dim, spec.attn_out_dim
    # A norm's input is what its backward keeps (fused kernel); the fp32 composite keeps fp32 copies instead.
    norm_in_kept = not conv.norm_fp32
    cast_recomputed = conv.compiled and conv.float8  # linear inputs recomputed for the float8 casts
    lin = TE_QUANTIZED_BYTES if conv.te and conv.float8 else None  # a linear's own saved input
    t = [ActivationTensor("block_in", "other", d, "sp", no_ac_saved=norm_in_kept),
         ActivationTensor("attn_norm_out", "other", d, "gathered", lin, no_ac_saved=not cast_recomputed)]
    if conv.norm_fp32:
        t += [ActivationTensor("attn_norm_fp32", "other", 2 * d, "sp", 4.0)]
    if spec.mla is not None:
        # MLA's up-projections save their latent inputs (normed): the query and the key/value bottlenecks.
        t += [ActivationTensor("q_latent", "other", spec.mla.q_lora_rank, "gathered", lin),
              ActivationTensor("kv_latent", "other", spec.mla.kv_lora_rank, "gathered", lin)]
    # Qwen3's per-head q/k RMSNorms keep their inputs, the q and k projections' outputs (the fp32
    # composite: fp32 copies instead, as the block norms).
    qk_norm_kept = spec.qk_norm and norm_in_kept
    t += [ActivationTensor("q_mm", "qkv", q, "tp", no_ac_saved=qk_norm_kept),
          ActivationTensor("k_mm", "qkv", kv, "tp", no_ac_saved=qk_norm_kept),
          ActivationTensor("v_mm", "qkv", v, "tp", no_ac_saved=False)]
    if spec.qk_norm and conv.norm_fp32:
        t += [ActivationTensor("qk_norm_fp32", "other", 2 * (q + kv), "tp", 4.0)]
    # Attention core inputs (q, k after RoPE; v) and output are what its backward needs.
    t += [ActivationTensor("q_in", "other", q, "tp"), ActivationTensor("k_in", "other", kv, "tp"),
          ActivationTensor("v_in", "other", v, "tp")]
    if conv.attention == "eager":
        t += [ActivationTensor("softmax_out", "other", a * seq_len, "tp")]
        if conv.dropout:
            t += [ActivationTensor("attn_dropout_mask", "other", a * seq_len, "tp", 1.0),
                  ActivationTensor("attn_dropout_out", "other", a * seq_len, "tp")]
    t += [ActivationTensor("attn_core_out", "attention", o, "tp")]
    if conv.attention == "flash":
        # The output projection saves its own input: the (batch, seq, heads*dim) contiguous copy of
        # the attention output, next to the (batch, heads, seq, dim) output SDPA keeps.
        # Transformer Engine's attention writes the projection's layout itself: only fp8's quantized copy.
        copied = not conv.te or conv.float8
        t += [ActivationTensor("attn_out_in", "other", o, "tp", lin, no_ac_saved=copied and not cast_recomputed)]
    t += [ActivationTensor("attn_out_mm", "attn_out", d, "none", no_ac_saved=False),
          ActivationTensor("attn_out_rs", "attn_out", d, "sp", no_ac_saved=False)]
    if conv.dropout:
        t += [ActivationTensor("attn_resid_dropout_mask", "other", d, "sp", 1.0)]
    # Before an MoE layer the norm is a module of its own, its output the router's bf16 input; a dense
    # MLP's fc1 fuses it (LayerNormLinear) and keeps it as a linear's input.
    t += [ActivationTensor("ffn_norm_in", "other", d, "sp",
                           no_ac_saved=norm_in_kept and (cast_recomputed or not conv.compiled)),
          ActivationTensor("ffn_norm_out", "other", d, "gathered", None if spec.is_moe_layer(layer) else lin,
                           no_ac_saved=not cast_recomputed)]
    if conv.norm_fp32:
        t += [ActivationTensor("ffn_norm_fp32", "other", 2 * d, "sp", 4.0)]
    if spec.is_moe_layer(layer):
        return t + moe_tensors(spec, ep, imbalance, lin, conv.te) + [
            ActivationTensor("ffn_out_rs", "ffn_out", d, "sp", no_ac_saved=False)]
    f = spec.ffn_dim
    if spec.arch == "llama":
        t += [ActivationTensor("ffn_in_0", "ffn_in", f, "tp"), ActivationTensor("ffn_in_1", "ffn_in", f, "tp"),
              ActivationTensor("ffn_act", "other", f, "tp", no_ac_saved=not (conv.compiled or conv.te)),
              ActivationTensor("ffn_gated", "other", f, "tp", lin, no_ac_saved=not cast_recomputed)]
    else:
        t += [ActivationTensor("ffn_in_0", "ffn_in", f, "tp"), ActivationTensor("ffn_act", "other", f, "tp")]
    t += [ActivationTensor("ffn_out_mm", "ffn_out", d, "none", no_ac_saved=False),
          ActivationTensor("ffn_out_rs", "ffn_out", d, "sp", no_ac_saved=False)]
    if conv.dropout:
        t += [ActivationTensor("ffn_resid_dropout_mask", "other", d, "sp", 1.0)]
    return t


def _divisor(shard: str, tp: int, sp: bool, conv: Convention) -> int:
    if shard == "tp":
        return tp
    if shard == "sp":
        return tp if sp else 1
    if shard == "gathered":
        return tp if (sp and conv.sp_regathers) else 1
    return 1


def tensor_bytes_per_token(x: ActivationTensor, tp: int, sp: bool, act_bytes: float, conv: Convention) -> float:
    if x.shard == "none" and tp == 1:
        return 0.0  # without TP the matmul output and its reduction are the same tensor as the *_rs entry
    per = x.bytes_per_element if x.bytes_per_element is not None else act_bytes
    return x.elements_per_token * per / _divisor(x.shard, tp, sp, conv)


# What Megatron-Core's recompute modules (MegatronRecompute) leave out of what a block keeps without AC, by
# tensor name (block_tensors; an MoE layer's own, moe.MOE_RECOMPUTE_DROPS): a module's outputs and what runs
# inside it; its inputs stay, as it runs again from them.
# - core_attn: the attention core under tensor_parallel.checkpoint keeps q, k and v, not its output (the
#   output projection keeps its own input) nor eager attention's scores;
# - mla_up_proj: MLA's up-projections and RoPE, discarded once the attention consumed q, k and v; the
#   latents they start from stay;
# - mlp: a dense layer's MLP checkpointed from the norm's input: Transformer Engine fuses the pre-MLP norm
#   into fc1 (LayerNormColumnParallelLinear), so the norm runs again with it;
# - layernorm: the norms that are modules of their own (megatron_separate_norms), discarded once consumed
#   (CheckpointWithoutOutput) and run again from their inputs.
MEGATRON_CORE_ATTN_DROPS = ("attn_core_out", "softmax_out", "attn_dropout_mask", "attn_dropout_out")
MEGATRON_MLA_UP_DROPS = ("q_mm", "k_mm", "v_mm", "q_in", "k_in", "v_in")
NORM_OUTPUTS = {"attn": ("attn_norm_out", "attn_norm_fp32"), "ffn": ("ffn_norm_out", "ffn_norm_fp32")}
MEGATRON_MLP_DROPS = ("ffn_in_0", "ffn_in_1", "ffn_act", "ffn_gated") + NORM_OUTPUTS["ffn"]


def megatron_separate_norms(spec: ModelSpec, layer: int) -> tuple[str, ...]:
    """The norms of block `layer` Megatron-Core builds as modules of their own under Transformer Engine,
    which its layernorm module recomputes (transformer_layer.py recomputes a norm that is not an IdentityOp):
    the attention's under MLA (gpt_layer_specs: MLA's spec does not fuse its input norm), the MLP's before an
    MoE layer (the experts cannot fuse it). GQA's fuses into linear_qkv and a dense MLP's into fc1. CUDA
    graphs over the attention or the router also keep a norm from being recomputed (not priced: the plan
    has no graph scope)."""
    return (("attn",) if spec.mla is not None else ()) + (("ffn",) if spec.is_moe_layer(layer) else ())


def megatron_recompute_drops(spec: ModelSpec, layer: int, modules: tuple[str, ...]) -> set[str]:
    """Names of block `layer`'s tensors that Megatron-Core's recompute `modules` leave out of its no-AC set."""
    moe_layer = spec.is_moe_layer(layer)
    names: set[str] = set()
    if "core_attn" in modules:
        names.update(MEGATRON_CORE_ATTN_DROPS)
    if "mla_up_proj" in modules and spec.mla is not None:
        names.update(MEGATRON_MLA_UP_DROPS)
    if "mlp" in modules and not moe_layer:
        names.update(MEGATRON_MLP_DROPS)
    if "layernorm" in modules:
        for norm in megatron_separate_norms(spec, layer):
            names.update(NORM_OUTPUTS[norm])
    if moe_layer:
        names.update(moe_recompute_drops(modules))
    return names


def megatron_recomputed_norms(spec: ModelSpec, layer: int, modules: tuple[str, ...]) -> int:
    """How many of block `layer`'s norms Megatron-Core's recompute `modules` run again: those whose outputs
    they drop (megatron_recompute_drops: its separate norms under layernorm, and a dense layer's fused
    pre-MLP norm with its MLP under mlp)."""
    dropped = megatron_recompute_drops(spec, layer, modules)
    return sum(outputs[0] in dropped for outputs in NORM_OUTPUTS.values())


def saved_names(spec: ModelSpec, ac: str, sac_ops, conv: Convention, tp: int, layer: int | None = None) -> set[str]:
    """Names of the tensors block `layer` (default: the last) keeps between its forward and its backward.

    sac_ops: the op kinds selective AC saves (None: DEFAULT_SAC_OPS), TORCHTITAN_OP_POLICY, or a
    MegatronRecompute (what AC none keeps less what its modules drop).
    """
    tensors = block_tensors(spec, 1, conv, layer)
    if ac == "none":
        return {x.name for x in tensors if x.no_ac_saved}
    if ac == "full":
        return {"block_in"}
    if isinstance(sac_ops, MegatronRecompute):
        dropped = megatron_recompute_drops(spec, spec.n_layers - 1 if layer is None else layer, sac_ops.modules)
        return {x.name for x in tensors if x.no_ac_saved and x.name not in dropped}
    if attention_core_only(ac, sac_ops, conv.attention):
        return {x.name for x in tensors if x.no_ac_saved and x.name not in
                ("softmax_out", "attn_dropout_mask", "attn_dropout_out")}
    if sac_ops == TORCHTITAN_OP_POLICY:
        names = set(TORCHTITAN_OP_SAC)
        if spec.arch == "gpt":
            names.discard("v_mm")
        if tp == 1:
            names -= {"attn_out_rs", "ffn_out_rs"}
            names.add("ffn_out_rs")  # w2's output is the reduce-scatter's when there is no TP
        if spec.is_moe_layer(spec.n_layers - 1 if layer is None else layer):
            names |= {"router_scores", "expert_in_0", "shared_in_0"}  # every other matmul's output, as in the MLP
    else:
        kinds = DEFAULT_SAC_OPS if sac_ops is None else sac_ops
        names = {"block_in"} | {x.name for x in tensors if x.sac_kind in kinds}
    if conv.compiled:
        # Eager selective checkpointing stores every output its policy marks MUST_SAVE. AOTAutograd's
        # partitioner saves only what the backward graph reads, and nothing reads the block's output
        # (w2's, TorchTitan's op policy marks it as the 7th matmul). Seen with saved-tensor hooks on a
        # compiled runtime block (tests/runtime/test_saved_activations.py).
        names -= BLOCK_OUTPUT
    return names


# The inputs each of Megatron-Core's offloadable modules (rules.OFFLOAD_MODULES) saves, by the names
# block_tensors gives them: the input norm's input, the QKV (MLA: the down-projections') input, the attention
# core's q, k and v, the output projection's input, the pre-MLP norm's input, the experts' fc1 input (the
# routed tokens) and their activation's input (fc1's two halves). Offloaded only where the block keeps them.
OFFLOADED_INPUTS = {"attn_norm": ("block_in",), "qkv_linear": ("attn_norm_out",),
                    "core_attn": ("q_in", "k_in", "v_in"), "attn_proj": ("attn_out_in",),
                    "mlp_norm": ("ffn_norm_in",), "expert_fc1": ("routed_in",),
                    "moe_act": ("expert_in_0", "expert_in_1")}


def offloaded_names(modules: tuple[str, ...]) -> frozenset[str]:
    """The saved tensors the offloaded modules (Layout.offload_modules) move to host memory."""
    return frozenset(name for m in modules for name in OFFLOADED_INPUTS[m])


def activation_bytes_per_token(spec: ModelSpec, seq_len: int, tp: int, sp: bool, ac: str,
                               sac_ops, act_bytes: float, conv: Convention = PYTORCH, layer: int | None = None,
                               ep: int = 1, imbalance: float = 1.0, offloaded: frozenset[str] = frozenset()) -> float:
    """Bytes block `layer` (default: the last) keeps per token of its micro-batch, on one TP rank; the
    `offloaded` tensors (offloaded_names) left out, as they wait in host memory."""
    if isinstance(sac_ops, list):
        sac_ops = tuple(sac_ops)
    return _activation_bytes_per_token(spec, seq_len, tp, sp, ac, sac_ops, act_bytes, conv, layer, ep, imbalance,
                                       offloaded)


def offloaded_bytes_per_token(spec: ModelSpec, seq_len: int, tp: int, sp: bool, ac: str, sac_ops,
                              act_bytes: float, conv: Convention, layer: int, ep: int, imbalance: float,
                              offloaded: frozenset[str]) -> float:
    """What the offloaded tensors of block `layer` weigh per token: what goes to host memory and comes back."""
    if not offloaded:
        return 0.0
    kept = activation_bytes_per_token(spec, seq_len, tp, sp, ac, sac_ops, act_bytes, conv, layer, ep, imbalance)
    return kept - activation_bytes_per_token(spec, seq_len, tp, sp, ac, sac_ops, act_bytes, conv, layer, ep,
                                             imbalance, offloaded)


@lru_cache(maxsize=65536)
def _activation_bytes_per_token(spec: ModelSpec, seq_len: int, tp: int, sp: bool, ac: str,
                                sac_ops, act_bytes: float, conv: Convention, layer: int | None = None,
                                ep: int = 1, imbalance: float = 1.0, offloaded: frozenset[str] = frozenset()) -> float:
    keep = saved_names(spec, ac, sac_ops, conv, tp, layer) - offloaded
    return sum(tensor_bytes_per_token(x, tp, sp, act_bytes, conv)
               for x in block_tensors(spec, seq_len, conv, layer, ep, imbalance) if x.name in keep)


@lru_cache(maxsize=65536)
def recompute_peak_bytes_per_token(spec: ModelSpec, seq_len: int, tp: int, sp: bool, act_bytes: float,
                                   conv: Convention = PYTORCH, layer: int | None = None, ep: int = 1,
                                   imbalance: float = 1.0) -> float:
    """Transient: the whole block's backward set, materialised while one checkpointed block recomputes."""
    return activation_bytes_per_token(spec, seq_len, tp, sp, "none", None, act_bytes, conv, layer, ep, imbalance)


def recomputed_kinds(ac: str, sac_ops, arch: str, attention_kernel: str = "flash", compiled: bool = False,
                     early_stop: bool = False) -> set[str]:
    """Op kinds whose forward runs again in backward (matmul kinds and the attention core).

    Full AC eager replays the block's forward. A replay that runs to the end (Megatron's CheckpointFunction,
    or torch.utils.checkpoint without early stop) runs ffn_out too. With `early_stop` (checkpoint_early_stop:
    torch.utils.checkpoint's non-reentrant replay stops once every tensor the forward saved has been
    recomputed) the dense block's last matmul, whose output only the residual add reads and nothing saves,
    is not run again. Compiled, AOTAutograd's partitioner puts into the backward graph only the recomputation
    that graph reads, so ffn_out is not run again either."""
    if ac == "none":
        return set()
    if ac == "full":
        return set(BACKWARD_NEEDS) if compiled or early_stop else set(BACKWARD_NEEDS | {"ffn_out"})
    if attention_core_only(ac, sac_ops, attention_kernel):
        return {"attention"}
    if isinstance(sac_ops, MegatronRecompute):
        # Its matmuls are not whole kinds (megatron_recomputed_matmuls); the attention core is.
        return {"attention"} if "core_attn" in sac_ops.modules else set()
    if sac_ops == TORCHTITAN_OP_POLICY:
        # TorchTitan's op policy saves every other matmul; recomputes wk, wo and w3 (GPT: wk, wv, wo).
        return {"qkv_partial", "attn_out", "ffn_in_partial"} if arch == "llama" else {"qkv_partial", "attn_out"}
    kinds = DEFAULT_SAC_OPS if sac_ops is None else sac_ops
    return BACKWARD_NEEDS - set(kinds)


def replay_stops_early(lay, layer: int, on_gpu: bool) -> bool:
    """Whether full AC's eager replay of block `layer` stops before its last matmul (recomputed_kinds'
    early_stop): the stack's checkpoint stops early (Layout.checkpoint_early_stop) and forms.py checkpoint_replay
    says so, on a GPU (NCCL) profile, whose rows chose the form (a CPU profile keeps the whole replay its
    calibrated terms were fitted under). A dense block only: an MoE layer's last op weights its experts'
    outputs by their routing probabilities and saves them, so its replay runs to the end."""
    return (on_gpu and lay.checkpoint_early_stop and forms.FORMS.checkpoint_replay == "early_stop"
            and not lay.spec.is_moe_layer(layer))


def megatron_recomputed_matmuls(spec: ModelSpec, layer: int, tp: int, sac_ops) -> list[Matmul]:
    """The forward matmuls of block `layer` a MegatronRecompute runs again (none for another policy): MLA's
    up-projections (mla_up_proj), a dense layer's MLP (mlp), an MoE layer's shared experts (shared_experts)."""
    if not isinstance(sac_ops, MegatronRecompute):
        return []
    modules, out = sac_ops.modules, []
    if "mla_up_proj" in modules and spec.mla is not None:
        out += mla_up_matmuls(spec, tp)
    if "mlp" in modules and not spec.is_moe_layer(layer):
        out += mlp_matmuls(spec, layer, tp)
    if "shared_experts" in modules and spec.is_moe_layer(layer):
        out += shared_expert_matmuls(spec, tp)
    return out
