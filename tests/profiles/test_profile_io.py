"""A profile built from measurements writes, loads and compares equal; version checks warn on drift."""

import dataclasses

import pytest
import torch
import yaml

from meshplan.errors import InputError
from meshplan.profiles import load_profile
from meshplan.bench.builder import build_profile, format_fit_table
from meshplan.bench.collectives import bus_factor
from meshplan.bench.env import BenchEnv
from meshplan.bench.memory import MemoryResult
from meshplan.bench.worker import RawResults, WorkerOptions
from meshplan.profiles.schema import profile_from_dict
from meshplan.profiles.versions import check_profile_versions, installed_versions
from meshplan.yamlio import atomic_write_yaml

MIB = 1 << 20
TRUE_FIT = {"all_reduce": (0.5, 900.0), "all_gather": (0.35, 400.0), "reduce_scatter": (0.2, 500.0),
            "all_to_all": (0.5, 300.0), "send_recv": (0.6, 200.0)}  # busbw GB/s, latency us


def _raw(sizes=(4096, 65536, MIB, 4 * MIB, 16 * MIB)) -> RawResults:
    points = []
    for c, (bw, lat) in TRUE_FIT.items():
        for s in sizes:
            t = lat * 1e-6 + s * bus_factor(c, 2) / (bw * 1e9)
            points.append({"collective": c, "level": "loopback", "group_size": 2, "bytes": s, "time_s": t,
                           "busbw_gbs": s / t * bus_factor(c, 2) / 1e9, "p10_s": t, "p90_s": t, "samples": 10,
                           "median_se": None if s == 4096 else 0.01})  # None: a single round
    mm = [{"m": d, "n": d, "k": d, "dtype": "fp32", "tflops": 0.06 * d / (d + 50), "spread": 0.1} for d in (128, 512, 1024)]
    att = [{"seq_len": s, "batch": 1, "heads": 4, "head_dim": 64, "dtype": "fp32", "tflops": 0.03 * s / (s + 200),
            "bwd_tflops": 0.02 * s / (s + 200), "spread": 0.1} for s in (128, 512, 1024)]
    return RawResults("Test CPU (CPU process)", ["fp32"], mm, att, "fp32", 10.0, 0.8,
                      MemoryResult(11.0, 8.0, 0.25, "test"), points, [], [], 12.0)


def _env() -> BenchEnv:
    return BenchEnv(0, 2, 0, 2, 1, "gloo", torch.device("cpu"), ["h", "h"], [0, 0])


def _opts(tmp_path, **kw) -> WorkerOptions:
    base = dict(out=str(tmp_path / "p.yaml"), name="t", quick=True, deadline=None, max_nodes=None,
                node_link=None, network_link="network", description="", command="test")
    return WorkerOptions(**{**base, **kw})


def test_written_profile_loads_and_equals(tmp_path):
    profile, data, errors = build_profile(_env(), _opts(tmp_path), _raw())
    atomic_write_yaml(tmp_path / "p.yaml", profile.to_dict())
    text = (tmp_path / "p.yaml").read_text()
    assert profile_from_dict(yaml.safe_load(text)) == profile
    assert load_profile(str(tmp_path / "p.yaml")) == profile
    for c, (bw, lat) in TRUE_FIT.items():
        fitted = profile.collectives["loopback"][c]
        assert fitted.bus_bandwidth_gbs == pytest.approx(bw, rel=1e-3)
        assert fitted.latency_us == pytest.approx(lat, rel=1e-3)
        assert errors["loopback"][c].max_rel < 0.01
    assert [l.name for l in profile.links] == ["loopback"] and profile.max_nodes == 1
    assert profile.device.attention.backward_ratio == pytest.approx(2 / 3, rel=1e-3)
    assert profile.provenance["versions"]["torch"] == installed_versions()["torch"]
    assert "send_recv" in format_fit_table(errors)


def test_more_nodes_than_measured_copies_the_node_link(tmp_path):
    profile, _, _ = build_profile(_env(), _opts(tmp_path, max_nodes=4), _raw())
    assert profile.link("network").scope == "cluster"
    assert profile.collectives["network"] == profile.collectives["loopback"]
    assert "not measured" in profile.provenance["links.network"]


@pytest.mark.parametrize("sizes", [(4096,), (4096, 65536, MIB)])
def test_too_few_large_sizes_is_an_input_error(tmp_path, sizes):
    with pytest.raises(InputError, match="allow more time"):
        build_profile(_env(), _opts(tmp_path), _raw(sizes=sizes))


def test_version_check_warns_on_other_torch(tmp_path):
    profile, _, _ = build_profile(_env(), _opts(tmp_path), _raw())
    assert check_profile_versions(profile) == []
    other = dataclasses.replace(profile, provenance={**profile.provenance,
                                                     "versions": {**profile.provenance["versions"], "torch": "1.0.0"}})
    warnings = check_profile_versions(other)
    assert len(warnings) == 1 and "torch 1.0.0" in warnings[0]


def test_builtin_profiles_without_versions_do_not_warn():
    assert check_profile_versions(load_profile("h100-80g-dgx")) == []


def test_version_check_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from meshplan.profiles.versions import check_profile_versions; "
            "from meshplan.profiles import load_profile; check_profile_versions(load_profile('h100-80g-dgx')); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_network_level_is_fitted_per_device(tmp_path):
    """Two nodes: the network fit comes from one-rank-per-node groups, not the whole world."""
    raw = _raw()
    for c, (bw, lat) in TRUE_FIT.items():
        for n, scale in ((2, 0.1), (4, 0.5)):  # per-device network at 1/10 of loopback; the world group faster
            for s in (65536, MIB, 4 * MIB):
                t = lat * 1e-6 + s * bus_factor(c, n) / (bw * scale * 1e9)
                raw.collective_points.append({"collective": c, "level": "network", "group_size": n, "bytes": s,
                                              "time_s": t, "busbw_gbs": 0.0, "p10_s": t, "p90_s": t,
                                              "samples": 10, "median_se": 0.01})
    env = BenchEnv(0, 4, 0, 2, 2, "gloo", torch.device("cpu"), ["a", "a", "b", "b"], [0, 0, 1, 1])
    profile, _, _ = build_profile(env, _opts(tmp_path), raw)
    assert profile.max_nodes == 2 and profile.link("network").scope == "cluster"
    for c, (bw, _) in TRUE_FIT.items():
        assert profile.collectives["network"][c].bus_bandwidth_gbs == pytest.approx(bw * 0.1, rel=1e-3)
    assert "not measured" not in str(profile.provenance.get("links.network", ""))


def test_attention_at_one_length_is_refused_not_extrapolated(tmp_path):
    """A time budget that left one attention length (seq 512 on an H200, 2026-11-26) gave a flat
    curve from one noisy point: every longer sequence was priced at its rate. Now it is an error."""
    from meshplan.errors import InputError

    raw = _raw()
    raw.attention_points = raw.attention_points[1:2]
    with pytest.raises(InputError, match="one sequence length only"):
        build_profile(_env(), _opts(tmp_path), raw)
