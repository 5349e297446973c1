"""Initial weights are counter-based draws: the same value for an element whatever holds it.

Checked against a pure-Python splitmix64 + Box-Muller (a hand implementation with Python's exact
integers), for their distribution (moments and a Kolmogorov-Smirnov test against N(0, 1)), and
for sharding: every rank of 4 (PyTorch's fake process group, one rank at a time) draws exactly the
slice DTensor's own slicing cuts from the full value, for even, uneven, 2-D and strided
(FSDP2 over TP) placements.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from meshplan.runtime.initialisation import counter_normal, fill_normal, init_value, local_indices, stream_key

M64 = (1 << 64) - 1


def splitmix64_normal(key: int, i: int) -> float:
    z = (key + (i + 1) * 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z = z ^ (z >> 31)
    u1 = ((z >> 40) + 0.5) / 2**24
    u2 = (((z >> 16) & 0xFFFFFF) + 0.5) / 2**24
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def test_draws_are_splitmix64_box_muller():
    key = stream_key(7, "layers.3.attention.wq.weight")
    idx = [0, 1, 2, 1000, 2**31 + 5, 2**40 + 3]
    got = counter_normal(key, torch.tensor(idx)).tolist()
    assert got == pytest.approx([splitmix64_normal(key & M64, i) for i in idx], abs=2e-5)


def test_draws_are_standard_normal():
    from scipy import stats

    z = counter_normal(stream_key(0, "w"), torch.arange(1 << 20)).double()
    assert abs(float(z.mean())) < 0.005 and abs(float(z.std()) - 1) < 0.005
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-3
    other = counter_normal(stream_key(1, "w"), torch.arange(1 << 16)).double()
    assert abs(float(torch.corrcoef(torch.stack([z[: 1 << 16], other]))[0, 1])) < 0.02  # seeds decorrelate


def _placements():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    return {"rows (even)": ((4,), (Shard(0),)), "columns (uneven)": ((4,), (Shard(1),)),
            "2-D mesh": ((2, 2), (Shard(0), Shard(1))), "replicate x shard": ((2, 2), (Replicate(), Shard(1))),
            "strided (FSDP2 over TP)": ((2, 2), (_StridedShard(0, split_factor=2), Shard(0)))}


@pytest.mark.parametrize("name", list(_placements()))
def test_every_rank_draws_its_slice_of_the_full_value(name):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    mesh_shape, placements = _placements()[name]
    shape, key, std = (12, 10), stream_key(3, "p"), 0.02
    full = torch.empty(shape)
    fill_normal(full, key, [torch.arange(n) for n in shape], shape, std)
    slices = []
    for rank in range(4):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            mesh = init_device_mesh("cpu", mesh_shape)
            param = distribute_tensor(torch.zeros(shape), mesh, placements, src_data_rank=None)
            local = param.to_local()
            fill_normal(local, key, local_indices(param), shape, std)
            expected = distribute_tensor(full, mesh, placements, src_data_rank=None).to_local()
            assert torch.equal(local, expected), rank
            slices.append(local.numel())
        finally:
            dist.destroy_process_group()
    assert sum(slices) == full.numel() * (2 if "replicate" in name else 1)


def test_full_value_is_the_same_drawn_whole_or_in_chunks(monkeypatch):
    import meshplan.runtime.initialisation as init
    from meshplan.specs.registry import resolve_model

    spec = resolve_model("tiny")
    whole = init_value("layers.0.feed_forward.w2.weight", torch.Size((64, 128)), spec, 0)
    monkeypatch.setattr(init, "CHUNK", 100)  # 1 row a chunk
    assert torch.equal(init_value("layers.0.feed_forward.w2.weight", torch.Size((64, 128)), spec, 0), whole)
    assert abs(float(whole.std()) - 0.02 / math.sqrt(2 * spec.n_layers)) < 0.002  # residual projection's scale
