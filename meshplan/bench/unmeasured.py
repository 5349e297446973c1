"""What profile-cluster cannot measure on a GPU, taken from the built-in profile of the same part.

Its benchmarks time one kernel or one collective at a time. The terms of a training step beyond those, how
much data-parallel traffic hides and (where a node holds one GPU, so bench/contention.py has no collective to run)
what it costs the compute beside it, what async TP and ring attention
hide, the allocator's slack with and without pipelining, Megatron-Core's per-expert host time, are fitted on
published training runs or sourced (cost_models/constants.py; `meshplan validate --constants` prints each with
its sources), and the built-in profiles' accuracy figures rest on them. A measured profile left at the
schema's defaults instead (10 % of data-parallel traffic exposed beyond its windows, free overlap, 80 % of
ring attention's exchange hidden, no pipelining slack) priced a multi-GPU plan as no validated profile does.

The sustained fraction stays 1, the measured rates as they are: a built-in's (0.702 on the H100 and H200)
derates MAMF's best shape, which a measured point already falls below at a model's shapes. On a lent H200
the runtime's own compiled 3B runs priced 3-7 % fast on that H200's measured profile at 1, and 21-30 % slow
at 0.702 (tests/profiles/test_unmeasured.py).
On a CPU nothing is transferred: the CPU built-in's terms are this project's test machine's, and what a
CPU step hides (nothing) is measured (bench/in_step.py).
"""

from __future__ import annotations

from dataclasses import asdict, fields

from meshplan.bench.host import HostCosts
from meshplan.profiles.registry import load_profile
from meshplan.profiles.schema import Overheads

# Overheads profile-cluster measures on every GPU: the host's per-op costs (bench/host.py) and the context.
# The compute slowdown beside a collective is measured where a node holds two GPUs (bench/contention.py).
MEASURED_ON_GPU = frozenset(f.name for f in fields(HostCosts)) | {"context_gib"}
UNMEASURED_OVERHEADS = tuple(f.name for f in fields(Overheads) if f.name not in MEASURED_ON_GPU)


def take_unmeasured(data: dict, donor: str, same_part: bool) -> None:
    """Fill a measured GPU profile's dict (`data`, before it is loaded) with every overhead the donor built-in
    carries that is not measured here, and say so in its provenance, with the donor's own provenance of each."""
    built = load_profile(donor)
    taken = {k: v for k, v in asdict(built.overheads).items()
             if k in UNMEASURED_OVERHEADS and k not in data["overheads"]}  # measured here where it is
    data["overheads"] = {**taken, **data["overheads"]}
    values = ", ".join(f"{k} {v:g}" for k, v in taken.items() if v is not None)
    part = f"the built-in {donor}, the same part" if same_part else f"the built-in {donor} (no built-in of this part)"
    prov = data["provenance"]
    prov["overheads.transferred"] = (f"not measured by profile-cluster, whose benchmarks time one kernel or collective "
                                     f"at a time: taken from {part}, where each is fitted on published training runs "
                                     f"or sourced (its provenance of each below; meshplan validate --constants): {values}")
    prov["device.sustained_fraction"] = (f"1, the measured rates as they are; {donor}'s {built.device.sustained_fraction:g} "
                                         "derates MAMF's best shape, which these points fall below at a model's shapes "
                                         "(bench/unmeasured.py)")
    for key, text in built.provenance.items():
        if key.startswith("overheads") and key != "overheads.host":
            prov[f"{key} (from {donor})"] = text
