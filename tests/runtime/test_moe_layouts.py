"""Mixture-of-experts layouts train exactly like one process (issue 29): tiny-moe under expert parallelism
with FSDP, TP + SP, PP (1F1B and Interleaved1F1B), CP, HSDP, selective and full AC, EP 4 on 4 ranks, and
tiny-deepseek (MLA attention, sigmoid router with the aux-loss-free bias) under EP x FSDP and EP x PP, and a
toy Qwen3-MoE (heads wider than dim / n_heads, per-head q/k norms) under EP x FSDP and EP x TP + SP; each
layout's losses against the single-process reference (runtime/reference.py) over 5 fp32 steps and 2 bf16
steps, with the tolerances of the dense layouts (test_layouts.py).

Routing is balanced (runtime/moe.py, --balanced-routing): token position p takes experts (2p, 2p+1) mod 8,
so every layout routes every token alike, and the router still trains through the weights it gives the
outputs. One case routes by the router itself (sigmoid scores, DeepSeek-V3's aux-loss-free expert bias,
GPT-OSS's biases) under EP x TP: with a learned router a rounding difference could in principle flip a
near-tied top-k choice, which does not happen over these 5 steps (observed 7e-8).

What the per-step routing figures must be, by hand: the global batch is 8 sequences of 32 tokens, each
routed to 2 of 8 experts, so balanced routing gives every expert 8 * 32 * 2 / 8 = 64 token-expert pairs in
each of the 3 MoE layers (the first layer is dense), EP ranks equal loads (imbalance 1), and the
Switch aux loss E * sum_i f_i P_i = 8 * sum_i (1/8) P_i = 1 per layer (softmax probabilities sum to 1),
3 over the layers. A learned router keeps the mean at 64 and spreads min and max around it.
"""

from __future__ import annotations

import copy

import pytest

from cases import MOE_FOUR_RANK, MOE_TWO_RANK, in_bf16, moe
from test_layouts import BF16_NEW_ROUNDING, BF16_STEPS, MEMORY_TOLERANCE, REL_TOL, STEPS, WORLD_TIMEOUT_S
from worlds import collect, start_world
from meshplan.runtime.options import RunOptions
from meshplan.runtime.reference import reference_run
from meshplan.specs.plan import plan_from_dict

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LEARNED = "moe_learned_sigmoid_bias_ep2_tp2"
SIGMOID_BIAS = {"name": "tiny-moe-sigmoid", "arch": "llama", "dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2,
                "ffn_dim": 128, "vocab_size": 256, "max_seq_len": 256, "rope_theta": 10000.0,
                "moe": {"experts": 8, "top_k": 2, "expert_ffn_dim": 32, "dense_layers_first": 1,
                        "router": "sigmoid", "load_balance": "bias", "bias": True}}
LEARNED_CASE = moe(dp_shard=2, tp=2, sequence_parallel=True, ep=2)
LEARNED_CASE["model"] = SIGMOID_BIAS
FOUR = {**MOE_FOUR_RANK, LEARNED: LEARNED_CASE}
ALL = {**MOE_TWO_RANK, **FOUR}
PAIRS_PER_EXPERT = 8 * 32 * 2 / 8
MOE_LAYERS = 3


def _cases(layouts: dict) -> list[dict]:
    out = []
    for name, case in layouts.items():
        balanced = name != LEARNED
        out.append({"name": name, "plan": case, "steps": STEPS, "track_memory": "warmup", "balanced_routing": balanced})
        out.append({"name": f"bf16_{name}", "plan": in_bf16(case), "steps": BF16_STEPS, "track_memory": "off",
                    "balanced_routing": balanced})
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("moe_worlds")
    worlds = [start_world(2, _cases(MOE_TWO_RANK), tmp, "moe"), start_world(4, _cases(FOUR), tmp, "moe")]
    return collect(worlds, WORLD_TIMEOUT_S, tmp)


def reference(case: dict, steps: int, balanced: bool) -> list:
    return reference_run(plan_from_dict(copy.deepcopy(case)), RunOptions(steps=steps, seed=0, balanced_routing=balanced))


def _got(name: str, results: dict) -> dict:
    got = results.get(name)
    assert got is not None, f"{name} did not run"
    assert "error" not in got, got.get("error")
    return got


@pytest.mark.parametrize("name", sorted(ALL))
def test_moe_layout_matches_single_process(name, results):
    got, ref = _got(name, results), reference(ALL[name], STEPS, name != LEARNED)
    assert len(got["losses"]) == STEPS
    for step, (a, b) in enumerate(zip(got["losses"], ref), start=1):
        assert abs(a - b.loss) <= REL_TOL * b.loss, f"{name} step {step}: {a} vs single-process {b.loss}"
    assert abs(ref[-1].loss - ref[0].loss) > 10 * REL_TOL * ref[0].loss  # training moves the loss


@pytest.mark.parametrize("name", sorted(ALL))
def test_moe_layout_matches_single_process_bf16(name, results):
    """bf16 at BF16_NEW_ROUNDING: the grouped GEMMs run over other sets of rows than in one process (a
    rank's received tokens), which a CPU GEMM may block, and so round, differently; TP as for dense."""
    got = _got(f"bf16_{name}", results)
    ref = reference(in_bf16(ALL[name]), BF16_STEPS, name != LEARNED)
    for step, (a, b) in enumerate(zip(got["losses"], ref), start=1):
        assert abs(a - b.loss) <= BF16_NEW_ROUNDING * b.loss, f"bf16 {name} step {step}: {a} vs {b.loss}"


@pytest.mark.parametrize("name", sorted(set(ALL) - {LEARNED}))
def test_balanced_routing_figures_by_hand(name, results):
    # Every model here has 3 MoE layers (the toy Qwen3: 3 of 3; the others 3 of 4); the bias model no aux loss.
    aux_layers = 0 if name.startswith("deepseek") else MOE_LAYERS
    for tokens, imbalance, aux in _got(name, results)["routing"]:
        assert tokens == [PAIRS_PER_EXPERT] * 3
        assert imbalance == pytest.approx(1.0)
        assert aux == pytest.approx(aux_layers * 1.0, rel=1e-5)


def test_learned_router_routes_unevenly_and_matches_the_reference_counts(results):
    got = _got(LEARNED, results)
    ref = reference(ALL[LEARNED], STEPS, False)
    for (tokens, imbalance, aux), r in zip(got["routing"], ref):
        lo, mean, hi = tokens
        assert mean == pytest.approx(PAIRS_PER_EXPERT) and lo < mean < hi and imbalance > 1.0
        assert tokens == pytest.approx(list(r.routing.tokens_per_expert))  # the same choices as one process
        assert aux == 0.0  # the bias model has no aux loss


@pytest.mark.parametrize("name", sorted(ALL))
def test_moe_peak_memory_matches_cost_model(name, results):
    """Measured live-tensor peak (max over ranks) within the dense layouts' 15 % of the estimate."""
    from meshplan.cost_models.estimate import estimate_plan
    from meshplan.profiles import load_profile

    got = _got(name, results)
    measured = max(x for x in got["peak_memory_gib"] if x is not None)
    plan = plan_from_dict(copy.deepcopy(ALL[name]))
    predicted = estimate_plan(plan, load_profile(plan.cluster)).peak_memory_gib
    assert abs(measured / predicted - 1) <= MEMORY_TOLERANCE, \
        f"{name}: measured {measured * 1024:.3f} MiB vs predicted {predicted * 1024:.3f} MiB"
