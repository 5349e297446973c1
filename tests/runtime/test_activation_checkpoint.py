"""Selective activation checkpointing saves exactly the op kinds a plan lists, eager and compiled.

Bytes kept for backward by one block of tiny (llama: dim 64, 4 heads of 16, 2 KV heads, SwiGLU 128)
and tiny-gpt (dim 64, 4 heads, MLP 256, biases), 2 x 32 tokens in fp32, saving one op kind at a
time, minus what full AC keeps: by hand, qkv keeps T x (64 + 2 x kv) floats, attn_out and ffn_out
T x 64, ffn_in T x 128 x 2 (SwiGLU) or T x 256 (GELU), attention its output T x 64 and its fp32
log-sum-exp (batch x heads x seq).
"""

from __future__ import annotations

import pytest
import torch

from meshplan.runtime.activation_checkpoint import apply_ac, sac_context_fn
from meshplan.runtime.model import Transformer
from meshplan.specs.plan import SAC_OPS
from meshplan.specs.registry import resolve_model
from kept import kept_after_forward

B, S = 2, 32
T = B * S
F32 = 4
BY_HAND = {
    "tiny": {"qkv": T * (64 + 32 + 32) * F32, "attention": T * 64 * F32 + B * 4 * S * F32,
             "attn_out": T * 64 * F32, "ffn_in": T * 2 * 128 * F32, "ffn_out": T * 64 * F32},
    "tiny-gpt": {"qkv": T * 3 * 64 * F32, "attention": T * 64 * F32 + B * 4 * S * F32,
                 "attn_out": T * 64 * F32, "ffn_in": T * 256 * F32, "ffn_out": T * 64 * F32},
}


def block_of(model: str, ac: str, ops: list[str] | None):
    torch.manual_seed(0)
    m = Transformer(resolve_model(model))
    apply_ac(m, ac, ops)
    return m.layers["0"]


def kept_eager(model: str, ac: str, ops: list[str] | None = None) -> int:
    return kept_after_forward(block_of(model, ac, ops), B, S, 64)


def kept_compiled(model: str, ac: str, ops: list[str] | None = None) -> int:
    """Bytes of the tensors a compiled block saves for backward (parameters aside), by saved-tensor hooks."""
    torch._dynamo.reset()  # Dynamo does not guard on the checkpoint policy: a fresh graph per op set
    block = block_of(model, ac, ops)
    block.compile()
    x = torch.randn(B, S, 64, requires_grad=True)
    block(x)
    params = {p.data_ptr() for p in block.parameters()}
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return sum(saved)


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt"])
def test_eager_selective_ac_keeps_exactly_the_listed_kinds(model):
    full = kept_eager(model, "full")
    for kind in SAC_OPS:
        assert kept_eager(model, "selective", [kind]) - full == BY_HAND[model][kind], kind
    everything = kept_eager(model, "selective", list(SAC_OPS)) - full
    assert everything == sum(BY_HAND[model].values())


@pytest.mark.slow  # inductor builds C++ kernels for each op set: ~15 s here
def test_compiled_selective_ac_keeps_the_listed_kinds():
    """Under torch.compile the policy marks the same outputs; AOTAutograd then keeps those backward
    needs: the linears' outputs exactly, attention's in part (it recomputes what is cheaper), and
    none of w2's output, which no gradient reads (eager SAC keeps it all the same)."""
    full = kept_compiled("tiny", "full")
    got = {kind: kept_compiled("tiny", "selective", [kind]) - full for kind in SAC_OPS}
    hand = BY_HAND["tiny"]
    assert {k: got[k] for k in ("qkv", "attn_out", "ffn_in")} == {k: hand[k] for k in ("qkv", "attn_out", "ffn_in")}
    assert 0 < got["attention"] <= hand["attention"] and got["ffn_out"] == 0, got


def test_declared_matmul_order_is_the_forwards():
    """The kinds a block declares, in order, against the linears its forward really runs (recorded
    by forward hooks, named here by hand)."""
    for model, names in (("tiny", ["wq", "wk", "wv", "wo", "w1", "w3", "w2"]), ("tiny-gpt", ["wq", "wk", "wv", "wo", "w1", "w2"])):
        block = Transformer(resolve_model(model)).layers["0"]
        ran: list[str] = []
        for name, mod in block.named_modules():
            if isinstance(mod, torch.nn.Linear):
                mod.register_forward_hook(lambda m, a, o, name=name: ran.append(name.rsplit(".", 1)[-1]))
        block(torch.randn(1, 8, 64))
        assert ran == names
        kind_of = {"wq": "qkv", "wk": "qkv", "wv": "qkv", "wo": "attn_out", "w1": "ffn_in", "w3": "ffn_in", "w2": "ffn_out"}
        assert list(block.matmul_kinds()) == [kind_of[n] for n in names]


def test_a_forward_with_more_matmuls_than_declared_fails_loudly():
    """If a block's forward grew a matmul its matmul_kinds() does not list, the policy would save the
    wrong outputs: it raises instead."""
    from torch.utils.checkpoint import checkpoint

    w = torch.randn(8, 8, requires_grad=True)

    def three_matmuls(x):
        return x @ w @ w @ w

    with pytest.raises(RuntimeError, match="more linear matmuls"):
        checkpoint(three_matmuls, torch.randn(4, 8), use_reentrant=False,
                   context_fn=sac_context_fn(("qkv", "qkv"), frozenset({"qkv"})))


class _Matmuls(torch.utils._python_dispatch.TorchDispatchMode):
    """The (rows, columns) of every matmul output, in dispatch order."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in ("mm", "addmm", "bmm") and isinstance(out, torch.Tensor):
            self.shapes.append(tuple(out.shape))
        return out


def backward_matmuls(model: str, early_stop: bool) -> list[tuple[int, ...]]:
    block = block_of(model, "full", None)
    x = torch.randn(B, S, 64, requires_grad=True)
    with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
        y = block(x)
        counted = _Matmuls()
        with counted:
            y.sum().backward()
    return counted.shapes


@pytest.mark.parametrize("model", ["tiny", "tiny-gpt"])
def test_full_ac_replay_stops_before_the_last_matmul(model):
    """Full AC as the runtime wraps it (checkpoint_wrapper, non-reentrant) replays the block in backward only up
    to the last tensor its forward saved: the FFN's down projection, whose output only the residual add reads,
    is not run again (PyTorch's default early stop), where a replay run to the end runs it (the cost model's
    Layout.checkpoint_early_stop; forms.py checkpoint_replay). The one matmul the default leaves out makes the
    block's hidden width (64) from T tokens of the FFN's width."""
    stopped, whole = backward_matmuls(model, True), backward_matmuls(model, False)
    assert len(whole) == len(stopped) + 1
    missing = list(whole)
    for shape in stopped:
        missing.remove(shape)
    assert missing == [(T, 64)]
