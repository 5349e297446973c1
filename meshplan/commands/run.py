"""`meshplan run --plan P [--steps N] [--data synthetic|PATH] [--out DIR] [--seed S] [--resume]`
plus the launch flags: `--nnodes N --node-rank R --rdzv-endpoint HOST:PORT` (several nodes),
`--max-restarts K` (fault recovery), `--slurm` (print an sbatch script instead of running).

Outside torchrun this validates everything (plan, flags, files) and then launches torchrun
(launcher.py) or prints the sbatch script (slurm.py); nothing is started or written when any input
is bad. Inside torchrun (RANK / WORLD_SIZE set) it is the worker (worker.py).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from meshplan.commands.argparsing import ArgumentParser
from meshplan.errors import InputError
from meshplan.runtime.launcher import LaunchOptions
from meshplan.runtime.options import RunOptions, check_device, check_runnable, local_device_type
from meshplan.runtime.slurm import SlurmOptions
from meshplan.specs.plan import Plan, load_plan

NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
SLURM_VALUE = re.compile(r"^[A-Za-z0-9_.,:@+-]+$")
# Slurm --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2})$")
MAX_SEED = 2**31 - 1


def parser() -> ArgumentParser:
    ap = ArgumentParser(prog="meshplan run", description="Execute a plan with native PyTorch distributed APIs.")
    ap.add_argument("--plan", required=True, help="plan YAML (e.g. best.yaml)")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps to run (default 10)")
    ap.add_argument("--data", default="synthetic", help="'synthetic' or a flat token file (uint16/uint32)")
    ap.add_argument("--data-dtype", default="auto", help="token file dtype: uint16 | uint32 | auto (by vocab size)")
    ap.add_argument("--out", default=None, help="run directory for metrics.jsonl, summary.json, checkpoints")
    ap.add_argument("--seed", type=int, default=0, help="seed of weights and synthetic data (default 0)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint in --out "
                                                          "(written under this or any other plan of the same model)")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="checkpoint every K steps (and always at the end)")
    ap.add_argument("--no-final-checkpoint", action="store_true",
                    help="write no checkpoint at the end (a measurement run: 3B with AdamW is 38 GB on disk)")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    ap.add_argument("--warmup-steps", type=int, default=None, help="LR warm-up steps (default steps/10, at least 1)")
    ap.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping norm (default 1.0)")
    ap.add_argument("--timing-warmup", type=int, default=2, help="first steps left out of the measured medians (default 2)")
    ap.add_argument("--track-memory", default="warmup", choices=("warmup", "all", "off"),
                    help="CPU peak-memory tracking: on warm-up steps (default), every step, or off")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="torch.profiler trace of this many steps after the timing warm-up, per rank, "
                         "in <out>/profile/ (needs --out; default 0: none)")
    ap.add_argument("--balanced-routing", action="store_true",
                    help="MoE test mode: each token position takes fixed experts, evenly, whatever the router "
                         "scores (which still weigh the outputs): losses comparable across layouts exactly")
    ap.add_argument("--quiet", action="store_true", help="no per-step lines on the terminal")
    launch = ap.add_argument_group("launch (torchrun)")
    launch.add_argument("--nnodes", type=int, default=None, help="nodes taking part (default 1); one torchrun agent each")
    launch.add_argument("--node-rank", type=int, default=0, help="this node's rank, 0..nnodes-1 (default 0)")
    launch.add_argument("--nproc-per-node", type=int, default=None, help="workers on this node (default gpus / nnodes)")
    launch.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the c10d rendezvous (needed with --nnodes > 1)")
    launch.add_argument("--rdzv-backend", default="c10d", help="torchrun rendezvous backend (default c10d)")
    launch.add_argument("--rdzv-id", default="meshplan", help="rendezvous id shared by the nodes of one job")
    launch.add_argument("--max-restarts", type=int, default=0,
                        help="restarts of the worker group after a failure, each resuming from the newest checkpoint")
    slurm = ap.add_argument_group("slurm (print an sbatch script to stdout, do not run)")
    slurm.add_argument("--slurm", action="store_true", help="print an sbatch script for the plan and exit")
    slurm.add_argument("--gpus-per-node", type=int, default=None,
                       help="GPUs per node (default --nproc-per-node, else the cluster profile's devices per node)")
    slurm.add_argument("--partition", default=None, help="sbatch --partition")
    slurm.add_argument("--time", default=None, help="sbatch --time (e.g. 04:00:00 or 1-00:00:00)")
    slurm.add_argument("--account", default=None, help="sbatch --account")
    slurm.add_argument("--job-name", default=None, help="sbatch --job-name (default meshplan-<model>)")
    return ap


@dataclass
class RunRequest:
    """Everything `meshplan run` was asked, validated."""

    plan: Plan
    plan_path: str
    opts: RunOptions
    launch: LaunchOptions
    slurm: SlurmOptions | None

    def worker_argv(self) -> list[str]:
        return ["--plan", str(Path(self.plan_path).resolve()), *self.opts.to_argv()]


def _positive(value: int | float, flag: str, minimum: float = 1) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(flag, f"must be a finite number, got {value}")
    if value < minimum:
        raise InputError(flag, f"must be >= {minimum}, got {value}")


def run_options(args, plan: Plan) -> RunOptions:
    _positive(args.steps, "--steps")
    _positive(args.checkpoint_every, "--checkpoint-every", 0)
    _positive(args.timing_warmup, "--timing-warmup", 0)
    if not math.isfinite(args.lr) or args.lr <= 0:
        raise InputError("--lr", f"must be a finite number > 0, got {args.lr}")
    if not math.isfinite(args.max_grad_norm) or args.max_grad_norm <= 0:
        raise InputError("--max-grad-norm", f"must be a finite number > 0, got {args.max_grad_norm}")
    if args.warmup_steps is not None:
        _positive(args.warmup_steps, "--warmup-steps")
    if not 0 <= args.seed <= MAX_SEED:
        raise InputError("--seed", f"must be in 0..{MAX_SEED}, got {args.seed}")
    if args.data_dtype not in ("auto", "uint16", "uint32"):
        raise InputError("--data-dtype", f"must be uint16, uint32 or auto, got {args.data_dtype!r}")
    if args.data != "synthetic":
        check_token_file(args.data, args.data_dtype, plan)
    if args.balanced_routing and not plan.model.is_moe:
        raise InputError("--balanced-routing", f"applies to mixture-of-experts models only; {plan.model.name} is dense")
    if args.resume and not args.out:
        raise InputError("--resume", "needs --out (the run directory holding the checkpoints)")
    if args.resume:
        from meshplan.runtime.checkpoint import check_resumable

        check_resumable(Path(args.out), plan.model.to_dict(), plan.training.seq_len, plan.training.global_batch)
    _positive(args.profile_steps, "--profile-steps", 0)
    if args.profile_steps and not args.out:
        raise InputError("--profile-steps", "needs --out (the run directory the traces go to)")
    if args.profile_steps and args.timing_warmup + args.profile_steps > args.steps:
        raise InputError("--profile-steps", f"{args.profile_steps} steps after {args.timing_warmup} of warm-up "
                                            f"need --steps >= {args.timing_warmup + args.profile_steps}")
    if args.checkpoint_every and not args.out:
        raise InputError("--checkpoint-every", "needs --out (the run directory the checkpoints go to)")
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise InputError("--out", f"{args.out} exists and is not a directory")
    return RunOptions(steps=args.steps, data=args.data, data_dtype=args.data_dtype, out=args.out, seed=args.seed,
                      resume=args.resume, checkpoint_every=args.checkpoint_every, lr=args.lr,
                      final_checkpoint=not args.no_final_checkpoint,
                      warmup_steps=args.warmup_steps, max_grad_norm=args.max_grad_norm,
                      timing_warmup=args.timing_warmup, track_memory=args.track_memory, quiet=args.quiet,
                      profile_steps=args.profile_steps, balanced_routing=args.balanced_routing)


def check_token_file(path: str, dtype: str, plan: Plan) -> None:
    """A flat token file must exist, be a whole number of tokens and hold more than one sequence."""
    p = Path(path)
    if not p.is_file():
        raise InputError("--data", f"file not found: {path} (use 'synthetic' or a flat token file)")
    if dtype == "auto":
        dtype = "uint16" if plan.model.vocab_size <= 65536 else "uint32"
    itemsize = 2 if dtype == "uint16" else 4
    size = p.stat().st_size
    if size % itemsize:
        raise InputError("--data", f"{path} is {size} bytes, not a whole number of {dtype} tokens "
                                   "(set --data-dtype to the file's dtype)")
    if size // itemsize < plan.training.seq_len + 2:
        raise InputError("--data", f"{path} holds {size // itemsize} {dtype} tokens; need more than "
                                   f"seq_len + 1 = {plan.training.seq_len + 1}")


def launch_options(args, plan: Plan) -> LaunchOptions:
    nnodes = 1 if args.nnodes is None else args.nnodes
    _positive(nnodes, "--nnodes")
    _positive(args.max_restarts, "--max-restarts", 0)
    if args.nproc_per_node is not None:
        _positive(args.nproc_per_node, "--nproc-per-node")
        nproc = args.nproc_per_node
    elif plan.gpus % nnodes:
        raise InputError("--nnodes", f"must divide the plan's gpus ({plan.gpus}), got {nnodes}")
    else:
        nproc = plan.gpus // nnodes
    if nnodes * nproc != plan.gpus:
        raise InputError("--nproc-per-node", f"--nnodes x --nproc-per-node = {nnodes * nproc} must equal the "
                                             f"plan's gpus ({plan.gpus})")
    if not 0 <= args.node_rank < nnodes:
        raise InputError("--node-rank", f"must be in 0..{nnodes - 1}, got {args.node_rank}")
    if not NAME.match(args.rdzv_backend):
        raise InputError("--rdzv-backend", f"must be a torchrun rendezvous backend (c10d, etcd, static), got {args.rdzv_backend!r}")
    if not NAME.match(args.rdzv_id):
        raise InputError("--rdzv-id", f"must be letters, digits, '_', '.' or '-', got {args.rdzv_id!r}")
    endpoint = args.rdzv_endpoint
    if endpoint is not None:
        check_endpoint(endpoint)
    elif nnodes > 1 and not args.slurm:
        raise InputError("--rdzv-endpoint", f"is required with --nnodes {nnodes} (HOST:PORT reachable from every node)")
    return LaunchOptions(nproc_per_node=nproc, nnodes=nnodes, node_rank=args.node_rank, rdzv_endpoint=endpoint,
                         rdzv_backend=args.rdzv_backend, rdzv_id=args.rdzv_id, max_restarts=args.max_restarts)


def check_endpoint(endpoint: str) -> None:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or any(c.isspace() for c in host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InputError("--rdzv-endpoint", f"must be HOST:PORT with a port in 1..65535, got {endpoint!r}")


def slurm_options(args, plan: Plan, launch: LaunchOptions) -> SlurmOptions | None:
    if not args.slurm:
        for flag in ("partition", "time", "account", "job_name", "gpus_per_node"):
            if getattr(args, flag) is not None:
                raise InputError(f"--{flag.replace('_', '-')}", "applies only with --slurm")
        return None
    if args.rdzv_endpoint is not None or args.node_rank != 0:
        raise InputError("--slurm", "computes the rendezvous and node ranks itself; drop --rdzv-endpoint / --node-rank")
    gpus_per_node = args.gpus_per_node
    if gpus_per_node is None:
        gpus_per_node = launch.nproc_per_node if (args.nproc_per_node or args.nnodes) else _profile_devices(plan)
    _positive(gpus_per_node, "--gpus-per-node")
    if plan.gpus % gpus_per_node:
        raise InputError("--gpus-per-node", f"must divide the plan's gpus ({plan.gpus}), got {gpus_per_node}")
    for flag, value, pattern in (("--partition", args.partition, SLURM_VALUE), ("--account", args.account, SLURM_VALUE),
                                 ("--job-name", args.job_name, NAME), ("--time", args.time, SLURM_TIME)):
        if value is not None and not pattern.match(value):
            what = "MINUTES, HH:MM:SS or D-HH:MM:SS" if flag == "--time" else "letters, digits and _ . , : @ + -"
            raise InputError(flag, f"must be {what}, got {value!r}")
    job_name = args.job_name or "meshplan-" + re.sub(r"[^A-Za-z0-9_.-]", "-", plan.model.name)
    return SlurmOptions(nodes=plan.gpus // gpus_per_node, gpus_per_node=gpus_per_node, job_name=job_name,
                        partition=args.partition, time=args.time, account=args.account,
                        max_restarts=launch.max_restarts)


def _profile_devices(plan: Plan) -> int:
    """Devices per node of the plan's cluster profile (capped at the plan's gpus)."""
    from meshplan.profiles import load_profile

    return min(plan.gpus, load_profile(plan.cluster).devices_per_node)


def parse(argv: list[str]) -> RunRequest:
    """Parse and validate everything that can be checked before launching processes."""
    args = parser().parse_args(argv)
    plan = load_plan(args.plan)
    # Refused here, before launch, for this machine's backend (sbatch: checked on the nodes).
    check_runnable(plan, None if args.slurm else local_device_type())
    if not args.slurm:
        check_device(plan)
    check_plan_profile(plan)
    opts = run_options(args, plan)
    launch = launch_options(args, plan)
    return RunRequest(plan=plan, plan_path=args.plan, opts=opts, launch=launch,
                      slurm=slurm_options(args, plan, launch))


def check_plan_profile(plan: Plan) -> None:
    """The fields the plan's cluster profile judges (float8 on its device, placement on its links),
    and the moot fields, said once (rank 0 or the launcher) and run as their neutral value."""
    from meshplan.cost_models.plan_checks import check_against_profile
    from meshplan.profiles import load_profile
    from meshplan.specs.rules import normalise_moot_fields

    check_against_profile(plan, load_profile(plan.cluster))
    for note in normalise_moot_fields(plan):
        if not inside_torchrun():  # the launcher says it; its workers normalise alike
            print(f"note: {note}", file=sys.stderr)


def inside_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def main(argv: list[str]) -> int:
    request = parse(argv)
    if inside_torchrun():
        from meshplan.runtime.worker import run_worker

        return run_worker(request.plan, request.opts)
    if request.slurm is not None:
        from meshplan.runtime.slurm import sbatch_script

        s = request.slurm
        header = (f"meshplan run --slurm: {request.plan_path} ({request.plan.model.name}), {request.plan.gpus} GPUs = "
                  f"{s.nodes} nodes x {s.gpus_per_node}")
        sys.stdout.write(sbatch_script(s, sys.executable, request.worker_argv(), header))
        return 0
    from meshplan.runtime.launcher import launch

    code = launch(request.launch, request.worker_argv())
    if code == 0 and request.opts.out and not request.opts.quiet:
        from meshplan.reports.run_summary import print_run_summary

        print_run_summary(request.opts.out)
    return code
