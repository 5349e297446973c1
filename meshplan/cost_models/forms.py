"""The functional forms the cost model could take where physics leaves a choice and the evidence has to
make it: each alternative is written here, FORMS holds the shipped one, and `meshplan validate --cross
--nested` chooses among them by nested cross-validation (nested.py), never by the score it then reports.
The cost model reads FORMS at call time, so `forms(...)` switches a form for the duration of a `with`."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator


@dataclass(frozen=True)
class Forms:
    # What async TP hides (timing.block_time), with the fitted share overheads.tp_async_overlap:
    # traffic: that share of every TP collective of the block, whatever it runs beside;
    # window: each collective under that share of the matmul it is fused with (an all-gather beside the
    # projection it feeds, a reduce-scatter beside the one it drains: PyTorch's fused_all_gather_matmul
    # and fused_matmul_reduce_scatter), so a thin model's collectives, long beside its matmuls, hide less.
    async_tp: str = "traffic"
    # What data-parallel collectives hide under (estimate.data_parallel_comm):
    # windows: each collective under the compute of the micro-batch it is issued in (every window whole,
    # overheads.fsdp_overlap 1 on GPUs), the compute beside it slowed by overheads.comm_compute_slowdown
    # (sourced), nothing fitted;
    # pooled: every collective against one fitted share (overheads.fsdp_overlap) of the critical rank's
    # work over the step, no contention: the form shipped until 2026-11-27 (0.195 fitted).
    dp_overlap: str = "windows"
    # What the compute beside a hidden data-parallel collective pays (estimate.DataParallelComm.contention,
    # windows form only), overheads.comm_compute_slowdown times:
    # hidden_time: the time the collective hides, at whatever rate its links run;
    # kernel_work: the same share of the collective at the node level's rate, the rate Lee et al.'s 4-GPU
    # runs measured the slowdown at (a node's worth of GPUs; the abstract does not name the links). The
    # kernels' SM and HBM work is the bytes they reduce and copy, which a slower network spreads over a
    # longer time without adding to it (NCCL's maintainers put the slowdown beside its kernels down to
    # HBM traffic, NVIDIA/nccl#1428 and #1433, and NCCL gives a slower platform fewer SMs, #689). Chosen
    # by nested cross-validation in 13 of 14 folds and on every table
    # (benchmarks/results/validate_nested-contention.txt, 4a51f11); hidden_time shipped before.
    contention: str = "kernel_work"
    # Which rows a device's sustained rate (device.sustained_fraction, a rate constant) is fitted on:
    # all: every row of its tables;
    # measured_kernels: only rows whose every kernel the profile prices from a measurement. GPT-OSS's
    # attention runs with learnable sinks, which no profile has measured (cuDNN's GB200 benchmark ran its
    # sliding window without them), so its rows would lend their unpriced kernel time to every kernel of
    # the device (constants.UNMEASURED_KERNEL_TABLES). Chosen by nested cross-validation on the MoE tables,
    # the only rows it moves (benchmarks/nested_rate_rows.py; benchmarks/results/validate_nested-rate_rows.txt).
    # measured_kernels shipped while the folds that decide chose it (3 of 4 folds at 3806845, 2 of the 3 that
    # decide at 15ae290, where every table together already chose all). Since Megatron-Core's recompute
    # modules and YaRN's RoPE are priced (749e021, 4cf3699), all is chosen on every table and in 2 of the 3
    # folds that decide (GPT-OSS's fold is a tie: without its rows the two are one), so all ships, though
    # its rows score worse per row out of sample (the choice is the nested procedure's, not that score's).
    rate_rows: str = "all"
    # Which hidden collectives slow the compute beside them by overheads.comm_compute_slowdown (as the
    # contention form says: their kernel work or their hidden time):
    # data_parallel: the data-parallel ones alone (estimate.data_parallel_comm);
    # every: also those a mechanism hides inside a block (timing.overlap_contention): the all-to-alls
    # Megatron-Core's EP overlap runs under another micro-batch, Transformer Engine's P2P ring exchanges
    # and its userbuffers' TP chunks. Async TP's fitted share stands for its contention too, as the pooled
    # data-parallel share did.
    overlap_contention: str = "data_parallel"
    # The Blackwell parts' memory-bound rate (device.memory_bound_efficiency of the B200 and the GB200), which
    # prices every kernel the roofline leaves memory-bound there: norms, activations, the MoE layer's routing,
    # permutations and eager expert passes, the loss, casts, the optimizer:
    # sourced: 0.7 of datasheet HBM bandwidth, as STREAM-like copy kernels reach on A100 and H100;
    # fitted: fitted on the Blackwell MoE rows with the tensor-core rate (coordinate descent, crossval.fit),
    # each rate on how the rows' mix of memory-bound and tensor-core work varies.
    # Chosen by nested cross-validation on the MoE tables, the only rows it moves (benchmarks/nested_rate_rows.py
    # memory_rate, benchmarks/results/validate_nested-memory_rate.txt): sourced in 4 of 6 folds and on every table
    # at 9c961b6 (inner error 0.05274 against 0.05333), 15.4 % nested. At 3bc6f86 it had chosen fitted in 4 of 6
    # by a descent that does not converge on this pair: coordinate descent zig-zagged between the two Blackwell rates, which trade
    # off along a ridge, and stopped at MAX_SWEEPS still moving them (0.31 % of their bounds in a fold of
    # validate --cross, read with py-spy, 2026-12-07); crossval.fit now searches the pair jointly.
    memory_rate: str = "sourced"
    # What a compiled Llama-style block's elementwise kernels move (timing.elementwise_times):
    # speedup: eager PyTorch's passes (timing._pytorch_elementwise_bytes) shrunk by one fitted factor,
    # overheads.compile_speedup, fitted on how compiled rows differ from eager ones inside a source;
    # fused: Inductor fuses each chain of pointwise ops between two matmuls into kernels that read their
    # inputs and write their outputs once (RMSNorm with the residual add before it, RoPE, SwiGLU, the
    # attention output's layout), the passes Megatron-Core's hand-fused kernels make
    # (timing.MEGATRON_CORE_LLAMA_PASSES): counted, not fitted (compile_speedup still shrinks the loss and
    # the float8 casts). On GPUs (NCCL profiles), whose rows chose it; a CPU profile keeps its speed-up, as
    # the runs it prices (Inductor's C++ kernels on a few cores, tiny models) were not part of the choice.
    # Chosen by nested cross-validation on the dense tables in 11 of 11 folds and on every table
    # (benchmarks/nested_dense_form.py, benchmarks/results/validate_nested-compiled_elementwise.txt,
    # aceab46; 10 of 11 at e001b1a, before TorchTitan's complex RoPE was priced); speedup shipped before.
    compiled_elementwise: str = "fused"
    # Whether FSDP2's copies on the compute stream are priced (estimate.fsdp_copy_time, Layout.fsdp_copies):
    # counted: each gather's copy-out of the unsharded parameters and each reduction's copy-in of the
    # gradients, memory-bound passes counted from fully_shard's collectives, nothing fitted;
    # none: not priced (the form shipped until 2026-12-06), what the sustained rates absorb.
    # On GPUs (NCCL profiles), whose rows chose it; a CPU profile keeps none, as compiled_elementwise's
    # speedup: its runs (gloo, tiny models) were not part of the choice, and its calibrated terms carry them.
    # Chosen by nested cross-validation on the dense tables in 11 of 11 folds and on every table
    # (benchmarks/nested_dense_form.py fsdp_copies, benchmarks/results/validate_nested-fsdp_copies.txt,
    # 083cbc2): 5.9 % over the 189 dense rows nested (6.0 % nested with none, at aceab46:
    # validate_nested-compiled_elementwise.txt).
    fsdp_copies: str = "counted"
    # What full AC's eager replay runs again (timing._recompute_time, activations.replay_stops_early):
    # whole: the block's whole forward, its last matmul (ffn_out) included (the form shipped until 2026-12-06);
    # early_stop: what the stack's checkpoint runs (Layout.checkpoint_early_stop): torch.utils.checkpoint's
    # non-reentrant replay stops once every tensor the forward saved is recomputed (set_checkpoint_early_stop,
    # on by default since PyTorch 2.1), so a dense block's ffn_out, whose output nothing saves, is not run
    # again (counted with a dispatch mode over torch 2.13's checkpoint of an MPT-like block: the replay runs
    # qkv, attention, attn_out, ffn_in and the activation, not the down projection); Megatron's
    # CheckpointFunction replays the whole forward. On GPUs (NCCL profiles), whose rows chose it; a CPU profile
    # keeps whole, as for fsdp_copies: counted there, meshplan calibrate's synthetic fit lost its optimum.
    # Chosen by nested cross-validation on the dense tables in
    # 11 of 11 folds and on every table (benchmarks/nested_dense_form.py checkpoint_replay,
    # benchmarks/results/validate_nested-checkpoint_replay.txt, 2334c5e): 4.9 % over the 189 dense rows
    # nested, 5.9 % with whole (validate_nested-fsdp_copies.txt, 083cbc2).
    checkpoint_replay: str = "early_stop"
    # What a compiled loss moves (timing.loss_times, Layout.loss_compiled: OLMo-core's compile_loss, TorchTitan's
    # and meshplan's runtime's compiled loss):
    # speedup: eager PyTorch's passes over fp32 logits shrunk by the fitted overheads.compile_speedup, which is
    # fitted on rows whose loss runs eager (it came out 1.0, its bound: the compiled loss cost as much as the
    # eager one);
    # fused: Inductor's kernels counted (timing.COMPILED_LOSS_BYTES, counted by Inductor's own scheduler):
    # 4 bytes a logit each way where eager moves about 16. On GPUs (NCCL profiles), as the forms above.
    # Chosen by nested cross-validation on the dense tables in 10 of 11 folds and on every table (benchmarks/
    # nested_dense_form.py compiled_loss, benchmarks/results/validate_nested-compiled_loss.txt, d538114: inner
    # error 0.00401 against 0.00433); OLMo-core's own fold, whose rows alone compile the loss, is a tie without
    # them. 4.8 % over the 189 dense rows nested. speedup shipped before.
    compiled_loss: str = "fused"
    # What a fused attention kernel sustains in a training step, against the rate its profile points
    # give (compute.attention_tflops; the fallback without points, a share of peak, is derated either way):
    # derated: every point is a best-case benchmark rate, derated by device.sustained_fraction as MAMF's
    # matmuls are;
    # in_step: points tagged in_step are rates a training step runs at, taken as they are, the others
    # derated. Tagged are cuDNN's: on a lent H200 the cuDNN attention SDPA ran inside a compiled
    # llama3.2-3b step went 598 / 437 TFLOP/s forward / backward at seq 4096 against 591 / 474 in cuDNN's own
    # H200 SDPA training benchmark (h200-141g-dgx, whose points, and the H100 profiles' cuDNN ones, are that
    # step's rates), so the same benchmark's GB200 rows (the Blackwell built-ins' points) are taken as what
    # a step runs too. FlashAttention-2's published H100 figures, which the dense rows run, stay derated:
    # taking every point as it is was tried first (the alternative "measured", 2026-12-06) and the dense
    # tables rejected it in 11 of 11 folds (inner error 0.00401 against 0.01263;
    # benchmarks/results/validate_nested-attention_rate-dense.txt), FlashAttention-2's rates at face value
    # pricing the H100 rows' attention too fast. No dense row runs a tagged point, so in_step moves only the
    # MoE rows and is chosen on them (benchmarks/nested_rate_rows.py attention_rate,
    # benchmarks/results/validate_nested-attention_rate-moe.txt, with grouped_rate transferred): in_step on every
    # table (inner error 0.05538 against 0.06930) and in 3 of 4 folds, Qwen3-235B-A22B's choosing derated
    # (0.06336 against 0.06587); the procedure scores 9.8 % nested, where derated alone scores 10.2 % leaving
    # one model out. derated shipped before.
    attention_rate: str = "in_step"
    # How a part without grouped-GEMM measurements of its own prices an MoE layer's grouped expert GEMMs
    # (compute.grouped_matmul_time):
    # matmul: each expert's product as a matmul of its own shape, which on a part whose matmul model has no
    # shape fall-off (half_dim 0: the Blackwell built-ins) runs at its best-case rate whatever the shape;
    # transferred: at the shape curve another part measured, relative to that part's best-case rate (its
    # MAMF), times this part's: the Blackwell built-ins carry the lent H200's torch._grouped_mm points
    # (benchmarks/results/grouped_gemm-NVIDIA_H200-9816110.md: 0.68 of its MAMF at 4096 tokens of
    # 2048 x 768, 0.96 at 2048 x 7168, far less below 1024 tokens), scaled by their MAMF over the H200's, in
    # bf16 and fp8 (grouped_points tagged transferred). No Blackwell grouped GEMM is in data/published.
    # Chosen by nested cross-validation on the MoE tables, the only rows it moves (benchmarks/nested_rate_rows.py
    # grouped_rate, benchmarks/results/validate_nested-grouped_rate.txt): transferred on every table (inner
    # error 0.06930 against 0.07303) and in 2 of 4 folds, DeepSeek-V3's and Qwen3-30B-A3B's by clear margins,
    # GPT-OSS-120B's and Qwen3-235B-A22B's near ties for matmul (0.07970 against 0.08016, 0.06298 against
    # 0.06387); the procedure scores 11.9 % nested, where matmul alone scores 12.9 % leaving one model out.
    # matmul shipped before.
    grouped_rate: str = "transferred"
    # How a grouped GEMM's rate is read off a profile's grouped points for a shape between or beyond them
    # (compute.grouped_matmul_time):
    # weighted: inverse-distance weighting in log2 of the shape (compute._interpolate_points), exact at a
    # point; beyond the measured range it tends to the mean of every point, the thin ones among them;
    # saturating: a saturating form (peak x m/(m+h_m) x n/(n+h_n) x k/(k+h_k)) fitted to the points, times
    # their departures from it interpolated as above (compute._saturating_rate): exact at a point too, and
    # beyond the range at the form's level, as a GEMM's rate levels off once its tiles fill the GPU;
    # extrapolated: weighted inside the measured range of every axis; beyond it, the weighted rate at the
    # range's edge times the saturating form's growth from there (compute._extrapolated_rate).
    # Chosen by nested cross-validation on the MoE tables, the only rows it moves, with Megatron-Core's H100 runs
    # of the MoE Parallel Folding paper among them (benchmarks/nested_rate_rows.py grouped_shape,
    # benchmarks/results/validate_nested-grouped_shape.txt, a4bb21b): saturating on every table (inner error
    # 0.05312 against 0.06036 extrapolated and 0.06921 weighted) and in 4 of 6 folds; Qwen3-235B-A22B's chose
    # weighted (0.07991 against 0.08297), Mixtral-8x22B's extrapolated (0.05402 against 0.05694). weighted
    # shipped before: it read Mixtral-8x22B's expert, 4096 tokens of 6144 x 16384 on an H100, at 528 TFLOP/s
    # where the grid's largest shape ran 765 (saturating: 794, the part's MAMF). The Blackwell rows alone score
    # worse under it out of sample (docs/cost-model.md), the H100 rows far better.
    grouped_shape: str = "saturating"


FORMS = Forms()
ALTERNATIVES: dict[str, tuple[str, ...]] = {"async_tp": ("traffic", "window"), "dp_overlap": ("windows", "pooled"),
                                            "contention": ("hidden_time", "kernel_work"),
                                            "rate_rows": ("all", "measured_kernels"),
                                            "overlap_contention": ("data_parallel", "every"),
                                            "memory_rate": ("sourced", "fitted"),
                                            "compiled_elementwise": ("speedup", "fused"),
                                            "fsdp_copies": ("none", "counted"),
                                            "checkpoint_replay": ("whole", "early_stop"),
                                            "compiled_loss": ("speedup", "fused"),
                                            "attention_rate": ("derated", "in_step"),
                                            "grouped_rate": ("matmul", "transferred"),
                                            "grouped_shape": ("weighted", "saturating", "extrapolated")}


@contextmanager
def forms(**chosen: str) -> Iterator[Forms]:
    """FORMS with some forms replaced, for the duration."""
    global FORMS
    for name, value in chosen.items():
        if value not in ALTERNATIVES[name]:
            raise ValueError(f"form {name}: {value!r} is not one of {ALTERNATIVES[name]}")
    old = FORMS
    FORMS = replace(old, **chosen)
    try:
        yield FORMS
    finally:
        FORMS = old
