"""The published measurements meshplan is judged against, turned into plans.

Each row becomes a complete Plan plus the figure it must reproduce. What a source does not state
is assumed once here, and printed by `meshplan validate`:
- Megatron-LM SC'21 (Narayanan et al. 2021, Table 1): GPT with 4h MLP, vocab 51200, seq 2048,
  fp16 (as bf16), full activation recompute, DDP across data-parallel replicas, no sequence
  parallelism, 1F1B, micro-batch 1 when pipelined (else the estimate's best micro-batch), eager
  attention (scale-mask-softmax and dropout over the scores) and Megatron's own fused LayerNorm,
  bias-GeLU and bias-dropout-add kernels (elementwise_kernels="megatron"), no torch.compile.
- Korthikanti et al. 2022 Table 4 (one layer of the 22B GPT of their Table 3: TP 8, micro-batch 4,
  seq 2048, A100): the Megatron conventions above; "selective recompute" is theirs (the attention
  core alone); sequence parallelism's backward re-gather of its inputs is taken as hidden under the
  input-gradient matmul, which Megatron overlaps it with.
- TorchTitan (Llama 3.1 on H100 96GB at 500 W), priced on the torchtitan stack (stacks.py: selective
  AC is TorchTitan's op policy, every other matmul and SDPA saved), FSDP2 with reshard after forward (not with PP),
  pipeline micro-batches = PP degree (TorchTitan 9dec370's build_pipeline_schedule defaulted to
  pipeline_parallel_degree, though its help text says one per stage; the Interleaved 1F1B row's
  published speed-up over 1F1B is the bubble ratio at 8 micro-batches), Interleaved
  1F1B with 2 stages per rank split by TorchTitan's generate_split_points (126 layers over 8 stages:
  15, 16 x 6, 15), async TP only where listed. PyTorch's pipelining of Dec 2024 kept every
  micro-batch's stage output until the step ended (pp_keeps_outputs): on the last stage the bf16
  logits, since TorchTitan's model had returned them uncast from Oct 2024 (e10cb94 moved the fp32
  upcast into the loss).
  TorchTitan's Llama expanded K/V to every query head before SDPA (repeat_kv), and its context
  parallelism was PyTorch's ring attention, which gathered and merged them at that width
  (kv_repeated, cp_attention="ring"). Its torch.compile covered the blocks, not the loss (compiles_loss
  False: its train.py of late 2024 left `torch.compile(loss_fn)` commented out, "causes CUDA errors").
- TorchTitan's performance page of August 2024 (torchtitan_performance_doc_2024.csv): the December
  tables' conventions, on the same 500 W H100 (its 405B in 2D) and on the DGX A100 (Llama 3 and Llama 2
  in FSDP alone, 64 GPUs, whose network the page does not name), eager but where the run compiled,
  TorchTitan's Triton fused RMSNorm where the run's config names it (Layout.norm_kernel), FSDP's float8
  all-gather not priced; rows whose AC (every n-th layer) or compile flag is not expressible or not
  printed are skipped.
- torchao's float8 training benchmarks (torchao_float8_training_h100.csv; its float8 README of 2025-03): Llama 3 8B
  on 8 H100 by TorchTitan of that month, FSDP 8, op-level SAC, compiled blocks, bf16 and tensorwise float8, with
  the 2024 overrides (repeat_kv, the loss uncompiled); on the 500 W Grand Teton H100, which the README does not
  name; FSDP's float8 all-gather not priced; the rowwise-scaled row skipped. Its B200 table of 2025-08 (torchao_mx_
  training_b200.csv; TorchTitan 6fc499f6f, the loss compiled, repeat_kv) on max reserved memory alone: the
  B200s' power cap is not printed; its MXFP8 and rowwise rows skipped.
- Megatron-Bridge MoE runs on B200 and GB200 (moe_training_blackwell.csv; Megatron-Core with
  Transformer Engine), priced on the megatron-core stack (stacks.py): routing force-balanced (the page's footnote), so priced at imbalance 1;
  token-drop rows are skipped (their capacity factor is not printed). Megatron's DDP with the
  distributed optimizer gathers parameters and reduces gradients once per step: priced as FSDP over
  the data-parallel ranks without resharding, gradients synchronised at the last micro-batch (the
  stack's). The loss as an unfused cross-entropy (the stack's; whether the recipes fuse it is not
  printed). Expert
  parallelism folds into data x context x tensor parallelism as in TorchTitan (EP innermost after TP),
  expert-TP 1. MXFP8 and FP8 recipes as float8 (the parts' dense fp8 peak), BF16 as bf16. Fused
  kernels (Transformer Engine, cuDNN attention) as compiled blocks; flash attention with grouped K/V.
  The recipes' partial recompute (MLA up-projections, layer norms, the MoE activation) as Megatron-Core's
  recompute modules (RECOMPUTE_BY_ID_PREFIX, the plan's memory.recompute_modules). Pipelines with virtual stages as Interleaved 1F1B; DeepSeek-V3's
  layers per virtual stage as its recipes lay them out (DEEPSEEK_V3_LAYOUTS: the embedding with the
  first stage's layers, the multi-token-prediction module and the loss with the last's), other models'
  split evenly. DeepSeek-V3's MTP module runs where the row ran it (the plan's training.mtp_layers: a
  block of the last layer's kind, its projection and a second head on the last stage); its FLOPs are
  not in the model's count, which the tokens/s figure does not need. DeepEP's rows send a token
  across nodes once per destination node (DEEPEP_ROWS, the plan's parallel.ep_dispatch). The figure
  is tokens/s per GPU where the page prints it, else Megatron-Core's model TFLOP/s per GPU
  (flops.model_flops_per_token with causal attention).
- Megatron-Core MoE runs on H100 (moe_training_h100.csv; Liu et al. 2025, MoE Parallel Folding), priced as the
  Blackwell rows are where the paper's runs did the same, and as moe_h100_rows says where not: token-drop at
  capacity factor 1 (no expert over the mean), the settings the paper omits from its authors' configs of its
  date, the figure Megatron-Core's TFLOP/s with the attention counted whole. Scored, fitted on by nothing.
- MosaicML llm-foundry MPT (mosaicml_llmfoundry_mpt_throughput.csv; PyTorch FSDP1 through Composer,
  2023-24): MPT as a GPT block (LayerNorm, GELU MLP 4x, learned positions, tied embeddings; the
  page's parameter counts exactly), data parallel only: FULL_SHARD as FSDP with reshard after
  forward, SHARD_GRAD_OP without, gradients reduced at every micro-batch, the collectives prefetched
  beside each block (dp_overlap prefetch); flash attention; eager elementwise ops as ATen runs a GPT
  block (timing.ATEN_GPT_PASSES: its LayerNorm and GELU one kernel each), no torch.compile; the
  loss eager; gradients reduced in fp32. Composer's PURE mode reduces in bf16, and its DEFAULT mode
  did too in some 2023 releases (reduce_dtype = the precision) and not in later ones (fp32); the page
  does not name its Composer release, so the modes are not told apart (Layout.grad_reduce_bytes 4).
  Nor are its unpadding copies around flash attention and the flash-attention version of its day.
  The figure is tokens/s per GPU. A100 40GB rows (no built-in profile) and Transformer Engine FP8
  rows are skipped; H100 rows are priced on the 700 W h100-80g-dgx, A100 80GB rows on a100-80g-dgx
  (its 1600 Gb/s RoCE per node is the DGX A100's 8 x 200 Gb/s).
- AI2's OLMo-core (olmo_core_throughput.csv; its README's throughput table of 2024-11, H100): OLMo 2
  1B/7B/13B and a Llama 3 8B shape with its dolma2 vocabulary, seq 4096, BF16 and torchao float8,
  priced on the torchtitan stack, whose design OLMo-core's was then (FSDP2 over every GPU, reshard after
  forward, gradients reduced in fp32 at every micro-batch, per-block torch.compile and a compiled loss)
  but for its fused AdamW (optimizer_foreach False) and SDPA's FlashAttention-2 as TorchTitan's runs of
  that time dispatched it. OLMo 2's norm after attention and MLP (its reordered block) as the pre-norm
  block, the same kernels. The page prints no GPU count: 8, the scripts' launch default (32 moves no
  row by more than 0.7 points). The figure is tokens/s per GPU, on the 700 W h100-80g-dgx.
- Not a publication: meshplan's own runtime on a lent H200 (data/measured/runtime_runs.json), each run's
  plan as it ran, scored on its max reserved memory alone (MEMORY_ONLY, runtime_memory_rows).
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field, replace
from importlib import resources

from meshplan.cost_models.constants import (IBM_FMS, LLMFOUNDRY, MEGATRON_BRIDGE_MOE, MEGATRON_LM_GB200, MOE_MODEL_ZOO,
                                            MOE_PARALLEL_FOLDING,
                                            OLMO_CORE, RUNTIME_RUNS, TORCHAO_B200, TORCHAO_FLOAT8,
                                            TORCHTITAN_DOC_2024,
                                            moe_table)
from meshplan.profiles.registry import load_profile
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import MemorySpec, ParallelSpec, Plan, TrainingSpec, plan_from_dict
from meshplan.specs.registry import resolve_model
from meshplan.specs.rules import MEGATRON_CORE, TORCHTITAN, ep_reason


@dataclass
class PublishedRow:
    table: str
    label: str
    plan: Plan | None
    # "tflops_per_gpu" | "tokens_per_s_per_gpu" | "layer_forward_ms" | "layer_backward_ms" | MEMORY_ONLY
    metric: str
    published: float
    published_memory_gib: float | None = None
    skipped: str | None = None
    layout_overrides: dict = field(default_factory=dict)  # what the plan file cannot say about the run
    network_gbs_per_gpu: float | None = None  # the run's own network where its page states it (else the profile's)


def read_published_csv(name: str) -> list[dict[str, str]]:
    text = resources.files("meshplan.data.published").joinpath(name).read_text()
    return list(csv.DictReader(text.splitlines()))


def megatron_rows() -> list[PublishedRow]:
    rows = []
    for r in read_published_csv("narayanan2021_megatron_weak_scaling.csv"):
        h, layers, heads = int(r["Hidden size"]), int(r["Number of layers"]), int(r["Attention heads"])
        tp, pp, gpus = int(r["Tensor model-parallel size"]), int(r["Pipeline model-parallel size"]), int(r["Number of GPUs"])
        batch = int(r["Batch size"])
        name = f"gpt-{r['Number of parameters (billion)']}b"
        spec = ModelSpec(name=name, arch="gpt", dim=h, n_layers=layers, n_heads=heads, n_kv_heads=heads,
                         ffn_dim=4 * h, vocab_size=51200, max_seq_len=2048)
        dp = gpus // (tp * pp)
        plan = Plan(
            model=spec, cluster="a100-80g-dgx", gpus=gpus,
            training=TrainingSpec(seq_len=2048, global_batch=batch, micro_batch=1 if pp > 1 else "auto", dtype="bf16"),
            parallel=ParallelSpec(dp_replicate=dp, dp_shard=1, tp=tp, sequence_parallel=False, async_tp=False,
                                  pp=pp, pp_schedule="1F1B", pp_virtual_stages=1, pp_layers=None, cp=1),
            memory=MemorySpec(activation_checkpointing="full", sac_ops=None, float8=False, reshard_after_forward=True),
            compile=False,
        )
        rows.append(PublishedRow("Megatron-LM SC'21 Table 1", f"{name} TP{tp} PP{pp} {gpus} GPUs batch {batch}",
                                 plan, "tflops_per_gpu", float(r["Achieved teraFLOP/s per GPU"]),
                                 layout_overrides=dict(MEGATRON_OVERRIDES)))
    return rows


# Megatron-LM of 2021-22 ran its local DDP (--DDP-impl local, the default): train_step all-reduces the
# gradients after forward_backward_func returns, nothing overlapped (megatron/training.py, "All-reduce if
# needed"), and stepped Apex's FusedAdam (megatron/optimizer/__init__.py: `from apex.optimizers import
# FusedAdam as Adam`), scaling gradients only where their norm passes clip_grad: the fused count. Its pipeline
# allocates each receive buffer when the transfer is posted (megatron/p2p_communication.py _communicate at
# v2.6, 2021: torch.empty per call), not one per micro-batch up front.
MEGATRON_OVERRIDES = {"attention_kernel": "eager", "elementwise_kernels": "megatron", "grad_sync": "last_microbatch",
                      "dp_overlap": "none", "host_counted": False, "optimizer_foreach": False,
                      "checkpoint_early_stop": False, "fsdp_one_rank": False, "pp_recv_up_front": False}
KORTHIKANTI_EXPERIMENTS = {  # Table 4's rows: (sequence parallel, activation checkpointing)
    "Baseline no recompute": (False, "none"), "Sequence parallelism": (True, "none"),
    "Baseline with recompute (full)": (False, "full"), "Selective recompute": (False, "selective"),
    "Selective + sequence": (True, "selective"),
}


def korthikanti_layer_rows() -> list[PublishedRow]:
    """Table 4: forward and backward milliseconds of one 22B layer, per recompute / SP experiment."""
    cfg = next(r for r in read_published_csv("korthikanti2022_table3_model_configs.csv") if r["Model"] == "22B")
    h, heads, tp = int(cfg["Hidden size"]), int(cfg["Attention heads"]), int(cfg["Tensor parallel size"])
    mb = int(cfg["Micro-batch size"])
    spec = ModelSpec(name="gpt-22b", arch="gpt", dim=h, n_layers=int(cfg["Number of layers"]), n_heads=heads,
                     n_kv_heads=heads, ffn_dim=4 * h, vocab_size=51200, max_seq_len=2048)
    rows = []
    for r in read_published_csv("korthikanti2022_table4_per_layer_time_22B.csv"):
        sp, ac = KORTHIKANTI_EXPERIMENTS[r["Experiment"]]
        plan = Plan(
            model=spec, cluster="a100-80g-dgx", gpus=tp,
            training=TrainingSpec(seq_len=2048, global_batch=mb, micro_batch=mb, dtype="bf16"),
            parallel=ParallelSpec(dp_replicate=1, dp_shard=1, tp=tp, sequence_parallel=sp, async_tp=False,
                                  pp=1, pp_schedule="1F1B", pp_virtual_stages=1, pp_layers=None, cp=1),
            memory=MemorySpec(activation_checkpointing=ac, sac_ops=None, float8=False, reshard_after_forward=True),
            compile=False,
        )
        for metric, column in (("layer_forward_ms", "Forward (ms)"), ("layer_backward_ms", "Backward (ms)")):
            label = f"{r['Experiment']}: {column.split()[0].lower()}"
            rows.append(PublishedRow("Korthikanti 2022 Table 4 (22B layer)", label, plan, metric, float(r[column]),
                                     layout_overrides=dict(MEGATRON_OVERRIDES)))
    return rows


def _degrees(parallelism: str) -> dict[str, int]:
    return {k.lower(): int(v) for k, v in re.findall(r"(FSDP|TP|PP|CP)\s+(\d+)", parallelism)}


def torchtitan_split(n_layers: int, n_stages: int) -> list[int]:
    """TorchTitan's default stage split (generate_split_points, no split points given): the first
    stage gets n_layers // n_stages, the middle stages one more while the remainder lasts, the last
    stage what is left."""
    base, extra = divmod(n_layers, n_stages)
    layers = [base]
    for _ in range(n_stages - 2):
        layers.append(base + (1 if extra else 0))
        extra -= 1 if extra else 0
    return layers + [n_layers - sum(layers)]


# What TorchTitan's model and train.py of 2024 did that a plan does not say (the module docstring): K/V
# expanded to every query head (repeat_kv), PyTorch's ring attention under CP, the loss left uncompiled, and
# the embedding in the root FSDP unit (a unit of its own from 2025-07-28, stacks.py).
TORCHTITAN_2024_OVERRIDES = {"kv_repeated": True, "cp_attention": "ring", "compiles_loss": False,
                             "fsdp_embedding_unit": False}


def torchtitan_rows() -> list[PublishedRow]:
    rows = []
    for r in read_published_csv("torchtitan_llama31_h100_2024-12.csv"):
        size = r["model"].split()[-1].lower()
        spec = resolve_model(f"llama3-{size}")
        deg = _degrees(r["parallelism"])
        fsdp, tp, pp, cp = deg.get("fsdp", 1), deg.get("tp", 1), deg.get("pp", 1), deg.get("cp", 1)
        gpus = int(r["GPUs"])
        seq = int(re.match(r"\d+", r["sequence length"]).group())
        local = int(r["local batch size"])
        tech = r["techniques"]
        interleaved = "Interleaved" in tech
        n_micro = pp if pp > 1 else 1
        layers = torchtitan_split(spec.n_layers, pp * (2 if interleaved else 1)) if pp > 1 else None
        plan = Plan(
            model=spec, cluster="h100-96g-gt", gpus=gpus,
            training=TrainingSpec(seq_len=seq, global_batch=local * fsdp, micro_batch=local // n_micro, dtype="bf16"),
            parallel=ParallelSpec(dp_replicate=1, dp_shard=fsdp, tp=tp, sequence_parallel=tp > 1,
                                  async_tp="AsyncTP" in tech, pp=pp,
                                  pp_schedule="Interleaved1F1B" if interleaved else "1F1B",
                                  pp_virtual_stages=2 if interleaved else 1, pp_layers=layers, cp=cp),
            memory=MemorySpec(activation_checkpointing=r["activation checkpointing"], sac_ops=None,
                              float8="Float8" in tech, reshard_after_forward=pp == 1),
            compile="compile" in tech, stack=TORCHTITAN,
        )
        label = f"{r['table']}: {r['model']} {gpus} GPUs {r['parallelism']} seq {seq} | {tech}"
        tps = float(r["TPS/GPU"].replace(",", ""))
        overrides: dict = dict(TORCHTITAN_2024_OVERRIDES)
        if pp > 1:
            overrides["pp_keeps_outputs"] = True
        rows.append(PublishedRow(f"TorchTitan H100 ({r['table']})", label, plan, "tokens_per_s_per_gpu", tps,
                                 float(r["Memory(GiB)"]), layout_overrides=overrides))
    return rows


# TorchTitan's performance page of 2024 (torchtitan_performance_doc_2024.csv): its A100 tables as
# llama3-/llama2- models, the 405B table on the same 500 W Grand Teton H100 as the December tables.
TORCHTITAN_2024_PROFILES = {"H100": "h100-96g-gt", "A100": "a100-80g-dgx"}
# The page's AC column: "selective op" is TorchTitan's op policy (the stack's selective default); its
# "selective layer" rows (every n-th block checkpointed whole) are skipped in the CSV.
TORCHTITAN_2024_AC = {"no": "none", "selective op": "selective", "selective layer": "selective", "full": "full"}


def torchtitan_doc_2024_rows() -> list[PublishedRow]:
    """TorchTitan's performance page as of 2024-08 (docs/performance.md at 0809984f5): Llama 3.1 405B on 128
    H100 with FSDP 16 and TP 8 (Table 1), Llama 3 (Table 2) and Llama 2 (Table 3) on 64 A100 with FSDP alone.
    The December tables' conventions (torchtitan_rows) but for what the page's configs set otherwise:
    eager but where the CSV's compile column says the run compiled (Table 1's Float8 and Async TP rows: both
    need it, and the 405B config compiles); TorchTitan's Triton fused RMSNorm where the run's config names
    it (Layout.norm_kernel); FSDP's float8 all-gather, which the 405B config switches on, not priced (its
    gathers as bf16, as in the December tables)."""
    rows = []
    for r in read_published_csv("torchtitan_performance_doc_2024.csv"):
        name, size = r["model"].split()[1], r["model"].split()[-1].lower()
        spec = resolve_model(f"llama{name[0]}-{size}")
        deg = _degrees(r["parallelism"])
        fsdp, tp = deg.get("fsdp", 1), deg.get("tp", 1)
        gpus, seq, local = int(r["GPUs"]), int(r["sequence length"]), int(r["local batch size"])
        tech = r["techniques"]
        cluster = TORCHTITAN_2024_PROFILES["H100" if "H100" in r["hardware"] else "A100"]
        plan = Plan(
            model=spec, cluster=cluster, gpus=gpus,
            training=TrainingSpec(seq_len=seq, global_batch=local * fsdp, micro_batch=local, dtype="bf16"),
            parallel=ParallelSpec(dp_replicate=1, dp_shard=fsdp, tp=tp, sequence_parallel=tp > 1,
                                  async_tp="Async TP" in tech, pp=1, pp_schedule="1F1B", pp_virtual_stages=1, cp=1),
            memory=MemorySpec(activation_checkpointing=TORCHTITAN_2024_AC[r["activation checkpointing"]], sac_ops=None,
                              float8="Float8" in tech, reshard_after_forward=True),
            compile=r["compile"].startswith("true"), stack=TORCHTITAN,
        )
        label = (f"{r['table']}: {r['model']} | {tech.split('Optimizations: ')[-1]} | AC {r['activation checkpointing']}"
                 f" | {gpus} GPUs {r['parallelism']} seq {seq}")
        overrides = {**TORCHTITAN_2024_OVERRIDES,
                     "norm_kernel": "fused" if r["norm_type"] == "fused_rmsnorm" else "composite"}
        rows.append(PublishedRow(f"{TORCHTITAN_DOC_2024} ({r['table']})", label, plan, "tokens_per_s_per_gpu",
                                 float(r["TPS/GPU"]), skipped=r["skipped"] or None, layout_overrides=overrides))
    return rows


def torchao_float8_rows() -> list[PublishedRow]:
    """torchao's float8 training benchmarks (torchao_float8_training_h100.csv): Llama 3 8B on 8 H100 by TorchTitan of
    2025-03 (FSDP 8, local batch 1 of 8192 tokens, TorchTitan's op-level SAC, per-block torch.compile), in bf16 and
    with tensorwise float8, its FSDP all-gather in float8 (not priced: gathered as bf16, as in the 2024 pages) and
    its float8 weights recomputed in the backward, not saved. TorchTitan's model and train.py of the time did what
    TORCHTITAN_2024_OVERRIDES says (repeat_kv, the loss left uncompiled: components/loss.py at 0da8901b1). The
    figures are the median tokens/s per GPU and the max reserved memory TorchTitan's log printed (GiB, though
    the README's header says GB). The README names no H100 variant: priced on the 500 W Grand Teton part of the
    same organisation's December tables. The rowwise row is skipped (CSV)."""
    rows = []
    for r in read_published_csv("torchao_float8_training_h100.csv"):
        plan, label = _torchao_plan(r, "h100-96g-gt")
        rows.append(PublishedRow(TORCHAO_FLOAT8, label, plan, "tokens_per_s_per_gpu",
                                 float(r["median tokens/s per GPU"]), float(r["peak memory GiB"]),
                                 skipped=r["skipped"] or None, layout_overrides=dict(TORCHTITAN_2024_OVERRIDES)))
    return rows


def torchao_b200_memory_rows() -> list[PublishedRow]:
    """torchao's MX training benchmarks on B200 (torchao_mx_training_b200.csv): the same Llama 3 8B run as
    torchao_float8_rows, by TorchTitan of 2025-08 (6fc499f6f), whose train.py compiles the loss with the blocks
    (the torchtitan stack's default) and whose model still expands K/V before SDPA (repeat_kv). The B200s were
    power-limited to a cap the README does not print, so the rows are scored on max reserved memory alone
    (MEMORY_ONLY) and no constant is fitted on them. The MXFP8 and rowwise rows are skipped (CSV)."""
    rows = []
    for r in read_published_csv("torchao_mx_training_b200.csv"):
        plan, label = _torchao_plan(r, "b200-180g-dgx")
        memory = float(r["peak memory GiB"])
        rows.append(PublishedRow(TORCHAO_B200, label, plan, MEMORY_ONLY, memory, memory, skipped=r["skipped"] or None,
                                 layout_overrides={"kv_repeated": True}))
    return rows


def _torchao_plan(r: dict[str, str], cluster: str) -> tuple[Plan, str]:
    """A torchao benchmark row's TorchTitan run (its benchmark script: the model's toml, FSDP over every GPU, a
    local batch of `local batch size` sequences, op-level SAC, compiled blocks), and its label."""
    fsdp, local = _degrees(r["parallelism"])["fsdp"], int(r["local batch size"])
    plan = Plan(
        model=resolve_model(r["model"].lower()), cluster=cluster, gpus=int(r["GPUs"]),
        training=TrainingSpec(seq_len=int(r["sequence length"]), global_batch=local * fsdp, micro_batch=local,
                              dtype="bf16"),
        parallel=ParallelSpec(dp_replicate=1, dp_shard=fsdp, tp=1, sequence_parallel=False, async_tp=False, pp=1,
                              pp_schedule="1F1B", pp_virtual_stages=1, cp=1),
        memory=MemorySpec(activation_checkpointing=TORCHTITAN_2024_AC[r["activation checkpointing"]], sac_ops=None,
                          float8=bool(r["float8 recipe"]), reshard_after_forward=True),
        compile=r["compile"] == "true", stack=TORCHTITAN,
    )
    return plan, f"{r['model']} {r['GPUs']} GPUs {r['parallelism']} seq {r['sequence length']} | {r['scaling']}"


MOE_MODELS = {"DeepSeek-V3": "deepseek-v3", "GPT-OSS-120B": "gpt-oss-120b", "Qwen3-30B-A3B": "qwen3-30b-a3b",
              "Qwen3-235B-A22B": "qwen3-235b-a22b"}
MOE_PROFILES = {"GB200": "gb200-186g-nvl72", "B200": "b200-180g-dgx"}
MEGATRON_MOE_OVERRIDES = {"moe_imbalance": 1.0}


# Rows whose recipe ran Megatron-Core's EP overlap (overlap_moe_expert_parallel_comm with
# delay_wgrad_compute), read from each container's Megatron-Bridge recipe: docs/sources/
# megatron-bridge-moe-recipes.md. From 26.06 the GB200 MXFP8 recipes run it with full-iteration CUDA
# graphs and sync-free HybridEP (that file, "FI bundle"; e.g. qwen3_workload_base_configs.py at v0.5.0);
# before, only the three rows named here did.
FULL_ITERATION_FROM_CONTAINER = (26, 6)
EP_OVERLAP_ROWS = frozenset({
    "mb-26.04-gptoss120b-gb200-64g-bf16-gbs1280",  # HybridEP with A2A overlap (Megatron-Bridge v0.4.0)
    "mb-26.04.01-gptoss120b-gb200-64g-bf16-gbs1280",  # alltoall with overlap (PR #3561)
    "mb-26.04.01-dsv3-b200-256g-mxfp8-gbs4096",  # PP8/VP2/EP32, DeepEP, A2A overlap (PR #3368)
    # The model zoo prints each row's command: A2A_OVERLAP=1 in the 4k MXFP8 one alone, which
    # sbatch_benchmarking.sh turns into --overlap-moe-expert-parallel-comm --delay-wgrad-compute
    # (yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md, GB200 commands, at e865051).
    "mz-qwen3-235b-gb200-256g-mxfp8",
})
# Rows whose recipe dispatched through DeepEP (Megatron-Core's flex dispatcher, deepep backend), same
# file: their tokens cross nodes once per destination node (the plan's parallel.ep_dispatch). The
# HybridEP rows keep EP inside one NVLink domain (eight B200s, or an NVL72), where that changes nothing.
DEEPEP_ROWS = frozenset({
    "mb-26.04.01-dsv3-b200-256g-mxfp8-gbs4096",  # EP32 over four DGX B200 nodes (PR #3368)
})
# Rows whose recipe ran Megatron-Core's shared-expert overlap (the plan's parallel.shared_expert_overlap), same
# file. Megatron-Bridge's DeepSeek provider turns it on (deepseek_provider.py moe_shared_expert_overlap True at
# v0.2.0; the DeepSeek-V3 recipes from v0.4.0), and apply_flex_dispatcher_backend turns it off wherever a
# recipe names a flex backend the GPU takes (training/flex_dispatcher_backend.py): HybridEP on GB200 from
# v0.2.0 and on B200 from v0.3.0 (DEEPSEEK_V3_PRETRAIN_CONFIG_B200_V1), DeepEP, as the scripts' A2A-overlap
# preset does (set_moe_a2a_overlap_overrides). That leaves the 25.11 B200 row: v0.2.x's
# DEEPSEEK_V3_B200_BASE_CONFIG names no backend, so its alltoall dispatcher keeps the provider's overlap. Qwen3
# and GPT-OSS have no shared experts; Megatron-LM's GB200 notes name no such flag, and its default is off.
SHARED_EXPERT_OVERLAP_ROWS = frozenset({"mb-25.11-dsv3-b200-256g-fp8-mx-gbs2048-mtp"})


def cross_entropy_fusion(row: dict[str, str]) -> str:
    """The cross-entropy kernel an MoE row ran (the plan's training.cross_entropy_fusion, Layout.loss_kernel):
    Megatron-Bridge's performance scripts set
    cross_entropy_fusion_impl "te" over every recipe (scripts/performance/utils/overrides.py,
    _set_common_perf_overrides, at 9d70874; its GPT providers turn cross_entropy_loss_fusion on), Transformer
    Engine's fused Triton loss. The model zoo's yamls name "native" (model_configs/benchmarking/
    Qwen3-235B-A22B.yaml; DeepSeek-V3.yaml: "te ce fusion is broken"), as does Megatron-LM's default
    cross_entropy_fusion_impl under its GB200 notes' --cross-entropy-loss-fusion: Megatron-Core's
    fused_vocab_parallel_cross_entropy, which upcasts the logits and keeps fp32 exponentials as the eager loss does."""
    return "te" if row["id"].startswith("mb-") else "native"


def full_iteration_graphs(row: dict[str, str]) -> bool:
    """Whether a Megatron-Bridge MoE row's recipe ran the 26.06+ GB200 MXFP8 bundle: full-iteration CUDA
    graphs over sync-free HybridEP (docs/sources/megatron-bridge-moe-recipes.md, "FI bundle"). Every other
    recipe syncs host and device in each MoE layer and runs its experts eager (Layout.moe_host_sync),
    Megatron-LM's and the model zoo's rows among them (Megatron-Core 0.15-0.17, dropless)."""
    m = re.match(r"mb-(\d+)\.(\d+)", row["id"])
    return m is not None and (int(m[1]), int(m[2])) >= FULL_ITERATION_FROM_CONTAINER and row["gpu"] == "GB200" \
        and row["precision"] == "MXFP8"


# Models whose full-iteration MXFP8 recipe ran attention in MXFP8 (fp8_dot_product_attention=True in
# Megatron-Bridge v0.5.0's gpt_oss_ and qwen3_workload_base_configs.py, GPT_OSS_120B_ / QWEN3_235B_A22B_ /
# QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 and _V1; v0.6.0 perf_recipes/gpt_oss and qwen common.py alike).
# DeepSeek-V3's GB200 recipe leaves it off (perf_recipes/deepseek/common.py: False unless its caller sets it,
# which only the B300 and GB300 recipes do).
MXFP8_ATTENTION_MODELS = ("GPT-OSS-120B", "Qwen3-30B-A3B", "Qwen3-235B-A22B")


def attention_dtype(row: dict[str, str]) -> str | None:
    """The dtype a Megatron-Bridge MoE row's attention ran in where not the block's (Layout.attention_dtype)."""
    return "mxfp8" if full_iteration_graphs(row) and row["model"] in MXFP8_ATTENTION_MODELS else None


def ep_overlapped(row: dict[str, str]) -> bool:
    """Whether a MoE row's recipe overlapped its all-to-alls (EP_OVERLAP_ROWS): Megatron-Bridge's recipes
    and the model zoo's printed commands. Megatron-LM's notes print no such flag, and its default is off."""
    return full_iteration_graphs(row) or row["id"] in EP_OVERLAP_ROWS


# Megatron-Bridge's DeepSeek-V3 pipeline layouts, decoder layers per virtual stage by (pp, vp): the embedding
# rides with the first stage's layers, the MTP modules and the loss with the last's (recipes/deepseek/
# deepseek_v3.py, set_deepseek_v3_pipeline_model_parallel_layout; the same map at v0.2.2, v0.4.2, 067f987). Other
# (pp, vp) pairs get no layout from the recipe and are split evenly here. Megatron-LM's GB200 notes print
# theirs: Et|(tt|)*30L, one layer with the embedding, two a stage, the loss alone.
DEEPSEEK_V3_LAYOUTS = {
    (4, 1): (16, 16, 16, 13), (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,),
    (16, 1): (4,) * 15 + (1,), (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,),
}
MEGATRON_LM_DEEPSEEK_V3_LAYOUT = (1,) + (2,) * 30 + (0,)


def deepseek_v3_layout(row: dict[str, str], pp: int, vp: int) -> list[int] | None:
    """The layers per virtual stage a DeepSeek-V3 row's recipe laid out, or None for an even split."""
    if row["model"] != "DeepSeek-V3" or pp == 1:
        return None
    if row["id"].startswith("mlm-"):
        return list(MEGATRON_LM_DEEPSEEK_V3_LAYOUT)
    layout = DEEPSEEK_V3_LAYOUTS.get((pp, vp)) if row["id"].startswith("mb-") else None
    return list(layout) if layout else None


def mtp_layers(row: dict[str, str]) -> int:
    """DeepSeek-V3's multi-token-prediction modules as a row ran them (the plan's training.mtp_layers). The
    25.11 page prints "w/ MTP" or "w/o MTP" (the ids' -mtp / -nomtp); later pages print neither, and the
    recipes set mtp_num_layers 1 (recipes/deepseek/deepseek_v3.py from v0.3.0; the performance scripts do
    not override it). Megatron-LM's GB200 notes lay out no MTP."""
    if row["model"] != "DeepSeek-V3" or not row["id"].startswith("mb-"):
        return 0
    if row["id"].endswith("-nomtp"):
        return 0
    return 1


# Megatron-Core recompute modules each row's recipe ran (recompute_granularity "selective"; the plan's
# memory.recompute_modules), read from the recipes:
# - Megatron-Bridge (docs/sources/megatron-bridge-moe-recipes.md): Qwen3 none (qwen3_llm_pretrain.py sets
#   recompute_granularity None in every tag); GPT-OSS-120B's BF16 presets layernorm and moe_act in every tag
#   (gpt_oss_workload_base_configs.py v0.2.0-v0.5.0, GPT_OSS_120B_*_BF16_V1, inherited by V2), its 26.06+
#   MXFP8 full-iteration preset none (recompute_modules=[], v0.5.0 GB200_FP8_MX_V2); DeepSeek-V3
#   mla_up_proj, but mlp on GB200 in 26.04 and 26.04.01 (v0.4.0/v0.4.2 DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_V1,
#   PR #3031) and mla_up_proj with mlp on the 26.04.01 B200 row (v0.4.2 B200_FP8_MX_V2, PR #3368);
# - the model zoo's printed commands (best_practice/qwen3/readme.md): the MXFP8 rows moe_act and layernorm
#   (what runs of them below), the BF16 row none;
# - Megatron-LM's GB200 notes: the baseline mlp and the MLA up-projection ("--recompute-modules mlp
#   up_proj"), the final run mlp and moe_act ("changed to --recompute-modules mlp moe_act").
RECOMPUTE_BY_ID_PREFIX = {
    "mb-25.09-dsv3": ("mla_up_proj", "mlp", "moe_act"),  # skipped rows (token-drop); the table's 25.09 line
    "mb-26.04-dsv3-gb200": ("mlp",), "mb-26.04.01-dsv3-gb200": ("mlp",),
    "mb-26.04.01-dsv3-b200": ("mla_up_proj", "mlp"),
    # The 256-GPU MXFP8 command also names layernorm, but graphs the router (--cuda-graph-scope attn moe_router
    # moe_preprocess), and Megatron-Core then keeps the pre-MLP norm (transformer_layer.py); the 128k one graphs
    # nothing.
    "mz-qwen3-235b-gb200-256g-mxfp8": ("moe_act",), "mz-qwen3-235b-gb200-128g-mxfp8": ("moe_act", "layernorm"),
    "mlm-dsv3-gb200-256g-mxfp8-baseline": ("mlp", "mla_up_proj"), "mlm-dsv3-gb200-256g-mxfp8-final": ("mlp", "moe_act"),
}
RECOMPUTE_BY_MODEL = {"DeepSeek-V3": ("mla_up_proj",), "GPT-OSS-120B": ("layernorm", "moe_act")}


def recompute_modules(row: dict[str, str]) -> tuple[str, ...]:
    """The recompute modules a Blackwell MoE row's recipe ran (RECOMPUTE_BY_ID_PREFIX, else its model's
    Megatron-Bridge preset; none under the full-iteration bundle or for the model zoo's and Megatron-LM's
    other rows)."""
    for prefix, modules in RECOMPUTE_BY_ID_PREFIX.items():
        if row["id"].startswith(prefix):
            return modules
    if not row["id"].startswith("mb-") or (full_iteration_graphs(row) and row["model"] == "GPT-OSS-120B"):
        return ()
    return RECOMPUTE_BY_MODEL.get(row["model"], ())


# The model zoo's MXFP8 run on 256 GB200s offloaded its experts' fc1 and activation inputs to host memory
# (best_practice/qwen3/readme.md at e865051, its printed command: --fine-grained-activation-offloading
# --offload-modules expert_fc1 moe_act; its table: "activation offloading required"). No other row offloads.
OFFLOAD_BY_ID = {"mz-qwen3-235b-gb200-256g-mxfp8": ["expert_fc1", "moe_act"]}


def optimizer_precision(row: dict[str, str]) -> tuple[str | None, str | None]:
    """(AdamW's moments, the main gradients) as an MoE row's recipe kept them under Megatron-Core's precision-aware
    optimizer (the plan's memory.optimizer_state_dtype, memory.main_grads_dtype; None: fp32):
    - Megatron-Bridge's DeepSeek-V3 recipe: both bf16 (recipes/deepseek/deepseek_v3.py, exp_avg_dtype,
      exp_avg_sq_dtype and main_grads_dtype torch.bfloat16, "Different from default float32", v0.2.0 to v0.5.0;
      the performance scripts turn the optimizer off only under Megatron FSDP, utils/overrides.py). Its other
      models' recipes set none, and the scripts' use_precision_aware_optimizer for bf16 runs keeps fp32 states;
    - the model zoo's MXFP8 runs: bf16 moments, fp32 main gradients (sbatch_benchmarking.sh at e865051: PR mxfp8
      adds --use-precision-aware-optimizer --main-grads-dtype fp32 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16;
      its BF16 runs add none);
    - Megatron-LM's GB200 notes: bf16 moments, fp32 main gradients (their baseline's "BF16 optimizer states":
      --main-grads-dtype fp32 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16), kept in the final run."""
    if row["id"].startswith("mb-"):
        return ("bf16", "bf16") if row["model"] == "DeepSeek-V3" else (None, None)
    if row["id"].startswith("mz-"):
        return ("bf16", None) if row["precision"] == "MXFP8" else (None, None)
    return "bf16", None


def grad_reduce_precision(row: dict[str, str]) -> str | None:
    """The dtype an MoE row reduced its gradients in (the plan's memory.grad_reduce_dtype; None: Megatron-Core's
    own, bf16). Megatron-Bridge's performance scripts set ddp.grad_reduce_in_fp32 False for every model they run
    (scripts/performance/configs/{deepseek,gpt_oss,qwen3}/*_llm_pretrain.py, v0.2.1 to v0.5.0): bf16. The model
    zoo's and Megatron-LM's notes' runs go through Megatron-LM's arguments.py, name no --grad-reduce-in-bf16 and
    keep fp32 main gradients, which it then accumulates and reduces in fp32."""
    return None if row["id"].startswith("mb-") else "fp32"


def ep_dispatch(row: dict[str, str]) -> str:
    """How a Megatron-Bridge MoE row's dispatcher crossed nodes (DEEPEP_ROWS; parallel.ep_dispatch)."""
    return "deepep" if row["id"] in DEEPEP_ROWS else "all_to_all"


# The publication behind each row of moe_training_blackwell.csv, by its id's prefix (the file's source column).
MOE_SOURCE_BY_PREFIX = {"mb": MEGATRON_BRIDGE_MOE, "mz": MOE_MODEL_ZOO, "mlm": MEGATRON_LM_GB200}


def moe_row_table(row: dict[str, str]) -> str:
    """The validation table of a row: its publication and model (constants.MOE_TABLES)."""
    return moe_table(MOE_SOURCE_BY_PREFIX[row["id"].split("-")[0]], row["model"])


def moe_degrees(r: dict[str, str]) -> dict[str, int]:
    """An MoE row's degrees, batch and length (moe_training_blackwell.csv and moe_training_h100.csv alike)."""
    return {k: int(r[k]) for k in ("tp", "pp", "vp", "cp", "ep", "dp", "micro_batch", "global_batch", "seq_len",
                                   "gpus")}


def moe_label(r: dict[str, str], deg: dict[str, int]) -> str:
    return (f"{r['model']} {r['gpu']} {deg['gpus']} GPUs TP{deg['tp']} PP{deg['pp']} VP{deg['vp']} CP{deg['cp']} "
            f"EP{deg['ep']} mb{deg['micro_batch']} gbs{deg['global_batch']} {r['precision']} ({r['id']})")


def moe_parallel(deg: dict[str, int], **more) -> ParallelSpec:
    """An MoE row's mesh as Megatron-Core ran it: DP as FSDP-sharded ranks, SP with TP, Interleaved 1F1B with
    virtual stages; `more` sets the ParallelSpec fields a source states (pipeline layout, dispatch, EP overlap)."""
    v = deg["vp"]
    return ParallelSpec(dp_replicate=1, dp_shard=deg["dp"], tp=deg["tp"], sequence_parallel=deg["tp"] > 1,
                        async_tp=False, pp=deg["pp"], pp_schedule="Interleaved1F1B" if v > 1 else "1F1B",
                        pp_virtual_stages=v, cp=deg["cp"], ep=deg["ep"], **more)


def moe_blackwell_rows() -> list[PublishedRow]:
    rows = []
    for r in read_published_csv("moe_training_blackwell.csv"):
        deg = moe_degrees(r)
        fp8 = r["precision"] != "BF16"
        label = moe_label(r, deg)
        skipped = None
        if r["routing"].startswith("token-drop"):
            skipped = "token-drop routing, capacity factor not printed"
        elif "known perf regression" in r["notes"]:
            skipped = "the page footnotes a known performance regression in this container"
        v = deg["vp"]
        modules = recompute_modules(r)
        plan = Plan(
            model=resolve_model(MOE_MODELS[r["model"]]), cluster=MOE_PROFILES[r["gpu"]], gpus=deg["gpus"],
            training=TrainingSpec(seq_len=deg["seq_len"], global_batch=deg["global_batch"],
                                  micro_batch=deg["micro_batch"], dtype="bf16", mtp_layers=mtp_layers(r),
                                  cross_entropy_fusion=cross_entropy_fusion(r)),
            parallel=moe_parallel(deg, pp_layers=deepseek_v3_layout(r, deg["pp"], v), ep_dispatch=ep_dispatch(r),
                                  ep_overlap=ep_overlapped(r),
                                  shared_expert_overlap=r["id"] in SHARED_EXPERT_OVERLAP_ROWS),
            memory=MemorySpec(activation_checkpointing="selective" if modules else "none", sac_ops=None, float8=fp8,
                              reshard_after_forward=False, recompute_modules=list(modules) or None,
                              optimizer_state_dtype=optimizer_precision(r)[0],
                              main_grads_dtype=optimizer_precision(r)[1],
                              offload_modules=OFFLOAD_BY_ID.get(r["id"]),
                              grad_reduce_dtype=grad_reduce_precision(r)),
            compile=False, stack=MEGATRON_CORE,
        )
        # Tokens per second where the row prints them: the pages' TFLOP/s follow each release's FLOP formula,
        # which changed for GPT-OSS between releases (27.1-27.2 GFLOP a token in most BF16 rows, 30.7 in one,
        # 32.6 in the later MXFP8 ones; data/published README). Megatron-LM's and the model zoo's rows print TFLOP/s alone.
        metric, value = (("tokens_per_s_per_gpu", r["tokens_per_s_per_gpu"]) if r["tokens_per_s_per_gpu"]
                         else ("mcore_tflops_per_gpu", r["tflops_per_gpu"]))
        rows.append(PublishedRow(moe_row_table(r), label, plan, metric, float(value),
                                 skipped=skipped,
                                 layout_overrides={**MEGATRON_MOE_OVERRIDES,
                                                   "moe_host_sync": not full_iteration_graphs(r),
                                                   "moe_fused_mlp": full_iteration_graphs(r),
                                                   "attention_dtype": attention_dtype(r)}))
    return rows


# Megatron-Core's MoE runs on H100 in Liu et al. 2025, MoE Parallel Folding (arXiv 2504.14960; moe_training_h100.csv):
# the "MCore w/ Folding" rows whose layout the plan states (EP folded into the attention's data and tensor ranks,
# expert-TP 1). The paper prints CP/TP/EP/PP/ETP, batch and length; what it leaves out is taken from the
# benchmarking configs its authors published 18 days before it (yanring/Megatron-MoE-ModelZoo at 78fd4d6,
# 2025-04-03, whose runtime.conf names the paper's layouts: Mixtral-8x22B TP2 PP8 EP8 on 16 nodes, Qwen2-57B-A14B
# TP2 PP4 EP4 on 8): micro-batch 1, virtual stages 7 (Qwen2), no recompute, the alltoall
# dispatcher, the distributed optimizer overlapping its gathers and reductions; tp-comm-overlap in Mixtral's yaml,
# not in Qwen2's; the shared-expert overlap in Qwen2's; no cross-entropy fusion in either (Megatron-Core's
# unfused loss). bf16 gradients are reduced in fp32 (Megatron-LM's arguments.py of the time: fp32 main gradients
# under bf16). Mixtral runs 7 virtual stages, the zoo's setting from 7f59386 (2025-07-30): its 78fd4d6 said 1, which
# the paper's own strong scaling rules out whatever the cost model (tests/foundation/test_moe_h100_rows.py: at
# 16 micro-batches a 1F1B bubble of 7 would cap the 1024-GPU row at 379 TFLOP/s; it printed 444). The benchmarks
# drop tokens at capacity factor 1, so no expert holds more than the mean (moe_imbalance 1); without padding to
# capacity (the paper names none) the dispatcher still syncs the host for the kept tokens (Layout.moe_host_sync,
# the stack's).
# The figure is model TFLOP/s per GPU: MFU times the paper's 989.5. The paper prints no FLOP formula; its runs
# (PyTorch 2.5.0, CUDA 12.6: NGC 24.10) predate Megatron-LM's 8873b55d6a (2025-03-06), which halved the
# attention term for causal masks, so its count is the full one (validate.py "mcore_full_attention_tflops").
MOE_H100_MODELS = {"Mixtral-8x22B": "mixtral-8x22b", "Qwen2-57B-A14B": "qwen2-57b-a14b"}
# Layout fields each model's yaml at 78fd4d6 sets apart from the stack's (stacks.py MEGATRON_CORE).
MOE_H100_MODEL_OVERRIDES = {"Qwen2-57B-A14B": {"tp_comm_overlap": False}}
# Plan fields each model's yaml at 78fd4d6 sets: Qwen2-57B-A14B's --moe-shared-expert-overlap (its shared expert
# beside the all-to-alls; Mixtral has none).
MOE_H100_MODEL_PARALLEL = {"Qwen2-57B-A14B": {"shared_expert_overlap": True}}


def moe_h100_rows() -> list[PublishedRow]:
    """The H100 MoE rows (moe_training_h100.csv), priced as the comment above says; a row whose EP the plan cannot
    fold (rules.ep_reason) is skipped with that reason."""
    rows = []
    for r in read_published_csv("moe_training_h100.csv"):
        deg = moe_degrees(r)
        spec = resolve_model(MOE_H100_MODELS[r["model"]])
        skipped = ep_reason(spec, deg["ep"], deg["dp"], deg["cp"], deg["tp"])
        plan = Plan(
            model=spec, cluster="h100-80g-dgx", gpus=deg["gpus"],
            training=TrainingSpec(seq_len=deg["seq_len"], global_batch=deg["global_batch"],
                                  micro_batch=deg["micro_batch"], dtype="bf16"),
            parallel=moe_parallel(deg, **MOE_H100_MODEL_PARALLEL.get(r["model"], {})),
            memory=MemorySpec(activation_checkpointing="none", sac_ops=None, float8=r["precision"] != "BF16",
                              reshard_after_forward=False, grad_reduce_dtype="fp32"),
            compile=False, stack=MEGATRON_CORE,
        )
        rows.append(PublishedRow(moe_table(MOE_PARALLEL_FOLDING, r["model"]), moe_label(r, deg), plan,
                                 "mcore_full_attention_tflops", float(r["tflops_per_gpu"]),
                                 skipped=skipped and f"EP inside the attention's ranks (parallel.ep {skipped})",
                                 layout_overrides={**MEGATRON_MOE_OVERRIDES,
                                                   **MOE_H100_MODEL_OVERRIDES.get(r["model"], {})}))
    return rows


# MPT sizes of llm-foundry's benchmark page: (d_model, n_heads, n_layers) of scripts/train/yamls/pretrain/
# mpt-<size>.yaml (expansion ratio 4, vocab 50368); with learned positions over the row's sequence and
# tied embeddings each reproduces the page's NumParams column exactly (tests/foundation/test_llmfoundry_rows.py).
MPT_SIZES = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
             "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48),
             "70b": (8192, 64, 80)}
# The built-in profile of each GPU that the FSDP1 pages (llm-foundry, fms-fsdp) name.
FSDP1_PAGE_PROFILES = {"h100_80gb": "h100-80g-dgx", "a100_80gb": "a100-80g-dgx"}
# What Composer's FSDP (PyTorch FSDP1) and MPT ran that the plan file cannot say: eager LayerNorm in
# bf16 (submit_benchmarks.py sets norm_type low_precision_layernorm), FlashAttention in Triton (the
# attn_impl default of submit_benchmarks.py when the tables were run, b2a43a147 and 5e85bd62d: "triton";
# it became "flash" at 495218376, after them), no torch.compile, the loss eager and flash-attn's fused
# cross-entropy: ComposerMPTCausalLM's loss_fn defaults to "fused_crossentropy" (flash_attn.losses.
# cross_entropy.CrossEntropyLoss, not in place) from fccd16efa (2023-03), no pretrain yaml sets another, and
# submit_benchmarks.py installs the `.[gpu]` extras, which pin its xentropy-cuda-lib (setup.py at b2a43a147);
# and after each micro-batch's backward Composer's two MPT train metrics (Layout.metric_losses; MPT's
# use_train_metrics defaults true, no pretrain yaml sets it).
LLMFOUNDRY_OVERRIDES = {"attention_kernel": "triton", "elementwise_kernels": "pytorch", "compiles_loss": False,
                        "fsdp_copies": False, "loss_kernel": "xentropy", "metric_losses": 2}


def mpt_spec(size: str, seq_len: int) -> ModelSpec:
    d, heads, layers = MPT_SIZES[size]
    return ModelSpec(name=f"mpt-{size}", arch="gpt", dim=d, n_layers=layers, n_heads=heads, n_kv_heads=heads,
                     ffn_dim=4 * d, vocab_size=50368, tied_embeddings=True, max_seq_len=seq_len)


def llmfoundry_skip(r: dict[str, str]) -> str | None:
    """Why a row of the page is not scored, or None."""
    gpus, mb, accum, gbs = (int(r[k]) for k in ("gpus", "micro_batch", "grad_accum", "global_batch"))
    if r["gpu"] not in FSDP1_PAGE_PROFILES:
        return f"no built-in profile for {r['gpu']}"
    if r["precision"] == "amp_fp8":
        return "Transformer Engine FP8 (delayed scaling, its fused LayerNorm-linear), not torchao float8"
    if gbs != gpus * mb * accum:
        return f"uneven micro-batches ({gbs} over {gpus} GPUs in micro-batches of {mb})"
    return None


def llmfoundry_early_stop(r: dict[str, str]) -> bool:
    """Whether a row's full AC replay stopped at the last saved tensor (Layout.checkpoint_early_stop): PyTorch's
    non-reentrant checkpoint does from 2.1 (set_checkpoint_early_stop), and Composer wraps MPT's blocks
    non-reentrant (the yamls' activation_checkpointing_reentrant: false). The page's amp_bf16 rows were run by
    sweep.sh with IMAGE mosaicml/pytorch:2.1.0 (b2a43a147, 2023-10-19, which re-ran the 8-GPU A100 rows; the
    large H100 rows in 5e85bd62d likewise); its two remaining PURE bf16 A100 rows (MPT-70B on 32 and 64 GPUs)
    are older, when submit_benchmarks.py's default image was mosaicml/pytorch:1.13.1, before early stop."""
    return r["mp_mode"] != "PURE"


def llmfoundry_rows() -> list[PublishedRow]:
    """MosaicML's MPT throughput table (PyTorch FSDP1 through Composer, data parallel only): FULL_SHARD
    as FSDP with reshard after forward, SHARD_GRAD_OP without; gradients reduce-scattered at every
    micro-batch (Composer's FSDP has no no_sync); gradients reduced in fp32 whatever the mixed-precision
    mode (see the module docstring); activation checkpointing per block where listed."""
    rows = []
    for r in read_published_csv("mosaicml_llmfoundry_mpt_throughput.csv"):
        size, seq, gpus = r["model"], int(r["seq_len"]), int(r["gpus"])
        ac = r["activation_checkpointing"] == "True"
        plan = Plan(
            model=mpt_spec(size, seq), cluster=FSDP1_PAGE_PROFILES.get(r["gpu"], "a100-80g-dgx"), gpus=gpus,
            training=TrainingSpec(seq_len=seq, global_batch=int(r["global_batch"]), micro_batch=int(r["micro_batch"]),
                                  dtype="bf16"),
            parallel=ParallelSpec(dp_replicate=1, dp_shard=gpus, tp=1, sequence_parallel=False, async_tp=False, pp=1,
                                  pp_schedule="1F1B", pp_virtual_stages=1, pp_layers=None, cp=1),
            memory=MemorySpec(activation_checkpointing="full" if ac else "none", sac_ops=None, float8=False,
                              reshard_after_forward=r["sharding"] == "FULL_SHARD"),
            compile=False,
        )
        label = (f"{r['table'].split(' with ')[0]}: MPT-{size} {gpus} GPUs seq {seq} mb {r['micro_batch']} "
                 f"x{r['grad_accum']} {r['sharding']}{' AC' if ac else ''}")
        rows.append(PublishedRow(LLMFOUNDRY, label, plan,
                                 "tokens_per_s_per_gpu", float(r["tokens_per_s_per_gpu"]), skipped=llmfoundry_skip(r),
                                 layout_overrides={**LLMFOUNDRY_OVERRIDES,
                                                   "checkpoint_early_stop": llmfoundry_early_stop(r)}))
    return rows


# What fms-fsdp ran that the plan file cannot say: SDPA's flash attention (FlashAttention-2), its eager
# RMSNorm and RoPE, and torch.compile (where on) over the model, not the loss (main_training.py compiles
# the model; the cross-entropy is computed outside it).
# Gradients reduced in bf16: fms-fsdp's bfSixteen MixedPrecision (fms_fsdp/policies/mixed_precision.py,
# reduce_dtype=torch.bfloat16), FSDP1's reduce-scatter and HSDP's all-reduce alike.
IBM_OVERRIDES = {"attention_kernel": "flash", "elementwise_kernels": "pytorch", "compiles_loss": False,
                 "grad_reduce_bytes": 2.0, "fsdp_copies": False}


def llama2_spec(size: str) -> ModelSpec:
    """fms-fsdp's Llama 2 variants (fms_fsdp/utils/config_utils.py get_model_config): the 7B and 70B as
    Meta's; the 34B as the 70B's shape with 48 layers and an FFN of 22016 (Code Llama 34B's)."""
    if size == "34b":
        return replace(resolve_model("llama2-70b"), name="llama2-34b", n_layers=48, ffn_dim=22016)
    return resolve_model(f"llama2-{size}")


def ibm_skip(r: dict[str, str]) -> str | None:
    """Why a row of the fms-fsdp tables is not scored, or None. Its "Selective AC" checkpoints a share of
    the blocks (fms_fsdp/policies/ac_handler.py, selective_checkpointing), which the table does not print;
    its HFU / MFU tells the share (recompute adds a forward: 4/3 for every block). The page runs the same
    scripts on both GPUs, so one share per model: 34B and 70B at 1.24-1.35, full recompute within the
    rounding of two-digit MFUs, priced as full AC; 13B at 1.07-1.16 (about 2 blocks in 5), a layout the
    plan file cannot state."""
    if r["activation_checkpointing"] == "Selective AC" and float(r["hfu"]) / float(r["mfu"]) < 1.2:
        return f"selective AC over a share of the blocks (HFU / MFU {float(r['hfu']) / float(r['mfu']):.2f})"
    return None


def ibm_fms_rows() -> list[PublishedRow]:
    """IBM's Llama 2 pre-training throughput with PyTorch FSDP1 (fms-fsdp README; no gradient accumulation:
    the 7B's batch is the page's 1M tokens on 128 GPUs, the others' not printed and taken alike). HSDP
    as FSDP over a node's 8 GPUs replicated across nodes, FSDP as FSDP over all; FULL_SHARD (reshard after
    forward) both, as fms-fsdp's sharding strategies. The network is the page's per node (400 Gb/s on the
    A100s, 800 on the H100s) over the node's 8 GPUs; the rest of the cluster as the DGX profile."""
    rows = []
    for r in read_published_csv("ibm_fms_fsdp_llama2_throughput.csv"):
        gpus, size = int(r["gpus"]), r["model"]
        cluster = FSDP1_PAGE_PROFILES[r["gpu"]]
        hsdp = r["sharding"] == "HSDP"
        ac = "none" if r["activation_checkpointing"] == "No AC" else "full"
        compiled = r["compile"] == "True"
        node_gbs = float(r["network_gbps"]) / 8  # the page's Gb/s between nodes, in GB/s
        plan = Plan(
            model=llama2_spec(size), cluster=cluster, gpus=gpus,
            training=TrainingSpec(seq_len=int(r["seq_len"]), global_batch=gpus * int(r["micro_batch"]),
                                  micro_batch=int(r["micro_batch"]), dtype="bf16"),
            parallel=ParallelSpec(dp_replicate=gpus // 8 if hsdp else 1, dp_shard=8 if hsdp else gpus, tp=1,
                                  sequence_parallel=False, async_tp=False, pp=1, pp_schedule="1F1B",
                                  pp_virtual_stages=1, pp_layers=None, cp=1),
            memory=MemorySpec(activation_checkpointing=ac, sac_ops=None, float8=False, reshard_after_forward=True),
            compile=compiled,
        )
        label = (f"Llama2-{size} {r['gpu'].split('_')[0].upper()} {gpus} GPUs {r['sharding']} "
                 f"{r['activation_checkpointing']}{' compiled' if compiled else ''}")
        rows.append(PublishedRow(IBM_FMS, label, plan, "tokens_per_s_per_gpu", float(r["tokens_per_s_per_gpu"]),
                                 skipped=ibm_skip(r), layout_overrides=dict(IBM_OVERRIDES),
                                 network_gbs_per_gpu=node_gbs / load_profile(cluster).devices_per_node))
    return rows


# What OLMo-core ran that the plan file cannot say (olmo_core_rows): fused AdamW (AdamWConfig(fused=True) in
# every script), SDPA's FlashAttention-2 on H100, and RoPE with real cos/sin (RoPEType.default, its
# RotaryEmbedding's rotate-half), not TorchTitan's complex multiply.
OLMO_CORE_OVERRIDES = {"optimizer_foreach": False, "attention_kernel": "flash", "rope_complex": False}


def olmo_core_spec(r: dict[str, str]) -> ModelSpec:
    """A row's model as OLMo-core's TransformerConfig built it (llama_like at e27ba7455): untied embeddings,
    RoPE theta 500,000 (olmo_* and llama3_8B), RMS-normed q and k on the OLMo 2 shapes."""
    base = resolve_model("llama2-7b")
    return replace(base, name=f"olmo-core-{r['model_size'].lower()}-{r['model_arch'].lower()}",
                   dim=int(r["d_model"]), n_layers=int(r["n_layers"]), n_heads=int(r["n_heads"]),
                   n_kv_heads=int(r["n_kv_heads"]), ffn_dim=int(r["ffn_hidden"]), vocab_size=int(r["vocab_size"]),
                   qk_norm=r["qk_norm"] == "True", rope_theta=500000.0, max_seq_len=int(r["seq_len"]))


def olmo_core_rows() -> list[PublishedRow]:
    """OLMo-core's throughput table (module docstring): data parallel only, FSDP over every GPU, no
    activation checkpointing, compiled, float8 where the row passes float8_config.enabled."""
    rows = []
    for r in read_published_csv("olmo_core_throughput.csv"):
        gpus, seq = int(r["gpus"]), int(r["seq_len"])
        float8 = "float8_config.enabled=true" in r["overrides"]
        plan = Plan(
            model=olmo_core_spec(r), cluster=FSDP1_PAGE_PROFILES[r["gpu"]], gpus=gpus,
            training=TrainingSpec(seq_len=seq, global_batch=int(r["global_batch"]), micro_batch=int(r["micro_batch"]),
                                  dtype="bf16"),
            parallel=ParallelSpec(dp_replicate=1, dp_shard=gpus, tp=1, sequence_parallel=False, async_tp=False, pp=1,
                                  pp_schedule="1F1B", pp_virtual_stages=1, pp_layers=None, cp=1),
            memory=MemorySpec(activation_checkpointing="none", sac_ops=None, float8=float8, reshard_after_forward=True),
            compile=True, stack=TORCHTITAN,
        )
        label = f"{r['model_size']} {r['model_arch']} {gpus} GPUs seq {seq} mb {r['micro_batch']} {r['precision']}"
        rows.append(PublishedRow(OLMO_CORE, label, plan, "tokens_per_s_per_gpu", float(r["tokens_per_s_per_gpu"]),
                                 layout_overrides=dict(OLMO_CORE_OVERRIDES)))
    return rows


# A row scored on peak memory alone (max reserved GiB): no step time to judge.
MEMORY_ONLY = "reserved_gib"


def runtime_memory_rows() -> list[PublishedRow]:
    """The runtime's own runs on a lent GPU (data/measured/runtime_runs.json, written by
    benchmarks/runtime_memory_rows.py from gpu_truth's run summaries), scored on their max reserved memory
    alone: a second stack and part beside TorchTitan's H100 for the allocator's slack. Their step times are
    gpu_truth's own check (its tables' error column): one GPU of one part, whose rate no fit here sets."""
    doc = json.loads(resources.files("meshplan.data.measured").joinpath("runtime_runs.json").read_text())
    return [PublishedRow(RUNTIME_RUNS, f"{r['id']} (1 {r['device']}, {r['commit']}, torch {r['torch']})",
                         plan_from_dict(r["plan"]), MEMORY_ONLY, r["reserved_gib"], published_memory_gib=r["reserved_gib"])
            for r in doc["runs"]]


def all_training_rows() -> list[PublishedRow]:
    """Every published training row, skipped ones included (validate lists them with the reason), and the
    runtime's own memory rows."""
    return (megatron_rows() + korthikanti_layer_rows() + torchtitan_rows() + torchtitan_doc_2024_rows()
            + torchao_float8_rows() + torchao_b200_memory_rows()
            + moe_blackwell_rows() + moe_h100_rows() + llmfoundry_rows()
            + ibm_fms_rows() + olmo_core_rows() + runtime_memory_rows())
