"""Collective fits with two size ranges: the schema reads and writes them, the cost model prices a
message by the range it falls in, calibration scales them, and bad segments are one-line errors."""

from __future__ import annotations

import pytest

from meshplan.cost_models.comm import GroupSpan, collective_time
from meshplan.errors import InputError
from meshplan.profiles.registry import load_profile
from meshplan.profiles.schema import CollectiveFit, CollectiveSegment, profile_from_dict

MIB = 1 << 20


def _with_segments(segments: list[dict]) -> dict:
    data = load_profile("cpu-gloo").to_dict()
    entry = data["collectives"]["loopback"]["all_gather"]
    entry["bus_bandwidth_gbs"], entry["latency_us"] = 1.0, 100.0
    entry["segments"] = segments
    return data


def test_segments_round_trip_and_price_by_message_size():
    segs = [{"min_bytes": MIB, "bus_bandwidth_gbs": 4.0, "latency_us": 1000.0},
            {"min_bytes": 8 * MIB, "bus_bandwidth_gbs": 0.5, "latency_us": 200.0}]
    prof = profile_from_dict(_with_segments(segs))
    assert profile_from_dict(prof.to_dict()) == prof
    span = GroupSpan(2, 2)  # bus factor (n - 1) / n = 1/2

    def expect(nbytes, bw, lat):
        return lat * 1e-6 + 0.5 * nbytes / (bw * 1e9)

    assert collective_time(prof, "all_gather", 64 * 1024, span) == pytest.approx(expect(64 * 1024, 1.0, 100.0))
    assert collective_time(prof, "all_gather", 2 * MIB, span) == pytest.approx(expect(2 * MIB, 4.0, 1000.0))
    assert collective_time(prof, "all_gather", 32 * MIB, span) == pytest.approx(expect(32 * MIB, 0.5, 200.0))
    # 4 calls of 2 MiB each: priced by the 2 MiB range, latency paid 4 times
    assert collective_time(prof, "all_gather", 8 * MIB, span, calls=4) == pytest.approx(
        4 * 1000e-6 + 0.5 * 8 * MIB / 4e9)


def test_scaled_scales_every_range():
    fit = CollectiveFit(1.0, 10.0, [CollectiveSegment(MIB, 4.0, 20.0)])
    half = fit.scaled(0.5)
    assert half.bus_bandwidth_gbs == 0.5 and half.segments[0].bus_bandwidth_gbs == 2.0
    assert half.latency_us == 10.0 and half.segments[0].latency_us == 20.0


@pytest.mark.parametrize("segments, field", [
    ([{"min_bytes": 8 * MIB, "bus_bandwidth_gbs": 1.0}, {"min_bytes": MIB, "bus_bandwidth_gbs": 1.0}], "min_bytes"),
    ([{"min_bytes": MIB, "bus_bandwidth_gbs": 0.0}], "bus_bandwidth_gbs"),
    ([{"min_bytes": MIB, "bus_bandwidth_gbs": 1.0, "slope": 2}], "segments[0]"),
    ("fast", "segments"),
])
def test_bad_segments_are_one_line_errors(segments, field):
    with pytest.raises(InputError) as err:
        profile_from_dict(_with_segments(segments))
    assert field in str(err.value) and "\n" not in str(err.value)
