"""The workload `meshplan plan` assumes where the user leaves it open: sequence length and global
batch. Each default is printed among the search's assumptions, with the rule that gave it."""

from __future__ import annotations

from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.model import ModelSpec

# Llama 3 pre-trains at 8,192 tokens and reaches its 128k context in a later, separate stage
# (Llama 3 paper, arXiv:2407.21783, sections 3.4.1-3.4.2); TorchTitan's Llama 3.1 runs use 8,192.
PRETRAIN_SEQ_LEN = 8192
# TorchTitan's published Llama 3.1 H100 runs give every GPU 16k tokens a step: 8B on 8 and on 128
# GPUs at local batch 2 x 8,192, 70B on 256 GPUs at global batch 512 x 8,192
# (shared/data/published/torchtitan_llama31_h100_2024-12.csv, Tables 1, 3 and 4).
TOKENS_PER_DEVICE = 16 * 1024
# Llama 3 405B's largest batch: 16M tokens on 16k GPUs (Llama 3 paper, section 3.4.1).
MAX_TOKENS_PER_STEP = 16 * 1024 * 1024
# A host CPU is ~10^4 times slower than a GPU: a GPU token budget would step for hours. A CPU
# profile gets the batch whose estimated step takes about one second: the whole step as the cost
# model prices it (attention, memory-bound work and host costs included, which on a small model
# outweigh its matmuls), for plain data parallelism over the processes.
HOST_STEP_S = 1.0


def is_host_cpu(profile: ClusterProfile) -> bool:
    """A profile of CPU processes: measured on gloo (profile-cluster records the backend), or, for
    a profile that records none, one without a half-precision peak (GPUs all have one)."""
    world = (profile.provenance or {}).get("world")
    if isinstance(world, dict) and world.get("device_type"):
        return world["device_type"] == "cpu"
    peaks = profile.device.peak_tflops
    return "bf16" not in peaks and "fp16" not in peaks


def default_seq_len(spec: ModelSpec) -> tuple[int, str]:
    """The model's context, at most the pre-training length; with the note that says so."""
    seq = min(spec.max_seq_len, PRETRAIN_SEQ_LEN)
    why = ("the model's context" if seq == spec.max_seq_len
           else f"the pre-training length {PRETRAIN_SEQ_LEN:,} (the model's context is {spec.max_seq_len:,})")
    return seq, f"seq_len = {seq:,}: {why}; set --seq-len to change it"


# How far the CPU default doubles the batch: 2**13 sequences a process is far past a second of work.
MAX_HOST_DOUBLINGS = 13


def default_global_batch(spec: ModelSpec, seq_len: int, gpus: int, profile: ClusterProfile,
                         dtype: str) -> tuple[int, str]:
    """Sequences per step: a GPU cluster gets TorchTitan's 16k tokens per GPU (at most Llama 3's
    16M a step); a CPU profile about HOST_STEP_S of matmul work. Rounded down to a power of two."""
    if is_host_cpu(profile):
        tokens = host_batch(spec, seq_len, gpus, profile, dtype) * seq_len
        rule = f"an estimated step of about {HOST_STEP_S:g} s on this CPU profile (DDP over {gpus} processes)"
    else:
        tokens = min(TOKENS_PER_DEVICE * gpus, MAX_TOKENS_PER_STEP)
        rule = (f"{TOKENS_PER_DEVICE // 1024}k tokens per GPU as TorchTitan's Llama 3.1 runs, "
                f"at most {MAX_TOKENS_PER_STEP // 2**20}M as Llama 3")
    batch = _power_of_two_at_most(max(1.0, tokens / seq_len))
    return batch, (f"global_batch = {batch:,} sequences ({batch * seq_len:,} tokens): {rule}; "
                   "plans whose dp*micro_batch does not divide it are rejected; set --global-batch to change it")


def ddp_step_s(spec: ModelSpec, seq_len: int, gpus: int, profile: ClusterProfile, dtype: str, batch: int) -> float:
    """The estimated step time of `batch` sequences under plain data parallelism over `gpus`
    processes (one micro-batch a rank, no AC, no compile)."""
    from meshplan.cost_models.estimate import estimate_plan
    from meshplan.specs.plan import MemorySpec, ParallelSpec, Plan, TrainingSpec

    plan = Plan(model=spec, cluster=profile.name, gpus=gpus,
                training=TrainingSpec(seq_len=seq_len, global_batch=batch, micro_batch=batch // gpus, dtype=dtype),
                parallel=ParallelSpec(dp_replicate=gpus, dp_shard=1, tp=1, sequence_parallel=False, async_tp=False,
                                      pp=1, pp_schedule="1F1B", pp_virtual_stages=1, cp=1),
                memory=MemorySpec(activation_checkpointing="none", float8=False, reshard_after_forward=False))
    return estimate_plan(plan, profile).step_time_s


def host_batch(spec: ModelSpec, seq_len: int, gpus: int, profile: ClusterProfile, dtype: str) -> int:
    """The most sequences, gpus times a power of two, whose estimated DDP step is at most HOST_STEP_S
    (gpus, one a process, where none is). Doubling until the estimate passes it: a straight line through
    two estimates missed the boundary where the step is not linear in the batch (the optimizer's fixed
    part beside thin matmuls)."""
    batch = gpus
    for _ in range(MAX_HOST_DOUBLINGS):
        if ddp_step_s(spec, seq_len, gpus, profile, dtype, 2 * batch) > HOST_STEP_S:
            break
        batch *= 2
    return batch


def _power_of_two_at_most(x: float) -> int:
    b = 1
    while 2 * b <= x:
        b *= 2
    return b
