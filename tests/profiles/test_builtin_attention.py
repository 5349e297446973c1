"""The H100 profiles' attention is FlashAttention-2's published H100 speed (PyTorch's SDPA kernel in 2024), and
cuDNN's where a stack runs it; the H200's, and the H100's cuDNN, is cuDNN's as PyTorch 2.11's SDPA ran it on a lent
H200; the Blackwell parts' is cuDNN's GB200 benchmark."""

from dataclasses import replace

import pytest

from meshplan.cost_models.compute import attention_tflops, matmul_tflops
from meshplan.profiles.registry import load_profile

# FlashAttention-3 paper (Shah et al. 2024), FA2 on H100 80GB SXM5, bf16, head dim 128, causal forward.
FA2_CAUSAL_FWD = {512: 191, 1024: 260, 2048: 298, 4096: 319, 8192: 333, 16384: 335}


def _cudnn_rows(gpu: str) -> list[dict]:
    """cuDNN's SDPA training benchmark rows of one GPU (data/published/attention_cudnn_sdpa.csv)."""
    import csv
    from pathlib import Path

    import meshplan.data.published as published
    with open(Path(published.__file__).parent / "attention_cudnn_sdpa.csv") as f:
        return [r for r in csv.DictReader(f) if r["gpu"] == gpu]


@pytest.mark.parametrize("name", ["h100-80g-dgx", "h100-96g-gt"])
def test_profiles_hold_fa2_at_its_published_speed(name):
    """The attention points are the paper's figures; training runs them at the profile's sustained
    fraction of that best case (one factor for every tensor-core kernel, see validate --constants)."""
    dev = load_profile(name).device
    points = {p["seq_len"]: p["tflops"] for p in dev.attention.points if "kernel" not in p}
    assert points == pytest.approx(FA2_CAUSAL_FWD)
    # cuDNN's, tagged for the stacks that run it on Hopper (Transformer Engine, PyTorch's SDPA): what it ran in a
    # step on a lent H200, the same die; the H200 priced them the same at every length (its 4k point by hand in
    # test_h200_attention_gives_back_the_rates_measured_in_its_step)
    h200 = load_profile("h200-141g-dgx").device
    for seq in (512, 2048, 4096, 8192, 32768):
        for backward in (False, True):
            assert attention_tflops(dev, seq, "bf16", kernel="cudnn", backward=backward) == pytest.approx(
                attention_tflops(h200, seq, "bf16", backward=backward) * dev.sustained_fraction / h200.sustained_fraction)
    for seq, tflops in FA2_CAUSAL_FWD.items():
        assert attention_tflops(dev, seq, "bf16") == pytest.approx(dev.sustained_fraction * tflops)
    # flat beyond the last point
    assert attention_tflops(dev, 131072, "bf16") == pytest.approx(dev.sustained_fraction * 335)
    assert dev.attention.backward_ratio == pytest.approx(318 / 370, abs=0.005)


def test_500w_profile_derates_attention_as_its_matmuls():
    gt, dgx = load_profile("h100-96g-gt").device, load_profile("h100-80g-dgx").device
    # 500 W: every tensor-core kernel at the same share of its 700 W best case, attention as matmuls. The
    # two parts carry one fitted share (constants.H100_CLASS), so the ratio is 1 today; the test holds for any.
    ratio = gt.sustained_fraction / dgx.sustained_fraction
    shape = (8192, 8192, 8192)
    assert matmul_tflops(gt, *shape, "bf16") / matmul_tflops(dgx, *shape, "bf16") == pytest.approx(
        ratio * gt.matmul.max_fraction["bf16"] / dgx.matmul.max_fraction["bf16"], rel=1e-3)
    for seq in FA2_CAUSAL_FWD:
        assert attention_tflops(gt, seq, "bf16") == pytest.approx(ratio * attention_tflops(dgx, seq, "bf16"))
    assert 0.5 < gt.sustained_fraction <= dgx.sustained_fraction <= 1.0
    # between measured lengths: log-linear interpolation
    mid = attention_tflops(gt, 3000, "bf16")
    assert attention_tflops(gt, 2048, "bf16") < mid < attention_tflops(gt, 4096, "bf16")


def test_h200_attention_gives_back_the_rates_measured_in_its_step():
    """0.690 ms forward and 2.360 ms backward per llama3.2-3b block at seq 4096, micro-batch 4
    (benchmarks/results/ops-llama3.2-3b-planner_1-NVIDIA_H200-9816110.txt): causal attention's forward FLOPs
    by hand, 4 * 4096 * 4096 / 2 * (24 heads x 128) * 4 sequences = 412.3 GFLOP, 2.5x that backward."""
    dev = load_profile("h200-141g-dgx").device
    flops = 4 * 4096 * 4096 / 2 * 24 * 128 * 4
    assert flops / 0.690e-3 / 1e12 == pytest.approx(attention_tflops(dev, 4096, "bf16"), rel=0.002)
    assert 2.5 * flops / 2.360e-3 / 1e12 == pytest.approx(attention_tflops(dev, 4096, "bf16", backward=True),
                                                         rel=0.002)
    # other lengths from 2k: cuDNN's H200 benchmark's shape, scaled to the step's 4096 point; below, FA2's from 2k
    h200 = {int(r["seq_len"]): (float(r["fwd_tflops"]), float(r["bwd_tflops"])) for r in _cudnn_rows("H200")}
    assert sorted(h200) == [2048, 4096, 8192, 16384, 32768]
    for seq, (fwd, bwd) in h200.items():
        assert attention_tflops(dev, seq, "bf16") / attention_tflops(dev, 4096, "bf16") == pytest.approx(
            fwd / h200[4096][0], rel=0.002)
        assert attention_tflops(dev, seq, "bf16", backward=True) / attention_tflops(
            dev, 4096, "bf16", backward=True) == pytest.approx(bwd / h200[4096][1], rel=0.002)
    for seq in (512, 1024):
        assert attention_tflops(dev, seq, "bf16") / attention_tflops(dev, 2048, "bf16") == pytest.approx(
            FA2_CAUSAL_FWD[seq] / FA2_CAUSAL_FWD[2048], rel=0.002)


def test_gb200_attention_is_cudnns_measured_benchmark():
    """Each GB200 point is a row of cuDNN's SDPA benchmark: this project's FLOPs over the printed time. Causal,
    2 x batch x heads x s x s/2 x (qk + vo width) forward and 2.5x that backward; a window's keys for the
    sliding-window row. The printed TFLOP/s agree forward, and backward where qk = vo: for MLA's 192/128 the
    benchmark counts the backward's five matmuls by their own widths (three over qk, two over vo)."""
    dev = load_profile("gb200-186g-nvl72").device
    points = {(p["dtype"], p["seq_len"], p["head_dim"], p.get("window")): (p["tflops"], p["bwd_tflops"])
              for p in dev.attention.points}
    rows = _cudnn_rows("GB200")
    assert len(points) == len(rows) == 21  # bf16: 11; MXFP8: Llama 3.1's 5 lengths and GPT-OSS's window at 5
    for r in rows:
        b, s, h, qk, vo = (int(r[k]) for k in ("batch", "seq_len", "q_heads", "head_dim_qk", "head_dim_vo"))
        w = int(r["window"]) if r["window"] else None
        keys = (w * (w + 1) / 2 + (s - w) * w) / s if w else s / 2
        per_width = 2 * b * h * s * keys
        fwd_ms, bwd_ms = float(r["fwd_ms"]), float(r["bwd_ms"])
        # the page prints whole TFLOP/s: 1 % or its rounding, whichever is wider
        assert per_width * (qk + vo) / fwd_ms / 1e9 == pytest.approx(float(r["fwd_tflops"]), rel=0.01, abs=0.5)
        assert per_width * (3 * qk + 2 * vo) / bwd_ms / 1e9 == pytest.approx(float(r["bwd_tflops"]), rel=0.01,
                                                                              abs=0.5)
        assert points[(r["dtype"], s, qk, w)] == pytest.approx((per_width * (qk + vo) / fwd_ms / 1e9,
                                                                2.5 * per_width * (qk + vo) / bwd_ms / 1e9), abs=0.06)


def test_a_window_runs_at_its_window_rate_not_the_sequence_rate():
    gb = load_profile("gb200-186g-nvl72").device
    sf = 1.0  # cuDNN's benchmark rows are taken as a step's rates (tagged in_step; forms.py attention_rate)
    # GPT-OSS's 128-token window at head 64: the measured window point, whatever the length
    for seq in (2048, 4096, 8192):
        assert attention_tflops(gb, seq, "bf16", 64, window=128) == pytest.approx(sf * 161, rel=0.01)
        assert attention_tflops(gb, seq, "bf16", 64, backward=True, window=128) == pytest.approx(sf * 182, rel=0.01)
    # a window as long as the sequence is full attention; full layers ignore window points
    assert attention_tflops(gb, 4096, "bf16", 128, window=4096) == pytest.approx(sf * 1408, rel=0.01)
    # a profile without window points runs a window at the causal rate of length 2 x window (keys per query)
    h100 = load_profile("h100-80g-dgx").device
    assert attention_tflops(h100, 8192, "bf16", window=512) == pytest.approx(h100.sustained_fraction * 260)
    # the B200 is the GB200's chip at 1000 W: its points scaled by the two MAMF bf16 rates
    b2 = load_profile("b200-180g-dgx").device
    scale = (b2.matmul.max_fraction["bf16"] * b2.peak_tflops["bf16"]) / (gb.matmul.max_fraction["bf16"] * gb.peak_tflops["bf16"])
    for p, q in zip(gb.attention.points, b2.attention.points):
        assert q["tflops"] == pytest.approx(scale * p["tflops"], abs=0.06)


def test_mxfp8_attention_takes_its_own_points_and_its_window_backward_grows_with_the_sequence():
    """Megatron-Bridge's full-iteration MXFP8 recipes run attention in MXFP8 (Layout.attention_dtype). cuDNN's
    MXFP8 backward of GPT-OSS's 128-key window took 0.642, 2.080, 7.427 and 27.940 ms at 2k, 4k, 8k and 16k
    tokens (data/published/attention_cudnn_sdpa.csv): about 4x per doubling, the square of the length, where
    bf16's window kernel holds its rate. So a windowed layer in MXFP8 is priced by its length: at 4096 the
    printed 41 TFLOP/s, at 12k between 8k's 23 and 16k's 12."""
    gb = load_profile("gb200-186g-nvl72").device
    sf = 1.0  # cuDNN's benchmark rows are taken as a step's rates (tagged in_step; forms.py attention_rate)
    assert attention_tflops(gb, 4096, "mxfp8", 64, backward=True, window=128) == pytest.approx(sf * 40.7, rel=0.01)
    at12k = attention_tflops(gb, 12288, "mxfp8", 64, backward=True, window=128)
    assert sf * 12.3 < at12k < sf * 23.0
    # a wider window costs that kernel the same causal tiles, so its rate in the window's FLOPs rises with its
    # keys: 256 keys a query (less the first window's ramp) over 128, (32896 + 3840 x 256) / (8256 + 3968 x 128)
    keys = (256 * 257 / 2 + 3840 * 256) / (128 * 129 / 2 + 3968 * 128)
    assert attention_tflops(gb, 4096, "mxfp8", 64, backward=True, window=256) == pytest.approx(
        sf * 40.7 * keys, rel=0.01)
    # beyond the measured lengths its time keeps the square of the length: at 64k half the 32k rate, 6.3
    assert attention_tflops(gb, 65536, "mxfp8", 64, backward=True, window=128) == pytest.approx(sf * 6.3 / 2, rel=0.01)
    # a 2048-key window at 8k: the 8k point's 23.0 times the keys, (2048 x 2049 / 2 + 6144 x 2048) / (128 x 129 /
    # 2 + 8064 x 128); and a window all but the sequence's stays under full attention's rate at that length
    keys = (2048 * 2049 / 2 + 6144 * 2048) / (128 * 129 / 2 + 8064 * 128)
    assert attention_tflops(gb, 8192, "mxfp8", 64, backward=True, window=2048) == pytest.approx(sf * 23.0 * keys,
                                                                                              rel=0.01)
    assert attention_tflops(gb, 8192, "mxfp8", 64, backward=True, window=8000) < attention_tflops(
        gb, 8192, "mxfp8", 64, backward=True)
    # with a window kernel ten times faster at every length, that window meets the cap: full attention's rate
    fast = replace(gb, attention=replace(gb.attention, points=[
        dict(p, bwd_tflops=10 * p["bwd_tflops"]) if p["dtype"] == "mxfp8" and "window" in p else p
        for p in gb.attention.points]))
    assert attention_tflops(fast, 8192, "mxfp8", 64, backward=True, window=8000) == pytest.approx(
        attention_tflops(fast, 8192, "mxfp8", 64, backward=True))
    # its forward ran the window's own tiles (152.7 at 2k to 167.6 at 32k): read at the length, any window
    assert attention_tflops(gb, 4096, "mxfp8", 64, window=256) == attention_tflops(gb, 4096, "mxfp8", 64, window=128) \
        == pytest.approx(sf * 161.1, rel=0.001)
    # full causal head 128: cuDNN's MXFP8 Llama 3.1 rows, 1685 / 1054 TFLOP/s at 4096
    assert attention_tflops(gb, 4096, "mxfp8", 128) == pytest.approx(sf * 1686.4, rel=0.001)
    assert attention_tflops(gb, 4096, "mxfp8", 128, backward=True) == pytest.approx(sf * 1053.2, rel=0.001)
    # head 64 in MXFP8: fp8's 5000 TFLOP/s beside the same exponentials, 1024 FLOPs each; a forward score
    # 4 x 128 + 1024 at head 128, 4 x 64 + 1024 at 64: 0.5 x 1536 / 1280 = 0.6 of head 128's rate
    assert attention_tflops(gb, 4096, "mxfp8", 64) / attention_tflops(gb, 4096, "mxfp8", 128) == pytest.approx(0.6)
    # a part without MXFP8 points prices it as its compute dtype, and so does one whose MXFP8 points do not
    # cover the query (a window's alone, asked for full attention)
    h200 = load_profile("h200-141g-dgx").device
    assert attention_tflops(h200, 4096, "mxfp8", 128) == attention_tflops(h200, 4096, "bf16", 128)
    windows_only = replace(gb, attention=replace(gb.attention, points=[
        p for p in gb.attention.points if p["dtype"] != "mxfp8" or "window" in p]))
    assert attention_tflops(windows_only, 4096, "mxfp8", 128, backward=True) == attention_tflops(
        windows_only, 4096, "bf16", 128, backward=True)


def test_in_step_points_are_taken_as_they_are_and_the_rest_derated():
    """forms.py attention_rate: under in_step, cuDNN's GB200 benchmark rows (tagged in_step) price attention as
    printed, FlashAttention-2's published H100 figures (untagged) at the sustained fraction; under derated,
    every point at the sustained fraction; a part without points is derated either way."""
    from meshplan.cost_models import forms
    gb200 = load_profile("gb200-186g-nvl72").device
    row = next(r for r in _cudnn_rows("GB200") if r["id"] == "cudnn-gb200-llama3.1-4096")
    printed_fwd, printed_bwd = float(row["fwd_tflops"]), float(row["bwd_tflops"])  # 1408 / 1148
    h100 = load_profile("h100-80g-dgx").device
    with forms.forms(attention_rate="in_step"):
        # the profile's point (1406.0 / 1147.2) is the benchmark's row within its rounding
        assert attention_tflops(gb200, 4096, "bf16") == pytest.approx(printed_fwd, rel=0.002)
        assert attention_tflops(gb200, 4096, "bf16", backward=True) == pytest.approx(printed_bwd, rel=0.002)
        assert attention_tflops(h100, 4096, "bf16") == pytest.approx(h100.sustained_fraction * FA2_CAUSAL_FWD[4096])
    with forms.forms(attention_rate="derated"):
        assert attention_tflops(gb200, 4096, "bf16") == pytest.approx(gb200.sustained_fraction * printed_fwd, rel=0.002)
        assert attention_tflops(h100, 4096, "bf16") == pytest.approx(h100.sustained_fraction * FA2_CAUSAL_FWD[4096])
    a100 = load_profile("a100-80g-dgx").device
    assert not a100.attention.points
    with forms.forms(attention_rate="in_step"):
        in_step = attention_tflops(a100, 4096, "bf16")
    with forms.forms(attention_rate="derated"):
        assert in_step == pytest.approx(attention_tflops(a100, 4096, "bf16"))
    assert in_step < a100.sustained_fraction * a100.peak_tflops["bf16"]
