"""`meshplan clusters`: the built-in cluster profiles."""

from __future__ import annotations

from meshplan.commands.argparsing import ArgumentParser
from meshplan.profiles.registry import list_profiles


def parser() -> ArgumentParser:
    return ArgumentParser(prog="meshplan clusters", description="List built-in cluster profiles.")


def main(argv: list[str]) -> int:
    parser().parse_args(argv)
    print(f"{'name':<16} {'device':<34} {'GiB':>6} {'bf16 TF':>8} {'GPU/node':>8}  links")
    for p in list_profiles():
        links = ", ".join(f"{l.name} {l.bandwidth_gbs:g} GB/s" for l in p.links)
        print(f"{p.name:<16} {p.device.name:<34} {p.device.memory_gib:>6.1f} "
              f"{p.device.peak_tflops.get('bf16', p.device.peak_tflops.get('fp32', 0)):>8.1f} {p.devices_per_node:>8}  {links}")
    return 0
