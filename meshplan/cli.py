"""The `meshplan` entry point: a thin dispatcher to one module per sub-command.

Each command module exposes `main(argv: list[str]) -> int` and owns its argparse. Bad input anywhere
surfaces as InputError and is printed as one line with exit code 2, never a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

from meshplan.errors import InputError

COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("meshplan.commands.plan", "search the parallelism space, write the best plan that fits"),
    "estimate": ("meshplan.commands.estimate", "score one fully or partly given plan"),
    "validate": ("meshplan.commands.validate", "compare predictions with published measurements"),
    "profile-cluster": ("meshplan.commands.profile_cluster", "micro-benchmarks -> a cluster profile"),
    "run": ("meshplan.commands.run", "execute a plan (torchrun underneath)"),
    "report": ("meshplan.commands.report", "compare plans / searches / runs as HTML, Markdown or CSV"),
    "calibrate": ("meshplan.commands.calibrate", "fit a profile's efficiency terms to measured runs"),
    "tune": ("meshplan.commands.tune", "measure candidate plans with an Optuna study"),
    "models": ("meshplan.commands.models", "list built-in models"),
    "clusters": ("meshplan.commands.clusters", "list built-in cluster profiles"),
}


# Commands whose process ends without the interpreter's finalisation. `plan` ends holding the search's
# memo caches, millions of small objects that finalisation frees one by one: 0.13-0.15 s of a 2.1 s
# cold 405B@16384 plan (benchmarks/planner_speed.py), for nothing: its files are written (temp file,
# then rename) and closed, its workers joined.
SKIP_FINALISATION = {"plan"}


def usage() -> str:
    lines = ["usage: meshplan COMMAND [options]   (meshplan COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from meshplan import __version__

        print(f"meshplan {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"meshplan: error: unknown command {name!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module_name = COMMANDS[name][0]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("meshplan"):
            print(f"meshplan: error: '{name}' is not available in this build", file=sys.stderr)
            return 2
        print(f"meshplan: error: '{name}' needs the package {exc.name!r}; install it (see README)", file=sys.stderr)
        return 2
    try:
        return int(module.main(rest) or 0)
    except InputError as exc:
        print(f"meshplan {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"meshplan {name}: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The console script's and `python -m meshplan`'s entry: main, then the end of the process."""
    code = main()
    torchrun_worker = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if torchrun_worker or sys.argv[1:2] and sys.argv[1] in SKIP_FINALISATION:
        # A torchrun worker ends here too, its process group destroyed and its files written: in the
        # interpreter's finalisation a gloo worker that has used torch.profiler aborts now and then
        # ("terminate called without an active exception", about 1 run in 50 on a loaded 2-core
        # machine, torch 2.13), which torchrun would report as a failed run.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
