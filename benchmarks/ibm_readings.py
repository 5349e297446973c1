"""IBM's fms-fsdp rows (published.ibm_fms_rows) under the readings their page leaves open.

    python benchmarks/ibm_readings.py

The page gives "A100 80G 128 GPUs with 400Gbps" and "H100 96 GPUs with 800 Gbps". meshplan reads
those as each node's network (8 GPUs share it) and hides each of FSDP's collectives under the
compute of the micro-batch it is issued in, with the compute beside it slowed by the profile's
comm_compute_slowdown (estimate.data_parallel_comm). Printed, with the built-in profiles: predicted /
measured step time - 1 per scored row as shipped; with the DGX profiles' own networks (the figures
read as per GPU); with the contention under each of forms.py's other alternatives (as shipped: over
the collectives' kernel work at the node level's rate); and with free overlap (comm_compute_slowdown 0).
No assertions: this prints, it does not judge.
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost_models import forms
from meshplan.cost_models.published import ibm_fms_rows
from meshplan.cost_models.validate import predict
from meshplan.profiles.registry import load_profile


def free_overlap(name: str):
    prof = load_profile(name)
    return replace(prof, overheads=replace(prof.overheads, comm_compute_slowdown=0.0))


SHIPPED: dict[str, str] = {}
READINGS = {  # title: (the row as read, its profile, the forms it is priced under)
    "as shipped (the page's network per node, collectives under their windows, contention)": (
        lambda r: r, load_profile, SHIPPED),
    "the DGX profiles' networks (the page's figures per GPU)": (
        lambda r: replace(r, network_gbs_per_gpu=None), load_profile, SHIPPED),
    **{f"contention over the {c.replace('_', ' ')} (forms.py contention: {c})": (lambda r: r, load_profile,
                                                                                 {"contention": c})
       for c in forms.ALTERNATIVES["contention"] if c != forms.FORMS.contention},
    "comm_compute_slowdown 0 (what hides under compute costs nothing)": (lambda r: r, free_overlap, SHIPPED),
}


def main() -> None:
    rows = [r for r in ibm_fms_rows() if not r.skipped]
    for title, (row_of, load, form) in READINGS.items():
        with forms.forms(**form):
            errs = [(r.label, r.published / predict(row_of(r), load)[0] - 1) for r in rows]
        e = [x for _, x in errs]
        print(f"{title}: MAPE {sum(map(abs, e)) / len(e):.1%}, bias {sum(e) / len(e):+.1%}, "
              f"rows {min(e):+.1%} to {max(e):+.1%}")
        for label, x in errs:
            print(f"  {label:<55} {x:+.1%}")
        print()


if __name__ == "__main__":
    main()
