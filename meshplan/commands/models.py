"""`meshplan models`: the built-in models with their aliases and parameter counts, total and active
(what one token runs: every parameter but the routed experts its router did not pick)."""

from __future__ import annotations

from meshplan.commands.argparsing import ArgumentParser
from meshplan.specs.model import ModelSpec
from meshplan.specs.registry import list_models


def parser() -> ArgumentParser:
    return ArgumentParser(prog="meshplan models", description="List built-in models.")


def experts_cell(m: ModelSpec) -> str:
    """Routed experts, top-k, and shared experts if any ("256 top-8 +1 shared"); "-" for a dense model."""
    if m.moe is None:
        return "-"
    shared = f" +{m.moe.shared_experts} shared" if m.moe.shared_experts else ""
    return f"{m.moe.experts} top-{m.moe.top_k}{shared}"


def main(argv: list[str]) -> int:
    parser().parse_args(argv)
    print(f"{'name':<16} {'arch':<6} {'params':>17} {'active':>17} {'dim':>6} {'layers':>6} {'heads':>5} {'kv':>3} "
          f"{'ffn':>6} {'experts':<18} {'vocab':>7}  aliases")
    for m, aliases in list_models():
        print(f"{m.name:<16} {m.arch:<6} {m.num_params():>17,} {m.active_params():>17,} {m.dim:>6} {m.n_layers:>6} "
              f"{m.n_heads:>5} {m.n_kv_heads:>3} {m.ffn_dim:>6} {experts_cell(m):<18} {m.vocab_size:>7}  "
              f"{', '.join(aliases)}")
    print("active: the parameters one token runs (a mixture-of-experts model's shared and top-k routed experts); "
          "MFU counts these, as Megatron-Core reports it.")
    return 0
