"""Attention kernels and context parallelism: no dense mask anywhere, the gather CP path exact and
linear in memory, its chunk order PyTorch's, and the estimate pricing the path each backend runs."""

from __future__ import annotations

from dataclasses import replace

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from meshplan.cost_models.estimate import estimate_plan
from meshplan.cost_models.layout import layout_of, runtime_paths
from meshplan.profiles import load_profile
from meshplan.runtime.context_parallel import _visibility, _visible_tiles, chunk_spans, shard_sequence
from meshplan.runtime.model import SeqLayout, build_model
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import plan_from_dict
from meshplan.specs.rules import cp_gather_tiles
from plan_base import base_plan

HERE = Path(__file__).parent
GQA = ModelSpec.from_dict({"name": "gqa", "arch": "llama", "dim": 64, "n_layers": 1, "n_heads": 4,
                           "n_kv_heads": 2, "ffn_dim": 128, "vocab_size": 64, "max_seq_len": 64})


def test_attention_without_cp_is_causal_sdpa_with_grouped_kv_and_no_mask(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        calls.append((q.shape, k.shape, args, kwargs))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = build_model(GQA, "cpu")
    model(torch.randint(0, 64, (2, 16)))
    assert len(calls) == 1
    q_shape, k_shape, args, kwargs = calls[0]
    assert args == () and kwargs.get("attn_mask") is None
    assert kwargs["is_causal"] is True and kwargs["enable_gqa"] is True
    # K/V keep their 2 heads (not repeated to the 4 query heads).
    assert q_shape[1] == 4 and k_shape[1] == 2


def test_chunk_order_is_pytorch_head_tail_load_balancer():
    from torch.distributed.tensor.experimental._attention import _HeadTailLoadBalancer

    for cp in (2, 3, 4):
        seq = 8 * cp
        ours = torch.cat([shard_sequence(torch.arange(seq)[None], SeqLayout(r, cp)) for r in range(cp)], dim=1)
        theirs = _HeadTailLoadBalancer(seq, cp, "cpu")._generate_indices()
        assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize("cp,local,tile", [(2, 8, 2), (3, 12, 4), (4, 6, 2), (2, 10, 4)])
def test_tiles_cover_exactly_the_causal_pairs(cp, local, tile):
    """Brute force: the union of full / causal tiles over all ranks' keys is k <= q, nothing more."""
    for r in range(cp):
        layout = SeqLayout(r, cp)
        q_pos = layout.positions(local)
        seen = torch.zeros(local, cp * local, dtype=torch.int64)
        keys = [(src, s) for src in range(cp) for s in chunk_spans(SeqLayout(src, cp), local, tile)]
        k_pos = torch.cat([SeqLayout(src, cp).positions(local) for src in range(cp)])
        for qs in chunk_spans(layout, local, tile):
            assert q_pos[qs.local:qs.local + qs.length].tolist() == list(range(qs.start, qs.start + qs.length))
            for src, ks in keys:
                kind = _visibility(qs, ks)
                if kind == "skip":
                    continue
                block = torch.ones(qs.length, ks.length, dtype=torch.int64)
                if kind == "causal":
                    block = block.tril()
                cols = src * local + ks.local
                seen[qs.local:qs.local + qs.length, cols:cols + ks.length] += block
        assert torch.equal(seen, (k_pos[None, :] <= q_pos[:, None]).long())


@pytest.mark.parametrize("seq, cp", [(128, 2), (2048, 2), (4096, 4), (8192, 8), (3072, 2)])
def test_the_estimates_tile_count_is_the_runtimes(seq, cp):
    """cp_gather_tiles (what the estimate prices) against the tiles the runtime visits, on every rank."""
    for rank in range(cp):
        tiles = list(_visible_tiles(SeqLayout(rank, cp), seq // cp))
        assert (len(tiles), sum(causal for *_, causal in tiles)) == cp_gather_tiles(seq, cp), (seq, cp, rank)


@pytest.mark.distributed
def test_gather_cp_is_exact_and_linear_in_memory(tmp_path):
    """2-rank gloo world (cp_worker.py): fp64 output and q/k/v gradients equal one-process causal
    SDPA to 1e-10 (GQA and MHA); peak memory grows by the same increment each time the sequence
    doubles beyond 2k (linear: increments double, ratio 2; an S x S mask or score matrix: 4)."""
    out = tmp_path / "cp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=0",
           str(HERE / "cp_worker.py"), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["max_abs_error"] < 1e-10
    p2, p4, p8 = res["peak_bytes"]
    ratio = (p8 - p4) / (p4 - p2)
    assert 1.6 < ratio < 2.5, res
    # At 8k tokens a (heads x S x S) fp32 score matrix of one rank's queries alone is 2*4096*8192*4 B = 256 MiB.
    assert p8 < 16 * 2**20, res


def _cp_plan(cluster: str):
    raw = base_plan("tiny", cluster)
    raw["training"].update(seq_len=4096, global_batch=2, micro_batch=1, dtype="bf16")
    raw["parallel"].update(cp=4)
    raw["gpus"] = 4
    return plan_from_dict(raw)


def test_estimate_prices_the_cp_path_of_the_clusters_backend():
    gloo, h100 = load_profile("cpu-gloo"), load_profile("h100-80g-dgx")
    assert runtime_paths(layout_of(_cp_plan("cpu-gloo")), gloo).cp_attention == "gather"
    ring = runtime_paths(layout_of(_cp_plan("h100-80g-dgx")), h100)
    assert (ring.cp_attention, ring.kv_repeated) == ("ring", True)
    plan = _cp_plan("h100-80g-dgx")
    priced = estimate_plan(plan, h100).step_time_s
    assert priced == estimate_plan(plan, h100, cp_attention="ring", kv_repeated=True).step_time_s
    # The ring's fp32 merging and K/V at query width cost device time the gather path does not have (host
    # work apart: the gather path's Python tiles, counted for gloo, would bind this tiny model on a GPU).
    kernels = replace(h100, overheads=replace(h100.overheads, op_dispatch_s=0.0, python_dispatch_s=0.0,
                                              checkpoint_op_s=0.0, sac_op_s=0.0))
    assert (estimate_plan(plan, kernels).step_time_s
            > estimate_plan(plan, kernels, cp_attention="gather", kv_repeated=False).step_time_s)
