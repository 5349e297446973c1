"""The published-table fit (cost_models/crossval.fit, behind `meshplan validate --cross`) on meshplan's copy
of TorchTitan's H100 tables: measured runs not made by the cost model, checked against what a least-squares
fit must satisfy whatever the model says: it is no worse than where it started, it stays inside the
physical range of each constant, and on a two-row table a constant only one row depends on is brute-force
optimal and leaves the other row alone."""

from __future__ import annotations

import math

from meshplan.cost_models import crossval
from meshplan.cost_models.constants import EVERY_GPU, H100_CLASS, fitted_profiles
from meshplan.cost_models.crossval import fit, row_errors, training_rows, transform_of
from meshplan.profiles.registry import load_profile

PROFILE = "h100-96g-gt"
TABLE_1 = "TorchTitan H100 (Table 1)"  # Llama 3.1 8B on 8 GPUs: FSDP, + compile, + Float8
TABLE_4 = "TorchTitan H100 (Table 4)"  # Llama 3.1 70B on 256 GPUs, FSDP 32 x TP 8: without and with async TP

# What each constant means bounds it, independently of the registry's fit bounds: a fraction of the peak
# or of a collective hidden lies in [0, 1]; torch.compile does not slow the fused kernels down.
PHYSICAL = {"device.sustained_fraction": (0.0, 1.0), "overheads.fsdp_overlap": (0.0, 1.0),
            "overheads.tp_async_overlap": (0.0, 1.0), "overheads.compile_speedup": (1.0, math.inf),
            "overheads.memory_fragmentation": (0.0, 0.5)}  # allocator slack: reserved / allocated - 1


def _rows(table: str):
    rows = [r for r in training_rows() if r.table == table]
    assert rows and all(r.plan.cluster == PROFILE for r in rows)
    return rows


def _msle(errs) -> float:
    """The mean squared log error of step time, written here from its definition."""
    return sum(math.log(1 + e.step) ** 2 for e in errs) / len(errs)


def test_fit_on_a_published_table_improves_and_stays_physical():
    rows = _rows(TABLE_1)
    fitted = fit(rows)
    assert {name for name, _ in fitted} == {"device.sustained_fraction", "overheads.compile_speedup",
                                            "overheads.memory_fragmentation"}
    for (name, profile), value in fitted.items():
        lo, hi = PHYSICAL[name]
        assert profile == EVERY_GPU or PROFILE in fitted_profiles(profile), (name, profile)
        assert lo <= value <= hi, (name, value)
    # Start: the built-in profile's values. A fit on these rows must not end worse on them.
    assert _msle(row_errors(rows, transform_of(fitted))) <= _msle(row_errors(rows)) + 1e-12
    # the memory constant is fitted on the rows' peak memory: no worse there either
    mem = lambda errs: sum(math.log(1 + e.memory) ** 2 for e in errs) / len(errs)  # noqa: E731
    assert mem(row_errors(rows, transform_of(fitted))) <= mem(row_errors(rows)) + 1e-12


def test_two_row_fit_of_a_constant_one_row_depends_on(monkeypatch):
    """Table 4's rows differ only in async TP, so tp_async_overlap moves the second row alone. Fitted by
    itself, its least-squares optimum is wherever that row's error is smallest: found here by brute force
    on a grid of [0, 1] in steps of 0.01, and the first row's error must not change at all."""
    rows = _rows(TABLE_4)
    assert [r.plan.parallel.async_tp for r in rows] == [False, True]
    only = [t for t in crossval.fit_targets() if t.constant.name == "overheads.tp_async_overlap"]
    monkeypatch.setattr(crossval, "fit_targets", lambda: only)
    fitted = fit(rows)
    key = ("overheads.tp_async_overlap", PROFILE)
    assert list(fitted) == [key]
    got = row_errors(rows, transform_of(fitted))
    start = row_errors(rows)
    assert got[0].step == start[0].step
    best = min(abs(math.log(1 + row_errors(rows[1:], transform_of({key: i / 1000}))[0].step))
               for i in range(0, 1001, 10))
    assert abs(math.log(1 + got[1].step)) <= best + 1e-3
    assert 0.0 <= fitted[key] <= 1.0


def test_a_value_fitted_for_a_group_of_profiles_sets_each_of_them_and_no_other():
    """H100_CLASS names the 700 W and the 500 W H100 profiles: one fitted value lands in both, the A100's and
    the H200's stay as built, and EVERY_GPU still means every GPU profile (the CPU one apart)."""
    assert fitted_profiles(H100_CLASS) == ("h100-96g-gt", "h100-80g-dgx")
    assert fitted_profiles(EVERY_GPU) is None
    t = transform_of({("device.sustained_fraction", H100_CLASS): 0.5})
    for name, want in (("h100-80g-dgx", 0.5), ("h100-96g-gt", 0.5),
                       ("a100-80g-dgx", load_profile("a100-80g-dgx").device.sustained_fraction),
                       ("h200-141g-dgx", load_profile("h200-141g-dgx").device.sustained_fraction)):
        assert t(name, load_profile(name)).device.sustained_fraction == want, name
    t = transform_of({("overheads.fsdp_overlap", EVERY_GPU): 0.5})
    cpu = load_profile("cpu-gloo")
    assert t("cpu-gloo", cpu).overheads.fsdp_overlap == cpu.overheads.fsdp_overlap
    assert t("h200-141g-dgx", load_profile("h200-141g-dgx")).overheads.fsdp_overlap == 0.5


def test_coupled_constants_are_searched_together_only_where_a_form_fits_both():
    """Under the shipped forms each fitted constant is its own coordinate (the descent as it always ran);
    under forms.py memory_rate fitted the Blackwell parts' two rates, fitted on the same MoE rows, are one."""
    from meshplan.cost_models import forms

    assert all(len(group) == 1 for group in crossval.coupled_targets())
    with forms.forms(memory_rate="fitted"):
        joint = [[(t.constant.name, t.profile) for t in g] for g in crossval.coupled_targets() if len(g) > 1]
    blackwell = "b200-180g-dgx+gb200-186g-nvl72"
    assert joint == [[("device.sustained_fraction", blackwell), ("device.memory_bound_efficiency", blackwell)]]


def test_a_joint_search_follows_a_ridge_that_one_coordinate_at_a_time_zig_zags_along():
    """loss = 100 (x - y)^2 + (x + y - 1)^2 / 100 on the unit square: its minimum (0.5, 0.5) by hand, along a
    narrow diagonal valley. Twelve sweeps of golden-section searches, one coordinate at a time from (0.1, 0.9),
    stop at (0.9, 0.9), where no single coordinate improves; Nelder-Mead's simplex (crossval._joint) reaches it."""
    loss = lambda v: 100 * (v[0] - v[1]) ** 2 + (v[0] + v[1] - 1) ** 2 / 100  # noqa: E731
    x, y = 0.1, 0.9
    for _ in range(crossval.MAX_SWEEPS):
        x = crossval._golden(lambda a: loss((a, y)), 0.0, 1.0)
        y = crossval._golden(lambda b: loss((x, b)), 0.0, 1.0)
    assert abs(x - 0.5) > 0.3 and abs(y - 0.5) > 0.3
    jx, jy = crossval._joint(loss, (0.1, 0.9), [(0.0, 1.0), (0.0, 1.0)])
    assert abs(jx - 0.5) < 2e-3 and abs(jy - 0.5) < 2e-3


def test_fits_in_processes_are_the_fits_in_line():
    """validate --cross --jobs: each held-out fit is deterministic, so the processes give the very values the
    serial loop does."""
    rows = [r for r in training_rows() if r.table.startswith("TorchTitan H100")]  # six tables, 4 constants
    names = list(dict.fromkeys(crossval.fold_of(r.table) for r in rows))[:2]
    in_line = crossval._fits_leaving_out(rows, "fold", names, 1)
    assert crossval._fits_leaving_out(rows, "fold", names, jobs=2) == in_line
    assert in_line[0] != in_line[1]  # two different fits, each returned in its place
