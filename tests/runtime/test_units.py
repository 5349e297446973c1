"""Single-process unit tests of the runtime's pieces (no process group)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meshplan.errors import InputError
from meshplan.runtime.activation_checkpoint import apply_ac
from meshplan.runtime.context_parallel import shard_sequence
from meshplan.runtime.data import BatchSpec, SyntheticData, TokenFileData, local_rows
from meshplan.runtime.metrics import LiveTensorMemory
from meshplan.runtime.initialisation import init_weights
from meshplan.runtime.model import SeqLayout, build_model
from meshplan.runtime.pipeline import split_layers, stage_ids
from meshplan.runtime.train import lr_lambda
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import SAC_OPS
from meshplan.specs.registry import BUILTIN_MODELS, resolve_model


@pytest.mark.parametrize("name", sorted(n for n, m in BUILTIN_MODELS.items() if m.runtime_attention))
def test_param_count_equals_model_spec(name):
    """Every model whose attention the runtime builds, dense or mixture-of-experts (Mixtral, DeepSeek-V3)."""
    spec = BUILTIN_MODELS[name]
    model = build_model(spec, "meta")
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()


def test_a_model_the_runtime_does_not_build_is_refused():
    with pytest.raises(InputError, match="sliding windows"):
        build_model(BUILTIN_MODELS["gpt-oss-120b"], "meta")


def test_param_count_tied_and_gqa_gpt():
    spec = ModelSpec.from_dict({"name": "t", "arch": "gpt", "dim": 64, "n_layers": 3, "n_heads": 4,
                                "n_kv_heads": 2, "ffn_dim": 96, "vocab_size": 100, "tied_embeddings": True,
                                "max_seq_len": 64})
    model = build_model(spec, "meta")
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()


def test_init_depends_on_seed_and_name_only():
    spec = resolve_model("tiny")
    a, b, c = (build_model(spec, "cpu") for _ in range(3))
    init_weights(a, spec, 0)
    init_weights(b, spec, 0)
    init_weights(c, spec, 1)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), n
        if "norm" not in n:
            assert not torch.equal(pa, pc), n
    # A pipeline stage (layer 1 only) gets the same values for the same names.
    from meshplan.runtime.model import keep_stage

    stage = keep_stage(build_model(spec, "cpu"), [1], first=False, last=True)
    init_weights(stage, spec, 0)
    full = dict(a.named_parameters())
    for n, p in stage.named_parameters():
        assert torch.equal(p, full[n]), n


def test_cp_chunks_and_positions_are_load_balanced():
    x = torch.arange(16)[None, :]
    parts = [shard_sequence(x, SeqLayout(r, 2)) for r in range(2)]
    assert parts[0].tolist() == [[0, 1, 2, 3, 12, 13, 14, 15]]
    assert parts[1].tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    for r in range(2):
        assert SeqLayout(r, 2).positions(8).tolist() == parts[r][0].tolist()


def test_pipeline_stage_mapping_and_split():
    assert [stage_ids(r, 2, 2, "ZBVZeroBubble") for r in range(2)] == [[0, 3], [1, 2]]
    assert [stage_ids(r, 2, 2, "DualPipeV") for r in range(2)] == [[0, 3], [1, 2]]
    assert [stage_ids(r, 2, 2, "Interleaved1F1B") for r in range(2)] == [[0, 2], [1, 3]]
    assert split_layers(5, 2, None) == [[0, 1, 2], [3, 4]]
    assert split_layers(4, 2, [1, 3]) == [[0], [1, 2, 3]]


def test_lr_warmup_then_cosine():
    f = lr_lambda(warmup=2, total=10, min_ratio=0.1)
    assert f(0) == pytest.approx(0.5) and f(1) == pytest.approx(1.0)
    assert f(2) == pytest.approx(1.0) and f(10) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(2, 10))


def test_synthetic_rows_do_not_depend_on_the_split():
    src = SyntheticData(BatchSpec(global_batch=8, seq_len=16, vocab_size=256), seed=3)
    whole = src.rows(5, 0, 8)
    halves = torch.cat([local_rows(src, 5, r, 2)[0] for r in range(2)])
    assert torch.equal(halves, whole[:, :-1])
    assert not torch.equal(src.rows(6, 0, 8), whole)


def test_token_file_rows(tmp_path):
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    src = TokenFileData(str(path), BatchSpec(global_batch=4, seq_len=10, vocab_size=50000), "auto")
    inputs, targets = local_rows(src, 1, 1, 2)  # step 1, dp rank 1 of 2 -> global rows 2, 3
    assert inputs[0].tolist() == list(range(60, 70)) and targets[0].tolist() == list(range(61, 71))
    assert inputs[1, 0].item() == 70


def test_memory_tracker_counts_live_storages_and_resizes():
    mem = LiveTensorMemory(torch.device("cpu"))
    with mem:
        base = mem.peak
        a = torch.empty(1 << 18)            # 1 MiB
        b = a.view(-1, 2)                   # a view: no new storage
        del a, b
        c = torch.empty(1 << 19)            # 2 MiB, allocated after the 1 MiB one is freed
        c.untyped_storage().resize_(0)      # freed in place (as FSDP2 does): no longer counted
        d = torch.ones(1 << 17)             # 0.5 MiB
        del c, d
    assert mem.peak - base == (1 << 21)


def test_memory_tracker_leaves_fake_tensors_out():
    """Fake tensors (what torch.compile traces with, which it can leave alive) hold no memory: one alive
    when the tracker starts, with a symbolic size, adds nothing, and the count stays an int. Before they
    were left out, a compile earlier in the process made a later count a SymInt."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    shape_env = ShapeEnv()
    with FakeTensorMode(shape_env=shape_env) as mode:
        size = shape_env.create_unbacked_symint()
        fake = torch.empty(size * 64)
    assert isinstance(fake.untyped_storage().nbytes(), torch.SymInt) and mode is not None
    mem = LiveTensorMemory(torch.device("cpu"))
    with mem:
        base = mem.current()
        real = torch.empty(1 << 18)  # 1 MiB
    assert type(mem.peak) is int and mem.peak - base == (1 << 20)
    del fake, real


def test_compiled_code_runs_uncompiled_under_the_memory_tracker():
    """Why runtime/train.py does not count live tensors of compiled plans: under a dispatch mode dynamo
    runs a compiled function op by op, uncompiled (inductor would fuse sin, cos and mul into one
    kernel and never dispatch them), so the count would be the memory of eager code."""
    from meshplan.runtime.train import counts_live_tensors
    from meshplan.specs.plan import plan_from_dict
    from plan_base import base_plan

    compiled = torch.compile(lambda x: torch.sin(x).cos() * 2)
    x = torch.randn(8)
    compiled(x)
    seen = []

    class Ops(LiveTensorMemory):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return super().__torch_dispatch__(func, types, args, kwargs)

    with Ops(torch.device("cpu")):
        compiled(x)
    assert seen == ["aten.sin.default", "aten.cos.default", "aten.mul.Tensor"]
    raw = base_plan("tiny", "cpu-gloo")
    assert counts_live_tensors(plan_from_dict(raw), torch.device("cpu"))
    assert not counts_live_tensors(plan_from_dict({**raw, "compile": True}), torch.device("cpu"))


AC_CASES = {"none": ("none", None), "selective": ("selective", None), "full": ("full", None),
            "sac_all": ("selective", list(SAC_OPS)), "sac_attention": ("selective", ["attention"])}


def test_selective_and_full_ac_save_less_memory():
    """Single process: identical loss and gradients; memory none > selective (default ops) >
    selective saving only attention > full; saving every op kind costs more than the default."""
    spec = resolve_model("tiny")
    x = torch.randint(0, spec.vocab_size, (4, 64))
    peaks, losses = {}, {}
    for mode, (ac, ops) in AC_CASES.items():
        model = build_model(spec, "cpu")
        apply_ac(model, ac, ops)
        init_weights(model, spec, 0)
        mem = LiveTensorMemory(torch.device("cpu"))
        with mem:
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
        peaks[mode], losses[mode] = mem.peak, loss.item()
        grads = [p.grad.clone() for p in model.parameters()]
        if mode == "none":
            ref_grads = grads
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-7)
    assert peaks["none"] > peaks["selective"] > peaks["sac_attention"] > peaks["full"], peaks
    # Saving every op kind keeps more than the default (it is not "no AC": recomputed norms and
    # activation functions coexist with the saved matmul outputs during backward).
    assert peaks["sac_all"] > peaks["selective"], peaks
    assert len(set(losses.values())) == 1, losses
