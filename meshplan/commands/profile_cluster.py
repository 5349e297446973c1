"""`meshplan profile-cluster`: micro-benchmarks that turn this cluster into a ClusterProfile YAML.

Alone it starts torchrun for `--nproc K` processes on this node; under torchrun (RANK / WORLD_SIZE set,
one or many nodes) each process is a worker:
    torchrun --nnodes 4 --nproc-per-node 8 ... -m meshplan profile-cluster --out profiles/mine.yaml
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import socket
import sys
import tempfile
import time
from pathlib import Path

from meshplan.commands.argparsing import ArgumentParser
from meshplan.errors import InputError
from meshplan.profiles.versions import check_profile_versions  # re-exported: the planner's entry point

__all__ = ["main", "check_profile_versions"]

MIN_BUDGET_S = 20.0  # torchrun start-up alone takes 10-20 s on a busy 2-core host


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="meshplan profile-cluster", description=__doc__.splitlines()[0])
    p.add_argument("--nproc", help="processes (devices) on this node; default: GPUs, or CPU cores")
    p.add_argument("--quick", action="store_true", help="fewer shapes and sizes up to 32 MiB (about a minute on CPU)")
    p.add_argument("--time-budget", metavar="SECONDS", help="never run longer; what does not fit is skipped and listed")
    p.add_argument("--out", help="profile YAML to write (default: profiles/<name>.yaml)")
    p.add_argument("--name", help="profile name (default: <host>-<cpu|gpu>)")
    p.add_argument("--description", default="", help="free text stored in the profile")
    p.add_argument("--max-nodes", help="nodes the planner may use (default: nodes measured); more than measured "
                                       "copies the node link to the network level on a single-node run")
    p.add_argument("--node-link", help="name of the in-node link level (default: nvlink on GPUs, loopback on CPU)")
    p.add_argument("--network-link", default="network", help="name of the cross-node link level")
    return p


def _positive_int(value: str | None, field: str, minimum: int = 1) -> int | None:
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise InputError(field, f"must be an integer >= {minimum}, got {value!r}")
    if n < minimum:
        raise InputError(field, f"must be an integer >= {minimum}, got {n}")
    return n


def _budget(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        s = float(value)
    except ValueError:
        raise InputError("--time-budget", f"must be a number of seconds, got {value!r}")
    if not s >= MIN_BUDGET_S or s == float("inf"):
        raise InputError("--time-budget", f"must be at least {MIN_BUDGET_S:g} seconds, got {value}")
    return s


def _level_name(value: str, field: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", value):
        raise InputError(field, f"must be a name like nvlink or network, got {value!r}")
    return value


def check_writable(out: str) -> None:
    """Fail before benchmarking when the profile cannot be written there."""
    path = Path(out)
    if path.is_dir():
        raise InputError("--out", f"{out} is a directory; give a file path like {out.rstrip('/')}/mine.yaml")
    if path.suffix not in (".yaml", ".yml"):
        raise InputError("--out", f"must end in .yaml or .yml, got {out!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        raise InputError("--out", f"cannot write to {path.parent}: {exc.strerror or exc.__class__.__name__}")


def _default_name(cuda: bool) -> str:
    host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().split(".")[0].lower()).strip("-") or "host"
    return f"{host}-{'gpu' if cuda else 'cpu'}"


def _device_limit(cuda: bool) -> int:
    import torch

    return torch.cuda.device_count() if cuda else (os.cpu_count() or 1)


def main(argv: list[str]) -> int:
    started = time.time()  # the budget covers everything from here, torch import and torchrun start-up included
    from meshplan.bench.launch import in_torchrun, launch

    args = parser().parse_args(argv)
    budget = _budget(args.time_budget)
    max_nodes = _positive_int(args.max_nodes, "--max-nodes")
    node_link = _level_name(args.node_link, "--node-link") if args.node_link else None
    network_link = _level_name(args.network_link, "--network-link")
    if node_link and node_link == network_link:
        raise InputError("--node-link", f"must differ from --network-link ({network_link})")
    import torch

    cuda = torch.cuda.is_available()
    name = args.name if args.name is not None else _default_name(cuda)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise InputError("--name", f"must be letters, digits, '.', '_' or '-', got {name!r}")
    out = args.out or f"profiles/{name}.yaml"
    if in_torchrun():
        if args.nproc is not None:
            raise InputError("--nproc", "is for starting torchrun; under torchrun the world comes from torchrun")
        return _worker(args, name, out, budget, max_nodes, node_link, network_link, argv)
    limit = _device_limit(cuda)
    nproc = _positive_int(args.nproc, "--nproc", 1) if args.nproc is not None else limit
    what = "GPUs" if cuda else "CPU cores (one process per core)"
    if nproc < 1:
        raise InputError("--nproc", f"must be >= 1, got {nproc}")
    if nproc > limit:
        raise InputError("--nproc", f"at most {limit} on this node ({what}), got {nproc}")
    check_writable(out)
    deadline = None if budget is None else started + budget
    worker_argv = _strip_nproc(argv) + ["--out", out, "--name", name]
    code = launch(nproc, worker_argv, deadline, max(1, (os.cpu_count() or 1) // nproc),
                  "meshplan profile-cluster " + shlex.join(argv))
    if code != 0:
        print(f"meshplan profile-cluster: benchmark workers failed (exit {code})", file=sys.stderr)
        return 1
    return 0


def _strip_nproc(argv: list[str]) -> list[str]:
    """The options the workers get: all but --nproc, which only the launcher understands."""
    out, skip = [], False
    for a in argv:
        if not skip and a != "--nproc" and not a.startswith("--nproc="):
            out.append(a)
        skip = a == "--nproc"
    return out


def _worker(args: argparse.Namespace, name: str, out: str, budget: float | None, max_nodes: int | None, node_link: str | None,
            network_link: str, argv: list[str]) -> int:
    from meshplan.bench.launch import COMMAND_ENV, DEADLINE_ENV, ERROR_FILE_ENV
    from meshplan.bench.worker import WorkerOptions, worker_main

    deadline = float(os.environ[DEADLINE_ENV]) if DEADLINE_ENV in os.environ else (
        None if budget is None else time.time() + budget)
    if int(os.environ["RANK"]) == 0:
        check_writable(out)
    if int(os.environ["WORLD_SIZE"]) > 1 and int(os.environ.get("LOCAL_WORLD_SIZE", 2)) < 2:
        raise InputError("--nproc-per-node", "needs at least 2 processes per node to measure the in-node link "
                                             "(1 process in all measures the device alone)")
    opts = WorkerOptions(out=out, name=name, quick=args.quick, deadline=deadline, max_nodes=max_nodes,
                         node_link=node_link, network_link=network_link, description=args.description,
                         command=os.environ.get(COMMAND_ENV) or "meshplan profile-cluster " + shlex.join(argv))
    error = worker_main(opts)
    if error is None:
        return 0
    if ERROR_FILE_ENV in os.environ:  # our launcher: it raises this as one line once torchrun is done
        Path(os.environ[ERROR_FILE_ENV]).write_text(f"{error.field}\t{error.message}")
        return 0
    raise error
