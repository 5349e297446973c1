"""What one runtime block keeps for backward on this device, against the activation inventory.

For each variant (eager or compiled; AC none, selective with the default op set or TorchTitan's op
policy, or full; float8 or not) one llama3.2-3b block runs forward on one sequence under saved-tensor
hooks, and every tensor autograd saves is listed once per storage (parameters and RoPE's tables aside), with the bytes per
token they add up to beside what cost_models/activations.py prices for the same layout on this
device's backend. The CPU test (tests/runtime/test_saved_activations.py) does this on gloo's
kernels; this runs where the product runs. On a CPU torchao's emulated float8 matmul computes in fp32,
and TorchTitan's policy then saves fp32 copies a GPU's _scaled_mm never makes: that variant means
something on a GPU alone.

    python benchmarks/saved_tensors.py --out benchmarks/results    # on a GPU (or CPU, smaller seq)
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper  # noqa: E402

from meshplan.cost_models.activations import activation_bytes_per_token, convention_of  # noqa: E402
from meshplan.cost_models.stacks import TORCHTITAN_OP_POLICY  # noqa: E402
from meshplan.runtime.activation_checkpoint import apply_ac, torchtitan_op_context_fn  # noqa: E402
from meshplan.runtime.metrics import saved_activations  # noqa: E402
from meshplan.runtime.model import Transformer  # noqa: E402
from meshplan.specs.registry import resolve_model  # noqa: E402
from meshplan.specs.rules import COMPOSITE, rms_norm_kernel  # noqa: E402


@dataclass
class Variant:
    compiled: bool
    ac: str
    float8: bool = False
    torchtitan_policy: bool = False  # selective AC by TorchTitan's op policy, not the runtime's default op set

    @property
    def name(self) -> str:
        ac = "TorchTitan op SAC" if self.torchtitan_policy else f"AC {self.ac}"
        return f"{'compiled' if self.compiled else 'eager'} {ac}{' float8' if self.float8 else ''}"

    @property
    def sac_ops(self):
        return TORCHTITAN_OP_POLICY if self.torchtitan_policy else None


# Saved-tensor hooks do not see what eager selective AC stores (its own storage holds it), so the
# TorchTitan policy is measured compiled, as TorchTitan's published runs ran it.
VARIANTS = [Variant(False, "none"), Variant(True, "none"), Variant(True, "selective"), Variant(True, "full"),
            Variant(True, "none", True), Variant(True, "selective", True),
            Variant(True, "selective", torchtitan_policy=True),
            Variant(True, "selective", True, torchtitan_policy=True)]


def saved_tensors(model: str, seq: int, v: Variant, device: torch.device) -> tuple[float, list[str]]:
    """(bytes per token, one line per saved storage) of the first block of `model`."""
    one = replace(resolve_model(model), n_layers=1)
    torch.manual_seed(0)
    with torch.device(device):
        net = Transformer(one).to(torch.bfloat16)
    if not v.torchtitan_policy:
        apply_ac(net, v.ac, None)
    block = list(net.layers.values())[0]
    if v.float8:
        from meshplan.runtime.float8 import apply_float8

        apply_float8(block, emulate=device.type == "cpu")
    if v.torchtitan_policy:
        block = checkpoint_wrapper(block, preserve_rng_state=False, context_fn=torchtitan_op_context_fn)
    run = torch.compile(block) if v.compiled else block
    x = torch.randn(1, seq, one.dim, dtype=torch.bfloat16, device=device, requires_grad=True)
    if v.compiled:
        run(x).sum().backward()  # compile outside the hooks
    sizes = [(t, t.untyped_storage().nbytes()) for t in saved_activations(run, x)]
    listing = [f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')} {n / seq:.0f} B/token" for t, n in sizes]
    return sum(n for _, n in sizes) / seq, sorted(listing)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama3.2-3b")
    ap.add_argument("--seq", type=int, default=None, help="tokens (default 4096 on a GPU, 512 on a CPU)")
    ap.add_argument("--out", default=None, help="folder for saved_tensors-<device>.md")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    seq = args.seq or (4096 if cuda else 512)
    backend = "nccl" if cuda else "gloo"
    spec = resolve_model(args.model)
    norm_fp32 = spec.arch == "llama" and rms_norm_kernel(backend) == COMPOSITE
    name = torch.cuda.get_device_name() if cuda else "CPU"
    lines = [f"# Saved tensors of one {args.model} block, bf16, seq {seq}, on {name} (torch {torch.__version__})", "",
             "| variant | measured B/token | priced B/token | error |", "|---|---|---|---|"]
    detail = []
    for v in VARIANTS:
        t0 = time.time()
        try:
            measured, listing = saved_tensors(args.model, seq, v, device)
        except Exception as e:  # a variant this device cannot run: say so, go on
            lines.append(f"| {v.name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | |")
            measured = None
        if measured is not None:
            conv = convention_of("flash", norm_fp32, v.compiled, v.float8)
            priced = activation_bytes_per_token(spec, seq, 1, False, v.ac, v.sac_ops, 2.0, conv)
            lines.append(f"| {v.name} | {measured:.0f} | {priced:.0f} | {priced / measured - 1:+.1%} |")
            detail += [f"## {v.name} ({time.time() - t0:.0f} s)", ""] + [f"- {s}" for s in listing] + [""]
        if args.out:  # after every variant: a session's time limit may stop the next one
            write(Path(args.out) / f"saved_tensors-{name.replace(' ', '_')}.md", lines, detail)
    print("\n".join(lines + [""] + detail))
    return 0


def write(out: Path, lines: list[str], detail: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines + [""] + detail) + "\n")
    tmp.replace(out)


if __name__ == "__main__":
    raise SystemExit(main())
