"""`meshplan run --plan P --slurm`: an sbatch script that runs the plan on a Slurm allocation.

One torchrun agent per node (`srun`, one task per node), `--nproc-per-node` workers each; the
agents meet at a c10d rendezvous on the first host of `scontrol show hostnames
$SLURM_JOB_NODELIST`, with the job id as rendezvous id. The script is printed, not submitted.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from meshplan.runtime.launcher import ALLOCATOR_ENV, ALLOCATOR_ENV_NAMES, TORCHRUN_ENV, WORKER_ARGV

DEFAULT_RDZV_PORT = 29500


@dataclass(frozen=True)
class SlurmOptions:
    nodes: int
    gpus_per_node: int
    job_name: str
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    max_restarts: int = 0
    rdzv_port: int = DEFAULT_RDZV_PORT


def sbatch_directives(s: SlurmOptions) -> list[str]:
    lines = [f"#SBATCH --job-name={s.job_name}", f"#SBATCH --nodes={s.nodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={s.gpus_per_node}", "#SBATCH --output=%x-%j.out"]
    for flag, value in (("partition", s.partition), ("time", s.time), ("account", s.account)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    return lines


def sbatch_script(s: SlurmOptions, python: str, worker_argv: list[str], header: str) -> str:
    """The whole script; `worker_argv` are the `meshplan run` flags every worker gets."""
    torchrun = [shlex.quote(python), "-m", "torch.distributed.run", f"--nnodes={s.nodes}",
                f"--nproc-per-node={s.gpus_per_node}", "--rdzv-backend=c10d",
                '--rdzv-endpoint="${head_node}:${rdzv_port}"', '--rdzv-id="${SLURM_JOB_ID}"',
                f"--max-restarts={s.max_restarts}", *WORKER_ARGV]
    worker = " ".join(shlex.quote(a) for a in worker_argv)
    chosen = "".join(f"${{{name}:-}}" for name in ALLOCATOR_ENV_NAMES)  # empty unless the job set one
    return "\n".join([
        "#!/bin/bash",
        "# " + " ".join(header.split()),  # one comment line whatever the plan path holds
        "# Submit with: sbatch <this file>",
        *sbatch_directives(s),
        "set -euo pipefail",
        "",
        "# The c10d rendezvous (a TCP store) lives on the first node of the allocation.",
        'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        'head_node="${nodes[0]}"',
        f'rdzv_port="${{MESHPLAN_RDZV_PORT:-{s.rdzv_port}}}"',
        'echo "meshplan: ${#nodes[@]} nodes, rendezvous at ${head_node}:${rdzv_port}"',
        "",
        "# One torchrun agent per node; torchrun starts the workers and assigns global ranks.",
        "# A fresh store per attempt, so --max-restarts can restart the workers (see launcher.py).",
        *(f"export {k}={v}" for k, v in TORCHRUN_ENV.items()),
        "# The CUDA allocator as TorchTitan runs it, unless the job's environment sets one (launcher.py).",
        *(f'[ -n "{chosen}" ] || export {k}={v}' for k, v in ALLOCATOR_ENV.items()),
        f"srun --nodes={s.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\",
        "  " + " ".join(torchrun) + " \\",
        "  " + worker,
        "",
    ])
