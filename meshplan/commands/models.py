"""`meshplan models`: the built-in models with their aliases and parameter counts."""

from __future__ import annotations

from meshplan.commands.argparsing import ArgumentParser
from meshplan.specs.registry import list_models


def parser() -> ArgumentParser:
    return ArgumentParser(prog="meshplan models", description="List built-in models.")


def main(argv: list[str]) -> int:
    parser().parse_args(argv)
    print(f"{'name':<14} {'arch':<6} {'params':>18} {'dim':>6} {'layers':>6} {'heads':>5} {'kv':>3} {'ffn':>6} {'vocab':>7}  aliases")
    for m, aliases in list_models():
        print(f"{m.name:<14} {m.arch:<6} {m.num_params():>18,} {m.dim:>6} {m.n_layers:>6} {m.n_heads:>5} "
              f"{m.n_kv_heads:>3} {m.ffn_dim:>6} {m.vocab_size:>7}  {', '.join(aliases)}")
    return 0
