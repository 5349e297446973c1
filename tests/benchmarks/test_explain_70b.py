"""benchmarks/explain_70b.py on the real data: its columns add up, its TorchTitan rows match hand computations,
and its verdict names only terms of its table, for the reasons the constants' statuses give."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.cost_models.estimate import estimate_plan
from meshplan.cost_models.published import torchtitan_rows
from meshplan.profiles.registry import load_profile

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("explain_70b", ROOT / "benchmarks" / "explain_70b.py")
explain_70b = importlib.util.module_from_spec(SPEC)
sys.modules["explain_70b"] = explain_70b
SPEC.loader.exec_module(explain_70b)

PUBLISHED_CSV = ROOT / "meshplan" / "data" / "published" / "torchtitan_llama31_h100_2024-12.csv"
COMPUTE = ("matmul", "attention", "memory-bound", "float8 casts", "head + loss", "embedding", "host dispatch")
# Llama 3.1 70B (Llama 3 paper, Table 3): 80 layers, model dimension 8192.
LAYERS, DIM = 80, 8192


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("explain") / "explain.json"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert explain_70b.main(["--json", str(path)]) == 0
    return json.loads(path.read_text()), out.getvalue()


def table4() -> list[dict[str, str]]:
    with PUBLISHED_CSV.open() as f:
        return [r for r in csv.DictReader(f) if r["table"] == "Table 4"]


def prof_slowdown(name: str) -> float:
    return load_profile(name).overheads.comm_compute_slowdown


def columns(data):
    for prof, p in data["profiles"].items():
        for name, c in p["columns"].items():
            yield prof, name, c


def test_both_profiles_and_three_columns(run):
    data, _ = run
    assert set(data["profiles"]) == {"h100-80g-dgx", "h100-96g-gt"}
    for p in data["profiles"].values():
        assert list(p["columns"]) == ["pick", "TT 2D", "TT 2D+aTP"]


def test_time_terms_sum_to_the_step(run):
    data, _ = run
    for prof, name, c in columns(data):
        assert sum(c["time_terms_s"].values()) == pytest.approx(c["step_time_s"], abs=1e-6), (prof, name)


def test_compute_kinds_sum_to_the_estimates_compute(run):
    """The split by kind adds up to the compute the estimate's own breakdown (another code path) reports."""
    data, _ = run
    rows = {r.plan.parallel.async_tp: r for r in torchtitan_rows() if r.table == "TorchTitan H100 (Table 4)"}
    for prof in data["profiles"]:
        for async_tp, name in ((False, "TT 2D"), (True, "TT 2D+aTP")):
            row = rows[async_tp]
            est = estimate_plan(row.plan.copy(cluster=prof), load_profile(prof), **row.layout_overrides)
            terms = data["profiles"][prof]["columns"][name]["time_terms_s"]
            assert sum(terms[k] for k in COMPUTE) == pytest.approx(est.time_s["compute"], rel=1e-9)
            assert terms["recompute"] == pytest.approx(est.time_s["recompute"], rel=1e-12)


def test_torchtitan_rows_as_published(run):
    """FSDP 32 x TP 8, local batch 16 -> global 512, seq 8192, full AC; measured tok/s from the CSV."""
    data, _ = run
    published = {("AsyncTP" in r["techniques"]): float(r["TPS/GPU"].replace(",", "")) for r in table4()}
    assert published == {False: 829.0, True: 876.0}
    for prof, name, c in columns(data):
        if name == "pick":
            continue
        plan = c["plan"]
        assert (plan["parallel"]["dp_shard"], plan["parallel"]["tp"], plan["gpus"]) == (32, 8, 256)
        assert plan["training"]["global_batch"] == 16 * 32 and plan["training"]["seq_len"] == 8192
        assert plan["memory"]["activation_checkpointing"] == "full" and plan["memory"]["float8"]
        by_hand = 512 * 8192 / (c["step_time_s"] * 256)
        assert c["tokens_per_s_per_gpu"] == pytest.approx(by_hand, rel=1e-12)
        assert c["published_tokens_per_s_per_gpu"] == published[name == "TT 2D+aTP"]


def test_tp_comm_issued_by_hand(run):
    """Without async TP: per block and pass, SP's 2 all-gathers + 2 reduce-scatters of 16 x 8192 tokens x 8192 bf16
    over 8 GPUs on NVLink (360 GB/s bus, 15 us, factor 7/8); 3 passes under full AC (forward, recompute, backward)."""
    data, _ = run
    one = 15e-6 + (7 / 8) * (16 * 8192 * DIM * 2) / 360e9
    by_hand = LAYERS * 3 * 4 * one
    for prof in data["profiles"]:
        c = data["profiles"][prof]["columns"]["TT 2D"]
        assert c["time_info_s"][".TP comm issued"] == pytest.approx(by_hand, rel=1e-9)
        assert c["time_terms_s"]["TP comm exposed"] == pytest.approx(by_hand, rel=1e-9)  # nothing hides it


def test_collectives_issued_minus_hidden_is_exposed(run):
    data, _ = run
    for prof, name, c in columns(data):
        t, i = c["time_terms_s"], c["time_info_s"]
        assert i[".TP comm issued"] - i[".TP hidden by async TP"] == pytest.approx(t["TP comm exposed"], abs=1e-9)
        assert i[".CP comm issued"] - i[".CP hidden under attention"] == pytest.approx(t["CP comm exposed"], abs=1e-9)
        issued = i[".FSDP all-gather issued"] + i[".FSDP reduce-scatter issued"] + i[".DP all-reduce issued"]
        exposed = t["FSDP comm exposed"] + t["DP comm exposed"]
        hidden, contention = i[".FSDP/DP hidden under compute"], i[".FSDP/DP contention"]
        # forms.py kernel_work: the hidden share of the collectives, timed at the node level's rate
        beside, at_node = i[".FSDP/DP issued beside compute"], i[".FSDP/DP at the node rate"]
        assert 0 < at_node <= beside <= issued
        assert contention == pytest.approx(prof_slowdown(prof) * hidden * at_node / beside, abs=1e-12)
        # FSDP2's copies run on the compute stream beside nothing (forms.py fsdp_copies)
        copies = i[".FSDP copies on the compute stream"]
        assert copies > 0
        assert issued - hidden + contention + copies == pytest.approx(exposed, abs=1e-9), (prof, name)


def test_memory_terms_sum_to_the_peak(run):
    data, _ = run
    for prof, name, c in columns(data):
        assert sum(c["memory_gib"].values()) == pytest.approx(c["peak_memory_gib"], abs=1e-6), (prof, name)


def test_band_and_extrapolation_of_the_pick(run):
    data, out = run
    for prof, p in data["profiles"].items():
        c = p["columns"]["pick"]
        lo, hi = c["step_time_band_s"]
        assert lo <= c["step_time_s"] <= hi
        assert isinstance(c["extrapolated"], bool) and c["extrapolation"]
        assert f"{prof}: pick {c['step_time_s']:.3f} s (band {lo:.3f}-{hi:.3f} s)" in out


def test_error_against_measured_on_the_500w_profile(run):
    data, out = run
    cols = data["profiles"]["h100-96g-gt"]["columns"]
    errs = [cols[n]["tokens_per_s_per_gpu"] / cols[n]["published_tokens_per_s_per_gpu"] - 1
            for n in ("TT 2D", "TT 2D+aTP")]
    assert f"{errs[0]:+.1%}" in out and f"{errs[1]:+.1%}" in out


def test_verdict_names_only_terms_of_the_table_for_their_constants(run):
    data, out = run
    for prof, p in data["profiles"].items():
        v, cols = p["verdict"], p["columns"]
        ref, pick = cols[v["against"]], cols["pick"]
        assert v["margin_s"] == pytest.approx(ref["step_time_s"] - pick["step_time_s"])
        assert ref["step_time_s"] == min(c["step_time_s"] for n, c in cols.items() if n != "pick")
        shown = {t for t in explain_70b.TIME_TERMS if any(c["time_terms_s"][t] for c in cols.values())}
        untrusted = []
        for d in v["deciding"]:
            assert d["term"] in shown
            gain = ref["time_terms_s"][d["term"]] - pick["time_terms_s"][d["term"]]
            assert d["gain_s"] == pytest.approx(gain) and gain >= explain_70b.MIN_SHARE * pick["step_time_s"]
            if d["untrusted_constants"]:
                untrusted.append(d["term"])
        for d in v["leans"]:
            assert d["term"] in shown
            if d["untrusted_constants"]:
                untrusted.append(f"{d['term']} (hidden)")
        # every term the pick saves MIN_SHARE on is in the verdict
        for t in shown:
            if ref["time_terms_s"][t] - pick["time_terms_s"][t] >= explain_70b.MIN_SHARE * pick["step_time_s"]:
                assert t in [d["term"] for d in v["deciding"]]
        # the untrusted constants are those whose status, in the constants section, is transferred or unsourced
        for d in v["deciding"] + v["leans"]:
            for name, status in d["constants"].items():
                assert data["constants"][name][prof]["status"] == status
                assert (f"{name} {explain_70b.STATUS_WORDS[status]}" in d["untrusted_constants"]) == (status in "TU")
        assert v["untrusted"] == untrusted
        expected = "pick NOT trusted: " + ", ".join(untrusted) if untrusted else "pick rests on sourced terms"
        assert v["line"] == expected and f"=> {expected}" in out


def test_statuses_follow_the_registry():
    """Fitted where the registry says so, transferred or unsourced where a fitted constant is not fitted here."""
    gt, dgx = load_profile("h100-96g-gt"), load_profile("h100-80g-dgx")
    assert explain_70b.driver("device.sustained_fraction", gt).status == "F"
    assert explain_70b.driver("overheads.kernel_efficiency", dgx).status == "D"
    assert explain_70b.driver("model.adamw_bytes_per_param", dgx).status == "D"
    assert explain_70b.driver("model.norm_passes", dgx).status == "S"  # 20 against a physical 2, with its source
    # dgx carries the 96 GB part's fit, said in its provenance (transferred); without that entry it is unsourced
    assert explain_70b.driver("overheads.tp_async_overlap", dgx).status == "T"
    bare = replace(dgx, provenance={k: v for k, v in dgx.provenance.items() if k != "overheads.fitted"})
    assert explain_70b.driver("overheads.tp_async_overlap", bare).status == "U"
    # each window whole (its physical default) and a slowdown with its source in the registry
    assert explain_70b.driver("overheads.fsdp_overlap", dgx).status == "D"
    assert explain_70b.driver("overheads.comm_compute_slowdown", dgx).status == "S"
    # the reduce-scatter line is sourced by its sibling entry
    assert explain_70b.driver("collectives.nvlink.reduce_scatter", dgx).status == "S"


def test_lines_fit_a_terminal(run):
    _, out = run
    assert max(len(line) for line in out.splitlines()) <= 120
