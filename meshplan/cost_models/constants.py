"""Every constant of the cost model, in one registry, each with its value, its source or the rows it was
fitted on, and its physical default (what the term is worth with no empirical correction).

Two kinds: constants of the code (MODEL, read by timing.py and estimate.py at call time) and constants a
cluster profile carries (PROFILE_CONSTANTS: how to read and set each on a ClusterProfile; the values live in
the built-in YAML files, the sources here and in each profile's provenance). `meshplan validate --constants`
lists both and measures how far validation moves when each is put at its physical default.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Iterator

from meshplan.cost_models import forms
from meshplan.profiles.schema import ClusterProfile

# Published tables that fitted constants may be fitted on (the validation sources).
MEGATRON = "Megatron-LM SC'21 Table 1"
KORTHIKANTI = "Korthikanti 2022 Table 4 (22B layer)"
TORCHTITAN = tuple(f"TorchTitan H100 (Table {i})" for i in range(1, 7))
# TorchTitan's performance page as it stood in 2024-08 (its 405B on H100, Llama 3 and Llama 2 on A100): an
# earlier page, and other runs, of the same project as TORCHTITAN's December 2024 tables.
TORCHTITAN_DOC_2024 = "TorchTitan page 2024-08"
TORCHTITAN_DOC_2024_H100 = f"{TORCHTITAN_DOC_2024} (Table 1)"
# torchao's float8 training benchmarks (its float8 README, 2025-03): Llama 3 8B on 8 H100 run by TorchTitan, by
# the torchao team; a third page of TorchTitan runs, by another team, three months after the December tables.
TORCHAO_FLOAT8 = "torchao float8 README (H100)"
# The same benchmark of 2025-08 on 8 power-limited B200s (torchao's mx_formats README), by TorchTitan of that month:
# scored on max reserved memory alone (the power cap is not printed) and fitted on by nothing.
TORCHAO_B200 = "torchao mx_formats README (B200, memory)"
LLMFOUNDRY = "MosaicML llm-foundry MPT (A100, H100)"
IBM_FMS = "IBM fms-fsdp Llama 2 (A100, H100)"
OLMO_CORE = "AI2 OLMo-core OLMo 2 and Llama (H100)"
# meshplan's runtime on a lent H200 (data/measured/runtime_runs.json): our own runs, not a publication,
# scored on peak memory alone (published.runtime_memory_rows).
RUNTIME_RUNS = "meshplan runtime on a lent H200"
# The MoE runs on B200 and GB200 (moe_training_blackwell.csv), one table per publication and model: Megatron-
# Bridge's performance pages, the Megatron-MoE model zoo's best-practice tables and Megatron-LM's DeepSeek-V3
# GB200 notes are three publications (written by different teams at different dates, each measuring its own
# runs), all of the Megatron-Core stack. Leaving a table out of a fit leaves that publication's model out.
MEGATRON_BRIDGE_MOE = "Megatron-Bridge MoE"
MOE_MODEL_ZOO = "Megatron-MoE-ModelZoo"
MEGATRON_LM_GB200 = "Megatron-LM GB200 notes"
# Megatron-Core's MoE runs on H100 in Liu et al. 2025 (MoE Parallel Folding, arXiv 2504.14960;
# moe_training_h100.csv): a fourth publication, of another team, part and year; scored, not fitted on.
MOE_PARALLEL_FOLDING = "MoE Parallel Folding (H100)"
MOE_SOURCES = (MEGATRON_BRIDGE_MOE, MOE_MODEL_ZOO, MEGATRON_LM_GB200, MOE_PARALLEL_FOLDING)
MOE_TABLE_SEPARATOR = ": "


def table_publication(table: str) -> str:
    """The publication a dense table belongs to: its name without a " (Table N)" suffix (TorchTitan's
    December tables are one, its 2024 page another); other names are their own."""
    return re.sub(r" \(Table \d+\)$", "", table)


def moe_table(source: str, model: str) -> str:
    """An MoE table's name: its publication, then its model (crossval.moe_source_and_model reads it back)."""
    return f"{source}{MOE_TABLE_SEPARATOR}{model}"


MOE_TABLES = tuple(moe_table(MEGATRON_BRIDGE_MOE, m) for m in ("DeepSeek-V3", "GPT-OSS-120B", "Qwen3-30B-A3B",
                                                                "Qwen3-235B-A22B")) + (
    moe_table(MOE_MODEL_ZOO, "Qwen3-235B-A22B"), moe_table(MEGATRON_LM_GB200, "DeepSeek-V3"))
# Tables whose rows run a kernel no profile prices from a measurement: GPT-OSS's attention with learnable sinks
# (softmax_type "learnable" in Megatron-Bridge's GPT-OSS bridge). Rate constants leave them out under
# forms.py rate_rows "measured_kernels".
UNMEASURED_KERNEL_TABLES = (moe_table(MEGATRON_BRIDGE_MOE, "GPT-OSS-120B"),)


def const(value: float, physical: float, source: str, fitted_on: tuple[str, ...] = ()) -> float:
    """A dataclass field carrying its physical default, its source and the tables it was fitted on."""
    return field(default=value, metadata={"physical": physical, "source": source, "fitted_on": fitted_on})


@dataclass(frozen=True)
class ModelConstants:
    """Constants of the code: derived from kernel reads and papers, none fitted."""

    attention_backward_factor: float = const(
        2.5, 2.5, "FLOP ratio: attention backward runs 5 matmuls (recomputed scores, dP, dQ, dK, dV) to the "
        "forward's 2 (Dao 2023, FlashAttention-2, Sec. 3.1)")
    # MosaicML's MPT benchmarks (llm-foundry's page, tables added at b2a43a147 and 5e85bd62d) ran attn_impl
    # "triton": submit_benchmarks.py defaulted to it until 495218376 (2024-04) and sweep.sh does not pass
    # --attn_impl, so MPT ran the Triton FlashAttention it vendors (llmfoundry/models/layers/
    # flash_attn_triton.py, copied from flash-attention's flash_attn_triton.py on triton_pre_mlir).
    triton_attention_forward_slowdown: float = const(
        1.3, 1.0, "FlashAttention-2 over FlashAttention in Triton, forward: FlashAttention-2 is '1.3-2.5x faster "
        "than FlashAttention in Triton' forward + backward, '1.3-1.5x' in the forward pass (Dao 2023, "
        "FlashAttention-2, Sec. 4 and 4.1, A100, seq 512-16k); the low end, 1.3, for both passes. The same "
        "ratio is assumed on H100, where the pre-MLIR Triton kernel has no Hopper-specific path")
    triton_attention_backward_slowdown: float = const(
        1.3, 1.0, "FlashAttention-2 over FlashAttention in Triton, backward: the paper's low end of its forward + "
        "backward range (1.3), not its 'around 2x' for the backward alone: with 2x the long-sequence MPT rows on "
        "A100, where attention is half the work, come out 24 % pessimistic and with 1.3 within 2 %, so this "
        "value was read against MosaicML's rows, the only source that ran the kernel (partly in sample there)")
    float8_cast_passes: float = const(
        3.0, 0.0, "torchao float8 dynamic scaling: input, weight and grad-output cast, each an amax read + scaled "
        "write of the matmul's operands (torchao float8 linear, 2024)")
    eager_score_passes_fwd: float = const(
        4.5, 4.5, "Megatron eager attention: scale-mask-softmax reads scores, writes probs (2); dropout reads, "
        "writes output and a 1-byte mask (2.5); counted from Megatron-LM's fused_softmax / dropout kernels")
    eager_score_passes_bwd: float = const(
        5.5, 5.5, "dropout backward reads grad + mask, writes (2.5); softmax backward reads grad + probs, writes (3)")
    norm_passes: float = const(
        20.0, 2.0, "eager RMSNorm/LayerNorm in fp32 (cast, square, mean, rsqrt-scale, weight, cast back): "
        "~20 element passes counted from the runtime's ops (timing._pytorch_elementwise_bytes)")
    residual_passes: float = const(3.0, 3.0, "residual add: read 2, write 1")
    rope_passes: float = const(
        15.0, 2.0, "RoPE on q and k via fp32 complex multiply (view_as_complex, cast, mul, cast back): ~15 passes")
    layout_passes: float = const(
        8.0, 0.0, "attention layout copies (transpose/contiguous of q, k, v and the output): ~8 passes")
    activation_passes: float = const(5.0, 3.0, "SwiGLU silu(w1) * w3 / GELU: read 2, write 1, plus the silu itself")
    loss_passes: float = const(4.0, 2.0, "cross-entropy over fp32 logits: upcast, log-softmax, gather: ~4 passes each way")
    moe_dropless_imbalance: float = const(
        1.23, 1.0, "busiest EP rank's routed tokens over the mean, dropless routing with a real (not force-balanced) "
        "router: FEPLB (arXiv 2604.19654) reports router imbalance wasting 18.6 % of GPU time per MoE layer of GLM-5 "
        "(128 experts, EP 8, no auxiliary loss), i.e. busiest / mean = 1 / (1 - 0.186) = 1.23; one source, read "
        "through a review of the paper, so an assumption to state, not a fit. Force-balanced runs (Megatron-Bridge's "
        "benchmarks) are priced at 1")
    adamw_bytes_per_param: float = const(
        28.0, 28.0, "fused AdamW (fp32; Megatron-Core's distributed optimizer runs Apex/Transformer Engine "
        "FusedAdam, one kernel): read p, g, m, v and write p, m, v = 7 x 4 bytes (exact)")
    adamw_foreach_bytes_per_param: float = const(
        80.0, 80.0, "torch.optim.AdamW's foreach step (torch/optim/adam.py _multi_tensor_adam, not capturable; "
        "meshplan's runtime, TorchTitan and IBM's fms-fsdp run it; Composer's per-tensor DecoupledAdamW makes the "
        "same passes), fp32, one pass over its tensor lists each: weight decay mul_ p (8 bytes), lerp_ m to g "
        "(12), mul_ v (8), addcmul_ v g g (12), sqrt v (8), div_ and add_ eps (8 each), addcdiv_ p m (16); "
        "the profile of llama3.2-3b on the H200 timed these at 70 ms, 3.2 B parameters at 3.7 TB/s "
        "(benchmarks/results/ops-llama3.2-3b-planner_1-NVIDIA_H200-9816110.txt)")
    clip_foreach_bytes_per_param: float = const(
        12.0, 12.0, "gradient clipping in PyTorch (torch.nn.utils.clip_grad_norm_ and the runtime's "
        "train.clip_grad_norm): the norm reads every gradient (4 bytes) and foreach_mul_ scales them whether or "
        "not the norm exceeds the limit (8); Megatron-Core scales only when it does: its norm's 4 bytes alone")


MODEL = ModelConstants()


@contextmanager
def model_constants(**values: float) -> Iterator[ModelConstants]:
    """MODEL with some fields replaced, for the duration (the cost model reads MODEL at call time)."""
    global MODEL
    old = MODEL
    MODEL = replace(old, **values)
    try:
        yield MODEL
    finally:
        MODEL = old


@dataclass(frozen=True)
class ProfileConstant:
    """A constant a cluster profile carries: how to read and set it, its physical default, where it comes from."""

    name: str
    get: Callable[[ClusterProfile], float]
    set: Callable[[ClusterProfile, float], ClusterProfile]
    physical: float
    source: str
    # profile name -> tables it is fitted on; EVERY_GPU: one value for every GPU profile, fitted on the
    # tables' rows whatever their profile. Read through fitted_on, which honours `form`.
    fits: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bounds: tuple[float, float] = (0.0, 1.0)  # for a fit
    time: bool = True  # a time term (else memory)
    # mse: mean squared log error. spread: the same with each table's mean log error taken out first, so
    # that the constant is fitted on how errors vary inside a source, not on a source's level (its
    # stack's own speed, which the per-profile rate constants carry).
    objective: str = "mse"
    # (form, alternative) of forms.py under which the constant is fitted; None: under every form
    form: tuple[str, str] | None = None
    # A device rate: fitted only on rows whose kernels are all measured where forms.py rate_rows says so
    rate: bool = False

    @property
    def fitted_on(self) -> dict[str, tuple[str, ...]]:
        """The tables it is fitted on under the forms in force (none where its form is not)."""
        if self.form is not None and getattr(forms.FORMS, self.form[0]) != self.form[1]:
            return {}
        if self.rate and forms.FORMS.rate_rows == "measured_kernels":
            return {k: tuple(t for t in v if t not in UNMEASURED_KERNEL_TABLES) for k, v in self.fits.items()}
        return self.fits


EVERY_GPU = "every GPU profile"
# One value for several profiles of the same part, fitted on their rows together: profile names joined by "+".
# The H100 SXM at 700 W (DGX; MosaicML's and IBM's rows) and at the 500 W cap (TorchTitan's Grand Teton).
H100_CLASS = "h100-96g-gt+h100-80g-dgx"
BLACKWELL_CLASS = "b200-180g-dgx+gb200-186g-nvl72"


def fitted_profiles(key: str) -> tuple[str, ...] | None:
    """The profiles a fitted_on key sets: None for EVERY_GPU (every GPU profile), else the names it joins."""
    return None if key == EVERY_GPU else tuple(key.split("+"))


def _overhead(name: str):
    return (lambda p: getattr(p.overheads, name),
            lambda p, v: replace(p, overheads=replace(p.overheads, **{name: v})))


def _device(name: str):
    return (lambda p: getattr(p.device, name),
            lambda p, v: replace(p, device=replace(p.device, **{name: v})))


def _attention(name: str):
    return (lambda p: getattr(p.device.attention, name),
            lambda p, v: replace(p, device=replace(p.device, attention=replace(p.device.attention, **{name: v}))))


def _matmul(name: str):
    return (lambda p: getattr(p.device.matmul, name),
            lambda p, v: replace(p, device=replace(p.device, matmul=replace(p.device.matmul, **{name: v}))))


PROFILE_CONSTANTS: tuple[ProfileConstant, ...] = (
    ProfileConstant("device.sustained_fraction", *_device("sustained_fraction"), 1.0,
                    "share of the best-case tensor-core rate (MAMF's matmuls, the attention benchmarks) that training sustains",
                    {"a100-80g-dgx": (MEGATRON, KORTHIKANTI),
                     H100_CLASS: TORCHTITAN + (TORCHTITAN_DOC_2024_H100, TORCHAO_FLOAT8, LLMFOUNDRY, IBM_FMS, OLMO_CORE),
                     BLACKWELL_CLASS: MOE_TABLES},
                    # a search range, not a belief: 0.5 until one Blackwell fold stopped at it (2026-12-07)
                    (0.3, 1.0), rate=True),
    # The H100 SXM at 700 W (h100-80g-dgx) and at the 500 W cap (h100-96g-gt) share one value: fitted on each
    # part alone they agree (data/validation/sustained_fraction.csv). The B200 and the GB200 (one chip, 1000 W
    # and 1200 W) share one too, fitted on the Blackwell MoE rows against cuDNN's measured attention and MAMF's
    # matmuls; the H200 carries the A100's.
    ProfileConstant("device.matmul.half_dim", *_matmul("half_dim"), 0.0,
                    "dimension at which a matmul reaches half its shape-free rate, per dimension (m/(m+h) x "
                    "n/(n+h) x k/(k+h)), used where a profile has no measured points; profile-cluster fits it "
                    "from its own points. The GPU built-ins carry 0: MAMF's brute-force searches found their best "
                    "shapes with a dimension of only 1024-3072 (hw_measured_max_matmul_tflops_mamf.csv), so no "
                    "smooth fall-off is measurable above that, and thin matmuls are priced by the roofline's "
                    "memory bound (compute.py) and the per-op host cost instead. Fitted free on the training rows "
                    "(2026-11-25) it came out A100 56 (56-85 leaving one table out), 500 W H100 0 (0-28), and "
                    "scored worse out of sample (step MAPE 4.5 %) than 0 (3.9 %)",
                    bounds=(0.0, 512.0)),
    ProfileConstant("device.memory_bound_efficiency", *_device("memory_bound_efficiency"), 1.0,
                    "share of datasheet HBM bandwidth an eager elementwise kernel reaches (STREAM-like copy "
                    "kernels reach 0.7-0.8 of datasheet on A100/H100; profile-cluster measures it). Fitted free "
                    "with the others (2026-11-25) it came out A100 0.77 (0.73-0.77 leaving one table out), 500 W "
                    "H100 0.93 (0.92-1.0, trading against compile_speedup 2.08), and scored no better out of "
                    "sample (step MAPE 4.0 % against 3.9 % as shipped). On the B200 and the GB200 fitted on the "
                    "MoE rows where forms.py memory_rate says so",
                    {BLACKWELL_CLASS: MOE_TABLES}, (0.1, 1.0), form=("memory_rate", "fitted")),
    ProfileConstant("device.attention.backward_ratio", *_attention("backward_ratio"), 1.0,
                    "FlashAttention-2 backward vs forward throughput on H100, 318-322 / 370 TFLOP/s at 8-16k "
                    "(Shah et al. 2024, FlashAttention-3 paper, Fig. 5-6); A100 default 0.75"),
    ProfileConstant("overheads.compile_speedup", *_overhead("compile_speedup"), 1.0,
                    "eager / compiled bytes of the loss and the float8 casts under torch.compile (a compiled block's "
                    "elementwise kernels are counted fused, each reading its inputs and writing its outputs once: "
                    "forms.py compiled_elementwise, chosen by nested cross-validation on the dense tables; under its "
                    "speedup alternative this factor shrinks the blocks' eager passes too). One value for every GPU, "
                    "fitted on how compiled rows differ from eager ones inside each source (objective spread): TorchTitan's "
                    "Tables 1 and 3 and IBM's fms-fsdp tables run the same layouts eager and compiled",
                    {EVERY_GPU: TORCHTITAN[0:1] + TORCHTITAN[2:3] + (IBM_FMS,)}, (1.0, 4.0), objective="spread"),
    ProfileConstant("overheads.tp_async_overlap", *_overhead("tp_async_overlap"), 0.0,
                    "share of TP comm async TP hides, fitted on two A/B pairs of the same layout with and without "
                    "it: TorchTitan's December 2024 Table 4 (Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, float8: 829 "
                    "-> 876 tok/s/GPU) and its performance page of 2024-08 (Llama 3.1 405B, 128 H100, FSDP 16 x TP "
                    "8, float8: 177 -> 185). Two pages and two campaigns of one project, the only async-TP runs "
                    "outside the maintainers' hidden set; no mechanism explains the share: hidden under the "
                    "matmuls it is fused with ((tp - 1) / tp of each, as Transformer Engine's userbuffers), Table "
                    "4's async row is priced 14 % too fast (forms.py async_tp window)",
                    {"h100-96g-gt": TORCHTITAN[3:4] + (TORCHTITAN_DOC_2024_H100,)}),
    ProfileConstant("overheads.fsdp_overlap", *_overhead("fsdp_overlap"), 1.0,
                    "share of the compute beside a data-parallel collective that it can hide under "
                    "(estimate.overlap_beyond_windows: each micro-batch's forward for its gathers, its backward "
                    "for the backward gathers and the reductions; Megatron-Core's buckets one micro-batch's "
                    "each way): 1 on every GPU, where NCCL runs on its own streams beside the compute and what "
                    "exceeds a window is exposed by the mechanism itself. Not fitted: until 2026-11-27 a pooled "
                    "share fitted on TorchTitan and MosaicML (0.195) stood for the windows and the contention "
                    "together, and left IBM's FSDP1 rows 27 % pessimistic. Measured profiles carry what "
                    "profile-cluster sees on CPUs (0: gloo's collectives and the compute share the cores) and "
                    "the same part's built-in value on GPUs (bench/unmeasured.py). "
                    "Under forms.py's pooled alternative (for nested cross-validation) it is that share again, "
                    "fitted on the spread of TorchTitan's and MosaicML's rows",
                    {EVERY_GPU: TORCHTITAN + (LLMFOUNDRY,)}, objective="spread", form=("dp_overlap", "pooled")),
    ProfileConstant("overheads.comm_compute_slowdown", *_overhead("comm_compute_slowdown"), 0.0,
                    "compute slowdown while a hidden data-parallel collective shares the GPU (its kernels' SMs "
                    "and memory traffic): 0.189, the mean slowdown of overlapped compute against compute alone "
                    "that Lee et al. measured for GPT and Llama training on 4 A100, H100, MI250 and MI210 GPUs "
                    "(arXiv 2507.03114, 2025: 18.9 % on average, 40.0 % at most); the step pays it times the "
                    "hidden share of the collectives timed at the node level's rate, the rate 4-GPU runs measure "
                    "it at (forms.py kernel_work, chosen by nested cross-validation; estimate.contended), or "
                    "under the hidden_time alternative times the hidden time itself. Sourced, not fitted; "
                    "profile-cluster measures it where a node holds two devices or more, as Lee et al. define "
                    "it, with matmuls beside all-reduces over the node (bench/contention.py)"),
    ProfileConstant("overheads.cp_overlap", *_overhead("cp_overlap"), 0.0,
                    "share of ring attention's exposed K/V exchange (timing.cp_exposed: Transformer Engine's P2P "
                    "ring hides each step's exchange under a step of attention, PyTorch's runs in line) hidden "
                    "beyond that; 0 in every GPU built-in, not fitted: fitted on TorchTitan's CP rows (Tables 2 "
                    "and 6) it came out 0.001, 0 to 0.21 leaving one table out (2026-11-27)"),
    ProfileConstant("overheads.moe_expert_host_s", *_overhead("moe_expert_host_s"), 0.0,
                    "host seconds per local expert of an eager MoE layer's forward behind a device-to-host sync "
                    "(Layout.moe_host_sync: Megatron-Core's dropless recipes without full-iteration CUDA graphs), "
                    "the backward 1.75x (timing.MOE_HOST_BACKWARD_RATIO); a layer pass takes the longer of its "
                    "kernels and this. One value for every GPU, fitted on the B200 and GB200 MoE rows of three "
                    "publications (Megatron-Bridge's pages, the Megatron MoE model zoo, Megatron-LM's GB200 notes), "
                    "all Megatron-Core; cross-validation leaves one model out (crossval.fold_of). Its form (per local expert, no fixed "
                    "part per layer) was chosen by that same leave-one-model-out score (15.8 % against 17.2 % "
                    "with a fixed part too, on a grid, 2026-11-27), not by nested cross-validation: for that "
                    "choice the MoE score is partly in sample",
                    {EVERY_GPU: MOE_TABLES}, (0.0, 1e-3)),
    ProfileConstant("overheads.kernel_efficiency", *_overhead("kernel_efficiency"), 1.0,
                    "multiplier on compute throughput; 1.0 in every built-in (no correction)"),
    ProfileConstant("overheads.step_overhead_s", *_overhead("step_overhead_s"), 0.0,
                    "fixed cost per step; 0 in every built-in (calibrate fits it on measured runs)", bounds=(0.0, 10.0)),
    ProfileConstant("overheads.memory_fragmentation", *_overhead("memory_fragmentation"), 0.0,
                    "CUDA caching-allocator slack on live tensors (expandable segments, as TorchTitan and the "
                    "runtime run it): reserved / allocated - 1 at the peak. One value for every GPU, a property "
                    "of PyTorch's allocator, not of the part: fitted on the max-reserved memory of TorchTitan's "
                    "unpipelined runs (H100; the December tables and torchao's float8 benchmarks) and of the "
                    "runtime's own runs on a lent H200 (data/measured/runtime_runs.json); 5 % allocator practice "
                    "before the first fit",
                    {EVERY_GPU: TORCHTITAN[0:4] + (TORCHAO_FLOAT8, RUNTIME_RUNS)}, (0.0, 0.5), time=False),
    ProfileConstant("overheads.pp_memory_fragmentation",
                    lambda p: (p.overheads.memory_fragmentation if p.overheads.pp_memory_fragmentation is None
                               else p.overheads.pp_memory_fragmentation),
                    _overhead("pp_memory_fragmentation")[1], 0.0,
                    "the same slack where FSDP2 accumulates unsharded fp32 gradients under pipelining (memory."
                    "pp_accumulates): accumulators of hundreds of MB appear mid-step among the activations "
                    "being freed; fitted on TorchTitan's pipelined runs (max reserved), unsourced otherwise",
                    {"h100-96g-gt": TORCHTITAN[4:6]}, (0.0, 0.5), time=False),
    ProfileConstant("overheads.context_gib", *_overhead("context_gib"), 0.0,
                    "CUDA context + NCCL buffers + cuBLAS workspace per rank (~1 GiB)", time=False, bounds=(0.0, 4.0)),
)


def profile_constant(name: str) -> ProfileConstant:
    return next(c for c in PROFILE_CONSTANTS if c.name == name)


def model_constant_fields() -> list:
    """The code constants as dataclass fields (name, default value, metadata)."""
    return list(fields(ModelConstants))
