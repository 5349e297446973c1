"""The MoE layer (runtime/moe.py) in one process, against computations written out here: each token's output
as the weighted sum of its experts' SwiGLUs plus the shared expert's, the router's choices against a
brute-force top-k, the grouped GEMM against its loop, the aux loss and the expert-bias update by hand,
balanced routing's experts, and the counters under activation checkpointing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from meshplan.runtime.initialisation import init_weights
from meshplan.runtime.model import build_model
from meshplan.runtime.moe import (AUX_LOSS_COEF, BIAS_UPDATE_RATE, MoE, finish_step, grouped_linear, moe_layers,
                                  routing_not_counted, routing_stats)
from meshplan.specs.model import ModelSpec
from meshplan.specs.registry import resolve_model

TINY = resolve_model("tiny-moe")


def _spec(**moe) -> ModelSpec:
    data = TINY.to_dict()
    data["moe"] = {**data["moe"], **moe}
    return ModelSpec.from_dict(data)


def _layer(spec: ModelSpec = TINY, seed: int = 0) -> MoE:
    model = build_model(spec, "cpu")
    init_weights(model, spec, seed)
    return model.layers["1"].moe


def _by_hand(m: MoE, x: torch.Tensor) -> torch.Tensor:
    """Every token through its top-k experts (weights renormalised) and the shared expert, one at a time."""
    e = m.experts
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        logits = m.router.gate(x[t]).float()
        scores = torch.sigmoid(logits) if m.spec.router == "sigmoid" else torch.softmax(logits, -1)
        bias = m.expert_bias if m.expert_bias is not None else torch.zeros_like(scores)
        choice = [(scores[i] + bias[i]).item() for i in range(m.spec.experts)]
        chosen = sorted(_allowed(m.spec, choice), key=lambda i: -choice[i])[:m.spec.top_k]
        total = sum(scores[i] for i in chosen)
        for i in chosen:
            a = e.w1[i] @ x[t] + (e.w1_bias[i] if e.w1_bias is not None else 0)
            b = e.w3[i] @ x[t] + (e.w3_bias[i] if e.w3_bias is not None else 0)
            y = e.w2[i] @ (F.silu(a) * b) + (e.w2_bias[i] if e.w2_bias is not None else 0)
            out[t] += scores[i] / total * y
    if m.shared_experts is not None:
        out += m.shared_experts(x)
    return out


def _allowed(moe, choice: list[float]) -> list[int]:
    """The experts a token may pick: all, or under group-limited routing those of the groups_per_token
    groups whose best top_k // groups_per_token choice scores sum highest (DeepSeek-V3, Megatron-Core)."""
    size = moe.experts // moe.expert_groups
    groups = [list(range(g * size, (g + 1) * size)) for g in range(moe.expert_groups)]
    best = max(1, moe.top_k // moe.groups_per_token)
    ranked = sorted(groups, key=lambda g: -sum(sorted((choice[i] for i in g), reverse=True)[:best]))
    return [i for g in ranked[:moe.groups_per_token] for i in g]


@pytest.mark.parametrize("spec", [TINY, _spec(router="sigmoid", load_balance="bias", bias=True, shared_experts=0),
                                  _spec(router="sigmoid", load_balance="bias", expert_groups=4, groups_per_token=1)],
                         ids=["softmax_aux_shared", "sigmoid_bias_biases", "sigmoid_group_limited"])
def test_output_is_each_tokens_experts_weighted(spec):
    torch.manual_seed(0)
    m = _layer(spec)
    if m.expert_bias is not None:
        m.expert_bias.copy_(torch.linspace(-0.05, 0.05, spec.moe.experts))  # the bias steers the choice
    x = torch.randn(2, 16, spec.dim)
    with torch.no_grad():
        got = m(x)
        want = _by_hand(m, x.reshape(-1, spec.dim)).view_as(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_grouped_linear_equals_its_loop_and_takes_empty_experts():
    torch.manual_seed(0)
    counts = torch.tensor([3, 0, 5, 0, 2])
    x, w = torch.randn(10, 64), torch.randn(5, 32, 64)
    got = grouped_linear(x, w, counts, torch.cumsum(counts, 0, dtype=torch.int32))
    want = torch.cat([x[0:3] @ w[0].T, x[3:8] @ w[2].T, x[8:10] @ w[4].T])
    torch.testing.assert_close(got, want)


def test_aux_loss_and_its_gradient_by_hand():
    """aux = E * sum_i f_i * P_i; its gradient reaches the router scaled by the coefficient and the layer's
    aux_grad_scale, exactly as if coef * scale * aux had been added to the loss."""
    torch.manual_seed(0)
    m = _layer()
    m.aux_grad_scale = 0.5
    x = torch.randn(1, 32, TINY.dim)
    m(x).sum().backward()
    got = m.router.gate.weight.grad.clone()
    m.zero_grad()
    # The same by hand: the output's sum through the layer, plus the aux loss as a term of the loss.
    tokens = x.reshape(-1, TINY.dim)
    scores = torch.softmax(m.router.gate(tokens).float(), -1)
    chosen = torch.topk(scores, 2, -1).indices
    f = torch.bincount(chosen.flatten(), minlength=8).float() / (32 * 2)
    aux = 8 * torch.sum(f * scores.mean(0))
    m.aux_grad_scale = 0.0  # the layer's own aux gradient off: added by hand below
    (m(x).sum() + AUX_LOSS_COEF * 0.5 * aux).backward()
    torch.testing.assert_close(got, m.router.gate.weight.grad, rtol=1e-5, atol=1e-8)
    assert m.aux_loss_sum.item() == pytest.approx(2 * aux.item(), rel=1e-5)  # two forwards counted


def test_balanced_routing_takes_experts_by_position():
    m = _layer()
    m.balanced_routing = True
    x = torch.randn(2, 8, TINY.dim)
    r = m.router(x, None, m.positions(8, x.device))
    want = torch.tensor([[(2 * p) % 8, (2 * p + 1) % 8] for p in range(8)] * 2)
    assert torch.equal(r.experts, want)


def test_expert_bias_moves_towards_the_mean_load():
    """DeepSeek-V3's update: b_i += gamma * sign(mean load - load_i), after the step's counts are summed."""
    m = _layer(_spec(router="sigmoid", load_balance="bias"))
    m.tokens_per_expert.copy_(torch.tensor([10.0, 0, 0, 0, 0, 0, 0, 6]))  # mean 2
    stats = finish_step([m], None, 2, 1, torch.device("cpu")).tolist()
    want = BIAS_UPDATE_RATE * torch.tensor([-1.0, 1, 1, 1, 1, 1, 1, -1])
    torch.testing.assert_close(m.expert_bias, want)
    got = routing_stats(stats, 1)
    # EP 2: experts 0-3 on one rank (10 pairs), 4-7 on the other (6): busiest over mean = 10 / 8.
    assert got.tokens_per_expert == (0.0, 2.0, 10.0) and got.imbalance == pytest.approx(10 / 8)
    assert m.tokens_per_expert.sum() == 0  # reset for the next step


def test_checkpointed_recomputation_and_shape_probes_are_not_counted():
    from torch.utils.checkpoint import checkpoint

    m = _layer()
    x = torch.randn(1, 16, TINY.dim, requires_grad=True)
    checkpoint(m, x, use_reentrant=False).sum().backward()  # the forward runs again in backward
    assert m.tokens_per_expert.sum().item() == 16 * 2
    with routing_not_counted(m):
        m(x)
    assert m.tokens_per_expert.sum().item() == 16 * 2


def test_a_model_counts_its_moe_layers_after_the_dense_ones():
    model = build_model(TINY, "meta")
    assert model.layers["0"].moe is None and model.layers["0"].feed_forward is not None
    assert len(moe_layers([model])) == TINY.n_layers - TINY.moe.dense_layers_first


@pytest.mark.parametrize("seed", range(3))
def test_expert_counts_are_a_brute_force_count(seed):
    """runtime/moe.expert_counts (a scatter-add, which does not read the device back) counts each expert's
    token-expert pairs as counting them one by one does, experts nobody picked included."""
    from collections import Counter

    from meshplan.runtime.moe import expert_counts

    g = torch.Generator().manual_seed(seed)
    flat = torch.randint(0, 12, (500,), generator=g)
    flat[flat == 5] = 4  # expert 5 left empty
    seen = Counter(flat.tolist())
    assert expert_counts(flat, 16).tolist() == [seen.get(e, 0) for e in range(16)]
