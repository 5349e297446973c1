"""The cost model of a mixture-of-experts layer, against counts made here: every parameter tensor of a
one-layer MoE model sharded by hand over EP and FSDP, the tensors its layer keeps for backward summed by
hand, the dispatch and combine all-to-alls from the bytes each rank sends, and the dense first layers
priced apart from the MoE ones."""

from __future__ import annotations

import math

import pytest

from meshplan.cost_models.comm import GroupSpan, bus_factor
from meshplan.cost_models.estimate import block_times, group_spans, stage_durations
from meshplan.cost_models.layout import Layout, stage_block_kinds, stage_kinds
from meshplan.cost_models.memory import GIB, rank_memory
from meshplan.cost_models.timing import block_time, embedding_time, head_time
from meshplan.cost_models.activations import PYTORCH, activation_bytes_per_token
from meshplan.profiles.registry import load_profile
from meshplan.specs.model import ModelSpec
from meshplan.specs.registry import BUILTIN_MODELS

PROF = load_profile("h100-80g-dgx")
E, K, F, D, SHARED = 8, 2, 48, 64, 1
# One MoE block (no dense first layer), llama-style: GQA attention 4 heads / 2 KV heads of 16.
ONE_LAYER = ModelSpec.from_dict({
    "name": "one-moe-layer", "dim": D, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 128,
    "vocab_size": 256, "max_seq_len": 256,
    "moe": {"experts": E, "top_k": K, "expert_ffn_dim": F, "shared_experts": SHARED}})


def _tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Every parameter of the model as TorchTitan builds it: routed experts stacked on a leading expert dim."""
    d, kv, v = spec.dim, spec.kv_dim, spec.vocab_size
    return [("tok_embeddings", (v, d)), ("wq", (d, d)), ("wk", (kv, d)), ("wv", (kv, d)), ("wo", (d, d)),
            ("attention_norm", (d,)), ("ffn_norm", (d,)), ("router", (E, d)),
            ("experts.w1", (E, F, d)), ("experts.w2", (E, d, F)), ("experts.w3", (E, F, d)),
            ("shared.w1", (SHARED * F, d)), ("shared.w2", (d, SHARED * F)), ("shared.w3", (SHARED * F, d)),
            ("norm", (d,)), ("output", (v, d))]


def _brute_force_state_bytes(ep: int, dp_shard: int) -> float:
    """fp32 params, grads and AdamW moments (16 B per element) one rank holds: routed experts Shard(0) over
    EP, then FSDP over what is left of dp_shard (ep_fsdp); everything else FSDP over dp_shard."""
    total = 0.0
    for name, shape in _tensors(ONE_LAYER):
        n = math.prod(shape)
        total += n / (ep * (dp_shard // ep)) if name.startswith("experts.") else n / dp_shard
    return 16.0 * total


def _layout(**kw) -> Layout:
    base = dict(spec=ONE_LAYER, gpus=8, seq_len=128, global_batch=16, micro_batch=1, dtype="bf16", dp_replicate=1,
                dp_shard=8, tp=1, sp=False, async_tp=False, pp=1, schedule="1F1B", v=1, stage_layers=(1,), cp=1,
                ac="none", sac_ops=None, float8=False, reshard_after_forward=True, compile=False)
    base.update(kw)
    return Layout(**base)


@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_one_moe_layers_states_against_its_tensors(ep):
    lay = _layout(ep=ep)
    parts = rank_memory(lay, 0, 1.0, PROF.overheads).parts  # two micro-batches: gradients live at the peak
    assert parts["params"] + parts["grads"] + parts["optimizer"] == pytest.approx(_brute_force_state_bytes(ep, 8),
                                                                                  rel=1e-12)


def test_ep_cuts_the_expert_copies_fsdp_gathers():
    # Unsharded copies: two blocks in bf16 (current + prefetched) and one block's bf16 gradients; a block's
    # routed experts are E / ep of them (the root's copies are the same in both).
    full = {n: math.prod(s) for n, s in _tensors(ONE_LAYER)}
    experts = sum(v for n, v in full.items() if n.startswith("experts."))
    one, eight = (rank_memory(_layout(ep=ep), 0, 1.0, PROF.overheads).parts["fsdp_buffers"] for ep in (1, 8))
    assert one - eight == pytest.approx(3 * 2 * (experts - experts / 8), rel=1e-12)


def test_one_moe_layers_saved_tensors_by_hand():
    # bf16, no AC, tp 1, flash attention, balanced routing: bytes per token of what the block keeps.
    q, kv = D, ONE_LAYER.kv_dim
    attention = D + D + q + kv + kv + q + q  # block_in, attn norm out, q, k, v (roped), attention out, wo's input
    mlp_in = D + D  # ffn norm in and out
    router = 2 * E * 2  # fp32 logits and scores, in units of 2 bytes
    routed = K * D + K * F * 3 + K * D  # dispatched tokens, gate and up outputs, SwiGLU product, expert outputs
    shared = 3 * SHARED * F  # gate, up and their product
    by_hand = 2.0 * (attention + mlp_in + router + routed + shared)
    assert activation_bytes_per_token(ONE_LAYER, 128, 1, False, "none", None, 2.0, PYTORCH, 0) == by_hand


def test_imbalance_scales_the_busiest_ranks_routed_tensors_under_ep_only():
    def kept(ep: int, imbalance: float) -> float:
        return activation_bytes_per_token(ONE_LAYER, 128, 1, False, "none", None, 2.0, PYTORCH, 0, ep, imbalance)

    routed = 2.0 * (K * D + K * F * 3 + K * D)
    assert kept(8, 1.5) - kept(8, 1.0) == pytest.approx(0.5 * routed, rel=1e-12)
    assert kept(1, 1.5) == kept(1, 1.0)  # every expert local: a rank runs all of its pairs whatever the router does


def test_dispatch_and_combine_all_to_alls_by_hand():
    # One micro-batch of 128 tokens per rank, top-2, ep 8 inside one node: each all-to-all moves a hidden
    # vector (bf16) per token-expert pair, (ep - 1) / ep of it off the rank; dispatch + combine in the
    # forward and again in the backward, at the profile's NVLink all-to-all bus bandwidth and latency.
    lay = _layout(ep=8, moe_imbalance=1.0)
    bt = block_time(lay, PROF, group_spans(lay, PROF), 0)
    payload = 128 * K * D * 2.0
    line = PROF.collectives[PROF.node_level()]["all_to_all"]
    bw, lat = line.line_for(payload)
    one = lat * 1e-6 + bus_factor("all_to_all", 8) * payload / (bw * 1e9)
    assert bt.ep_comm_issued == pytest.approx(4 * one, rel=1e-12)
    assert bt.ep_comm == bt.ep_comm_issued  # not overlapped (TorchTitan's all-to-alls are synchronous)
    assert block_time(_layout(ep=1), PROF, group_spans(_layout(ep=1), PROF), 0).ep_comm == 0.0


def test_megatron_ep_overlap_leaves_what_exceeds_the_blocks_compute():
    """Megatron-Core's EP overlap hides a micro-batch's all-to-alls under another's compute: in the paired
    passes what exceeds forward + backward + weight gradient stays exposed, at least 0, and in the unpaired
    ones (without a pipeline, the first forward and the last backward) all of it: 16 sequences over 8 ranks
    are 2 micro-batches, half of each direction's passes unpaired; nothing is paired with one micro-batch.
    On Megatron's stack (host_counted False: its host work is not priced, so its kernels are the passes)."""
    hidden = []
    for seq in (128, 4096):
        lay = _layout(ep=8, seq_len=seq, ep_overlap=True, host_counted=False)
        plain = block_time(lay.with_(ep_overlap=False), PROF, group_spans(lay, PROF), 0)
        bt = block_time(lay, PROF, group_spans(lay, PROF), 0)
        compute = plain.forward + plain.backward_input + plain.backward_weight
        issued = plain.ep_comm_issued
        assert bt.ep_comm_issued == issued == plain.ep_comm
        assert bt.ep_comm == pytest.approx(issued / 2 + max(0.0, issued - compute) / 2, rel=1e-12, abs=1e-15)
        hidden.append(bt.ep_comm == pytest.approx(issued / 2, rel=1e-12))
    assert hidden == [False, True]  # 128 tokens: latency-bound sends outlast the tiny matmuls; 4096: hidden
    one = _layout(ep=8, ep_overlap=True, global_batch=8)  # one micro-batch per rank: no second to pair with
    assert one.n_micro == 1
    bt = block_time(one, PROF, group_spans(one, PROF), 0)
    assert bt.ep_comm == bt.ep_comm_issued > 0


def test_megatron_shared_expert_overlap_leaves_what_each_all_to_all_exceeds_its_shared_matmuls():
    """Megatron-Core's shared-expert overlap runs the shared expert's gate and up projections beside the dispatch
    and its down projection beside the combine, and each one's input and weight gradients beside the same
    all-to-all's backward. By hand from the profile: the forward all-to-all time split evenly between dispatch
    and combine (same bytes each way), the shared matmuls timed at their shapes. At 128 tokens the latency-bound
    sends outlast the toy matmuls, in both directions; at 4096 tokens of a wide shared expert nothing is left."""
    from meshplan.cost_models.compute import matmul_time

    dev, eff = PROF.device, PROF.overheads.kernel_efficiency
    lay = _layout(ep=8, shared_expert_overlap=True, host_counted=False)
    plain = block_time(lay.with_(shared_expert_overlap=False), PROF, group_spans(lay, PROF), 0)
    bt = block_time(lay, PROF, group_spans(lay, PROF), 0)
    half = plain.ep_comm_issued / 4  # forward dispatch (or combine): a quarter of the two passes' four sends
    fc1 = 2 * matmul_time(dev, 128, SHARED * F, D, "bf16") / eff  # gate and up: 128 tokens, D -> F
    fc2 = matmul_time(dev, 128, D, SHARED * F, "bf16") / eff
    by_hand = (max(0.0, half - fc1) + max(0.0, half - fc2)) + (max(0.0, half - 2 * fc1) + max(0.0, half - 2 * fc2))
    assert bt.ep_comm_issued == plain.ep_comm_issued == plain.ep_comm
    assert bt.ep_comm == pytest.approx(by_hand, rel=1e-12)
    assert 0.0 < bt.ep_comm < plain.ep_comm
    assert bt.forward == plain.forward and bt.backward_input == plain.backward_input  # the same kernels, moved
    wide = ModelSpec.from_dict({**ONE_LAYER.to_dict(), "name": "wide-shared",
                                "moe": {"experts": E, "top_k": K, "expert_ffn_dim": F, "shared_experts": 64}})
    big = _layout(spec=wide, ep=8, seq_len=4096, shared_expert_overlap=True, host_counted=False)
    assert block_time(big, PROF, group_spans(big, PROF), 0).ep_comm == 0.0


def test_hidden_all_to_alls_slow_the_compute_only_under_the_every_form():
    """forms.py overlap_contention: under every, the all-to-alls EP overlap hides cost comm_compute_slowdown
    times their hidden time (one node: their kernels' work at the node level's rate is all of it); under
    data_parallel, the shipped form, nothing. Two micro-batches: half the passes unpaired, their all-to-alls
    in line, the other half hidden."""
    from meshplan.cost_models import forms

    lay = _layout(ep=8, seq_len=4096, ep_overlap=True, host_counted=False)
    spans = group_spans(lay, PROF)
    shipped = block_time(lay, PROF, spans, 0)
    issued = shipped.ep_comm_issued
    assert shipped.ep_comm == pytest.approx(issued / 2, rel=1e-12)  # the paired half hidden (the test above)
    with forms.forms(overlap_contention="every"):
        every = block_time(lay, PROF, spans, 0)
    assert every.ep_comm == pytest.approx((1 + PROF.overheads.comm_compute_slowdown) * issued / 2, rel=1e-12)
    assert PROF.overheads.comm_compute_slowdown == pytest.approx(0.189)  # Lee et al., the mean slowdown


def test_the_block_memo_tells_apart_what_the_block_time_reads():
    """stage_inputs memoises block times on the profile by block_key: two layouts that differ only in a field
    the block time reads must not share an entry. A clamped expert run eagerly or under the op fuser, and
    attention in bf16 or MXFP8, are priced apart through the memo as without it."""
    from dataclasses import replace

    from meshplan.cost_models.estimate import block_key, stage_inputs

    spec = replace(ONE_LAYER, moe=replace(ONE_LAYER.moe, activation_clamp=7.0))
    eager = _layout(spec=spec, elementwise_kernels="megatron", ep=8, host_counted=False)
    prof = load_profile("gb200-186g-nvl72")  # a profile with MXFP8 attention points
    for field, value in (("moe_fused_mlp", True), ("attention_dtype", "mxfp8"), ("host_counted", True),
                         ("host_ahead", False), ("norm_fp32", True)):
        other = eager.with_(**{field: value})
        spans = group_spans(eager, prof)
        assert block_key(eager, spans) != block_key(other, spans), field
    fused = eager.with_(moe_fused_mlp=True)
    memo = {lay.moe_fused_mlp: stage_inputs(lay, prof)[1][0].forward for lay in (eager, fused)}
    assert memo[True] < memo[False]
    assert memo[True] == pytest.approx(block_time(fused, prof, group_spans(fused, prof), 0).forward, rel=1e-12)


def test_megatron_bridge_rows_overlap_where_their_recipes_did():
    """docs/sources/megatron-bridge-moe-recipes.md: the 26.06+ GB200 MXFP8 recipes (full iteration) and three
    earlier rows, and the model zoo's 4k MXFP8 command (A2A_OVERLAP=1); every other row issues its
    all-to-alls in line."""
    from meshplan.cost_models.published import moe_blackwell_rows

    overlapped = {r.label.rsplit("(", 1)[1].rstrip(")") for r in moe_blackwell_rows() if r.plan.parallel.ep_overlap}
    assert "mb-26.06-qwen3-30b-gb200-8g-mxfp8-gbs512" in overlapped
    assert "mb-26.08-dsv3-gb200-256g-mxfp8-gbs4096" in overlapped
    assert "mb-26.04.01-dsv3-b200-256g-mxfp8-gbs4096" in overlapped
    assert "mb-26.04.01-qwen3-30b-gb200-8g-mxfp8-gbs512" not in overlapped  # per-layer graphs, in-line all-to-alls
    assert "mb-25.11-qwen3-235b-gb200-256g-bf16-gbs8192" not in overlapped
    assert not any(i.startswith("mlm-") for i in overlapped)
    assert {i for i in overlapped if i.startswith("mz-")} == {"mz-qwen3-235b-gb200-256g-mxfp8"}


def test_the_moe_rows_overlap_their_shared_experts_where_their_recipes_did():
    """Megatron-Bridge's DeepSeek provider turns the shared-expert overlap on and its flex dispatchers turn it
    off (HybridEP on GB200 from v0.2.0, on B200 from v0.3.0; DeepEP), leaving the 25.11 B200 row's alltoall
    dispatcher; Qwen2-57B-A14B's yaml sets --moe-shared-expert-overlap (model zoo at 78fd4d6). No other
    row's model has shared experts, and no row overlaps both ways."""
    from meshplan.cost_models.published import moe_blackwell_rows, moe_h100_rows

    rows = [r for r in moe_blackwell_rows() + moe_h100_rows() if not r.skipped]
    on = {r.label.rsplit("(", 1)[1].rstrip(")") for r in rows if r.plan.parallel.shared_expert_overlap}
    assert {i for i in on if i.startswith("mb-")} == {"mb-25.11-dsv3-b200-256g-fp8-mx-gbs2048-mtp"}
    qwen2 = {r.label.rsplit("(", 1)[1].rstrip(")") for r in rows if r.plan.model.name == "qwen2-57b-a14b"}
    assert len(qwen2) == 6 and qwen2 <= on
    assert on - qwen2 == {"mb-25.11-dsv3-b200-256g-fp8-mx-gbs2048-mtp"}
    assert not any(r.plan.parallel.shared_expert_overlap and r.plan.parallel.ep_overlap for r in rows)


def test_all_to_all_across_nodes_goes_through_each_ranks_own_nic():
    from meshplan.cost_models.comm import collective_time

    net = PROF.collectives[PROF.cluster_level()]["all_to_all"]
    payload = 1e9
    bw, lat = net.line_for(payload)
    # 64 ranks, 8 per node: 56/64 of each rank's buffer leaves its node through its NIC.
    assert collective_time(PROF, "all_to_all", payload, GroupSpan(64, 8)) == pytest.approx(
        lat * 1e-6 + 56 / 64 * payload / (bw * 1e9), rel=1e-12)


def _remote_nodes_by_enumeration(experts: int, top_k: int, nodes: int) -> float:
    """Every top-k choice of experts equally likely, experts e on node e // (experts / nodes): the mean
    number of nodes other than node 0 that a token of node 0 reaches."""
    from itertools import combinations

    per_node = experts // nodes
    counts = [len({e // per_node for e in pick} - {0}) for pick in combinations(range(experts), top_k)]
    return sum(counts) / len(counts)


@pytest.mark.parametrize("experts,top_k,nodes", [(8, 2, 2), (16, 4, 4), (12, 3, 3), (16, 1, 4)])
def test_remote_nodes_per_token_against_an_enumeration(experts, top_k, nodes):
    from meshplan.cost_models.moe import remote_nodes_per_token

    assert remote_nodes_per_token(experts, top_k, nodes) == pytest.approx(
        _remote_nodes_by_enumeration(experts, top_k, nodes), rel=1e-12)
    # Never more than the copies an undeduplicated all-to-all sends across nodes; as many with top-1.
    assert remote_nodes_per_token(experts, top_k, nodes) <= top_k * (nodes - 1) / nodes + 1e-12
    assert remote_nodes_per_token(experts, 1, nodes) == pytest.approx((nodes - 1) / nodes, rel=1e-12)
    assert remote_nodes_per_token(experts, top_k, 1) == 0.0


def test_deepep_sends_a_token_across_the_network_once_per_destination_node():
    """DeepSeek-V3 (256 experts, top-8), EP 32 over four 8-GPU nodes, one micro-batch of 4096 tokens: each
    token reaches 3 x (1 - C(192, 8) / C(256, 8)) = 2.71 other nodes on average, against 8 x 24/32 = 6
    copies through NCCL's all-to-all; the NVLink stage forwards 7/8 of the pairs. Dispatch + combine of
    one forward, by hand from the profile's lines. Routed ungrouped here (its group limit: the next tests)."""
    from dataclasses import replace

    from meshplan.cost_models.moe import ep_comm_forward, routing

    grouped = BUILTIN_MODELS["deepseek-v3"]
    spec = replace(grouped, moe=replace(grouped.moe, expert_groups=1, groups_per_token=1))
    r = routing(spec, 4096, tp=1, ep=32, imbalance=1.0)
    span = GroupSpan(32, 8)
    pairs_bytes = 4096 * 8 * spec.dim * 2.0
    remote = 3 * (1 - math.comb(192, 8) / math.comb(256, 8))
    assert remote == pytest.approx(2.7107, abs=1e-4)
    net_bw, net_lat = PROF.collectives[PROF.cluster_level()]["all_to_all"].line_for(pairs_bytes * remote / 8)
    node_bw, node_lat = PROF.collectives[PROF.node_level()]["all_to_all"].line_for(pairs_bytes * 7 / 8)
    one = (net_lat + node_lat) * 1e-6 + max(pairs_bytes * remote / 8 / (net_bw * 1e9),
                                            pairs_bytes * 7 / 8 / (node_bw * 1e9))
    dedup = ep_comm_forward(spec, r, 32, 2.0, PROF, span, "deepep")
    assert dedup == pytest.approx(2 * one, rel=1e-12)
    plain = ep_comm_forward(spec, r, 32, 2.0, PROF, span)
    assert plain / dedup == pytest.approx(6 / remote, rel=0.02)  # network-bound: the copies' ratio, up to latencies
    # Inside one node there is nothing to deduplicate.
    inside = GroupSpan(8, 8)
    r8 = routing(spec, 4096, tp=1, ep=8, imbalance=1.0)
    assert ep_comm_forward(spec, r8, 8, 2.0, PROF, inside, "deepep") == ep_comm_forward(spec, r8, 8, 2.0, PROF,
                                                                                            inside)


def _grouped_routing_by_hand(experts: int, top_k: int, nodes: int, groups: int, per_token: int,
                             tokens: int = 4000) -> float:
    """Megatron-Core's group_limited_topk written out token by token over its force-balanced logits
    (standard normal, sigmoid scores), with Python's own generator: the other nodes a token of node 0 reaches."""
    import random

    rng = random.Random(1)
    size, best, per_node = experts // groups, max(1, top_k // per_token), experts // nodes
    total = 0
    for _ in range(tokens):
        scores = [1.0 / (1.0 + math.exp(-rng.gauss(0.0, 1.0))) for _ in range(experts)]
        rank = sorted(range(groups), key=lambda g: -sum(sorted(scores[g * size:(g + 1) * size])[-best:]))
        allowed = [e for g in rank[:per_token] for e in range(g * size, (g + 1) * size)]
        picked = sorted(allowed, key=lambda e: -scores[e])[:top_k]
        total += len({e // per_node for e in picked} - {0})
    return total / tokens


@pytest.mark.parametrize("experts,top_k,nodes,groups,per_token",
                         [(16, 4, 4, 4, 2), (16, 4, 2, 4, 1), (16, 4, 8, 4, 2), (32, 8, 4, 8, 4)])
def test_group_limited_routing_reaches_the_nodes_a_token_by_token_routing_reaches(experts, top_k, nodes, groups,
                                                                                  per_token):
    """The sampled count (numpy, 8192 tokens) against the same rule written out per token in plain Python
    (4000 tokens of another generator): within their joint sampling error."""
    from meshplan.cost_models.moe import remote_nodes_per_token

    got = remote_nodes_per_token(experts, top_k, nodes, groups, per_token)
    assert got == pytest.approx(_grouped_routing_by_hand(experts, top_k, nodes, groups, per_token), rel=0.04)
    # Limiting the groups never reaches more nodes than routing among every expert.
    assert got <= remote_nodes_per_token(experts, top_k, nodes) + 1e-9


def test_group_limited_routing_over_nodes_that_do_not_divide_the_experts():
    """A 64-rank group straddling three hosts (estimate.group_spans' hosts) holds 256 experts unevenly: the
    count stays a count of other nodes, below the ungrouped one, and is not an index past the last node."""
    from meshplan.cost_models.moe import remote_nodes_per_token

    got = remote_nodes_per_token(256, 8, 3, 8, 4)
    assert 0.0 < got <= remote_nodes_per_token(256, 8, 3) + 1e-9 <= 2.0


def test_group_limited_routing_is_bounded_by_the_groups_a_token_may_use():
    """DeepSeek-V3 over 8 nodes, one group each: a token reaches at most the 4 nodes of its 4 groups,
    3.5 other nodes on average if every picked group kept one of its experts (7 x (1 - C(7,4)/C(8,4))), a
    little fewer as some do not; ungrouped, 7 x (1 - C(224,8)/C(256,8)) = 4.63. Picking among every group
    is ungrouped routing, the sample agreeing with the closed form."""
    from meshplan.cost_models.moe import grouped_remote_nodes, remote_nodes_per_token

    grouped = remote_nodes_per_token(256, 8, 8, 8, 4)
    assert 3.3 < grouped < 3.5
    assert remote_nodes_per_token(256, 8, 8) == pytest.approx(7 * (1 - math.comb(224, 8) / math.comb(256, 8)))
    assert remote_nodes_per_token(256, 8, 8, 8, 8) == remote_nodes_per_token(256, 8, 8)
    assert grouped_remote_nodes(256, 8, 8, 8, 8, "sigmoid") == pytest.approx(remote_nodes_per_token(256, 8, 8),
                                                                              rel=0.01)


def test_deepep_sends_deepseek_v3s_tokens_to_the_nodes_of_its_groups():
    """The built-in DeepSeek-V3 routes among 4 of 8 groups: DeepEP's network stage over 8 nodes carries
    that many node copies of each token; NCCL's all-to-all, which sends every pair, is unchanged."""
    from dataclasses import replace

    from meshplan.cost_models.moe import ep_comm_forward, remote_nodes_per_token, routing

    spec = BUILTIN_MODELS["deepseek-v3"]
    assert (spec.moe.expert_groups, spec.moe.groups_per_token) == (8, 4)
    ungrouped = replace(spec, moe=replace(spec.moe, expert_groups=1, groups_per_token=1))
    r = routing(spec, 4096, tp=1, ep=64, imbalance=1.0)
    span = GroupSpan(64, 8)
    pairs_bytes = 4096 * 8 * spec.dim * 2.0
    remote = remote_nodes_per_token(256, 8, 8, 8, 4)
    net_bw, net_lat = PROF.collectives[PROF.cluster_level()]["all_to_all"].line_for(pairs_bytes * remote / 8)
    node_bw, node_lat = PROF.collectives[PROF.node_level()]["all_to_all"].line_for(pairs_bytes * 7 / 8)
    one = (net_lat + node_lat) * 1e-6 + max(pairs_bytes * remote / 8 / (net_bw * 1e9),
                                            pairs_bytes * 7 / 8 / (node_bw * 1e9))
    assert ep_comm_forward(spec, r, 64, 2.0, PROF, span, "deepep") == pytest.approx(2 * one, rel=1e-12)
    assert ep_comm_forward(spec, r, 64, 2.0, PROF, span) == ep_comm_forward(ungrouped, r, 64, 2.0, PROF, span)


def test_the_moe_rows_keep_their_optimizer_states_as_their_recipes_do():
    """Megatron-Bridge's DeepSeek-V3 recipe keeps AdamW's moments and the main gradients in bf16, the model zoo's
    MXFP8 runs and Megatron-LM's notes the moments alone; every other MoE row fp32 (published.optimizer_precision)."""
    from meshplan.cost_models.published import moe_blackwell_rows

    kept = {}
    for r in moe_blackwell_rows():
        m = r.plan.memory
        kept.setdefault((m.optimizer_state_dtype, m.main_grads_dtype), set()).add(r.label.rsplit("(", 1)[1][:-1])
    assert all(i.startswith("mb-") and "dsv3" in i for i in kept[("bf16", "bf16")])
    assert len(kept[("bf16", "bf16")]) == 18  # every DeepSeek-V3 row of the pages, the left-out ones too
    assert kept[("bf16", None)] == {"mz-qwen3-235b-gb200-256g-mxfp8", "mz-qwen3-235b-gb200-128g-mxfp8-seq128k",
                                    "mlm-dsv3-gb200-256g-mxfp8-baseline", "mlm-dsv3-gb200-256g-mxfp8-final"}
    assert not any("dsv3" in i for i in kept[(None, None)])


def test_the_deepep_row_of_megatron_bridge_deduplicates_and_the_others_do_not():
    """docs/sources/megatron-bridge-moe-recipes.md: DeepSeek-V3 on B200 in 26.04.01 ran DeepEP at EP 32."""
    from meshplan.cost_models.published import moe_blackwell_rows

    dedup = {r.label.rsplit("(", 1)[1].rstrip(")") for r in moe_blackwell_rows()
             if r.plan.parallel.ep_dispatch == "deepep"}
    assert dedup == {"mb-26.04.01-dsv3-b200-256g-mxfp8-gbs4096"}


def test_dense_first_layers_are_priced_apart():
    spec = BUILTIN_MODELS["tiny-moe"]  # 4 layers, the first dense
    assert stage_block_kinds(spec, (2, 2)) == (((0, 1), (1, 1)), ((1, 2),))
    # An MTP module is one more block of the last layer's kind (MoE), on the last stage only.
    assert stage_kinds(spec, (2, 2), mtp=1) == (((0, 1), (1, 1)), ((1, 3),))
    assert stage_kinds(spec, (4,), mtp=2) == (((0, 1), (1, 5)),)
    lay = _layout(spec=spec, stage_layers=(2, 2), pp=2, gpus=8, dp_shard=4, global_batch=8)
    spans = group_spans(lay, PROF)
    bts = block_times(lay, PROF, spans)
    assert set(bts) == {0, 1} and bts[0].forward != bts[1].forward
    head, emb = head_time(lay, PROF), embedding_time(lay, PROF)
    d = stage_durations(lay, PROF, spans, bts, head, emb)
    # The first stage: one dense block, one MoE block and the embedding; the last: two MoE blocks and the head.
    act = d.forward[0] - (bts[0].forward_with_comm + bts[1].forward_with_comm + emb)
    assert d.forward[1] == pytest.approx(2 * bts[1].forward_with_comm + head.forward + act, rel=1e-12)


def test_an_mtp_module_runs_on_the_last_stage_as_a_last_block_a_projection_and_a_head():
    """tiny-moe (4 layers, the last MoE, dim 64) on 2 stages with one MTP module (Layout.mtp_layers): the last
    stage gains a block of the last layer's kind, the module's projection of 2 x 64 -> 64 (its forward, and
    its input and weight gradients) and a second head; the first stage nothing. Memory: one more MoE
    block's parameters, the projection's 2 x 64 x 64 weights, three 64-wide norms and a copy of the
    embedding (vocab x 64) on the last rank."""
    from meshplan.cost_models.compute import matmul_time
    from meshplan.cost_models.estimate import estimate_layout
    from meshplan.cost_models.memory import stage_params

    spec = BUILTIN_MODELS["tiny-moe"]
    base = _layout(spec=spec, stage_layers=(2, 2), pp=2, gpus=8, dp_shard=4, global_batch=8)
    mtp = base.with_(mtp_layers=1)
    spans = group_spans(base, PROF)
    bts = block_times(base, PROF, spans)
    head, emb = head_time(base, PROF), embedding_time(base, PROF)
    d0, d1 = (stage_durations(lay, PROF, spans, bts, head, emb) for lay in (base, mtp))
    last = bts[1]  # layer 3's kind: an MoE block, represented by layer 1
    proj = matmul_time(PROF.device, base.tokens_per_micro, 64, 128, "bf16")
    assert d1.forward[0] == d0.forward[0] and d1.backward[0] == d0.backward[0] and d1.weight[0] == d0.weight[0]
    assert d1.forward[1] - d0.forward[1] == pytest.approx(last.forward_with_comm + proj + head.forward, rel=1e-12)
    assert d1.backward[1] - d0.backward[1] == pytest.approx(last.backward_input_with_comm + proj + head.backward,
                                                            rel=1e-12)
    assert d1.weight[1] - d0.weight[1] == pytest.approx(last.backward_weight + proj, rel=1e-12)
    p0, p1 = stage_params(base, 1), stage_params(mtp, 1)
    moe_block = stage_params(base.with_(stage_layers=(3, 1)), 1).blocks  # the last stage holding one MoE block
    assert p1.blocks - p0.blocks == pytest.approx(moe_block, rel=1e-12)
    # ... and the embedding the module looks the next tokens up in, a copy on the last stage.
    assert p1.head - p0.head == 2 * 64 * 64 + 3 * 64 + spec.vocab_size * 64
    assert stage_params(mtp, 0) == stage_params(base, 0)
    # The step's breakdown still adds up to the step, the module's time in it.
    est0, est1 = estimate_layout(base, PROF), estimate_layout(mtp, PROF)
    assert sum(est1.time_s.values()) == pytest.approx(est1.step_time_s, rel=1e-9)
    assert est1.step_time_s > est0.step_time_s


def test_megatron_bridge_lays_out_deepseek_v3_as_its_recipes_do():
    """recipes/deepseek/deepseek_v3.py's map: the embedding with the first stage's layers, the MTP module and
    the loss with the last's; 61 layers in all. The 25.11 page prints w/ or w/o MTP; from 26.02 the recipes'
    mtp_num_layers 1 ran. Megatron-LM's notes print Et|(tt|)*30L."""
    from meshplan.cost_models.published import moe_blackwell_rows

    rows = {r.label.rsplit("(", 1)[1].rstrip(")"): r for r in moe_blackwell_rows() if "DeepSeek-V3" in r.label}
    layers = lambda i: rows[i].plan.parallel.pp_layers
    assert layers("mb-26.08-dsv3-gb200-256g-mxfp8-gbs4096") == [4] * 15 + [1]  # PP4 VP4
    assert layers("mb-26.04.01-dsv3-b200-256g-mxfp8-gbs4096") == [4] * 15 + [1]  # PP8 VP2
    assert layers("mb-26.04-dsv3-b200-256g-mxfp8-gbs4096") == [4] * 15 + [1]  # PP16
    assert layers("mb-25.11-dsv3-gb200-256g-fp8-mx-gbs4096-nomtp") is None  # PP8 VP4: not in the map
    assert layers("mlm-dsv3-gb200-256g-mxfp8-final") == [1] + [2] * 30 + [0]
    assert all(sum(layers(i)) == 61 for i in rows if layers(i))
    mtp = {i for i, r in rows.items() if r.plan.training.mtp_layers == 1}
    assert "mb-25.11-dsv3-b200-256g-fp8-mx-gbs2048-mtp" in mtp and "mb-26.08-dsv3-gb200-256g-mxfp8-gbs4096" in mtp
    assert not {i for i in mtp if i.endswith("-nomtp") or i.startswith("mlm-")}
    assert all(r.plan.training.mtp_layers == 0 for r in moe_blackwell_rows() if "DeepSeek-V3" not in r.label)


def test_state_memory_in_gib_matches_the_estimate():
    from meshplan.cost_models.estimate import estimate_layout

    est = estimate_layout(_layout(ep=4), PROF)
    gib = est.memory_gib
    assert (gib["params"] + gib["grads"] + gib["optimizer"]) * GIB == pytest.approx(_brute_force_state_bytes(4, 8),
                                                                                    rel=1e-9)


def test_routed_experts_are_gathered_and_reduced_over_their_own_fsdp_group():
    """ep 4 of dp_shard 8 in one node: the routed experts' FSDP group (ep_fsdp) is 2 ranks, the rest's 8.
    One MoE block plus the root: each collective's bytes by hand, the routed ones over the 2-rank group."""
    from meshplan.cost_models.estimate import ComputeWindows, data_parallel_comm

    lay = _layout(ep=4, global_batch=8)  # one micro-batch per rank: gathered twice (forward, backward), reduced once
    full = {n: math.prod(s) for n, s in _tensors(ONE_LAYER)}
    routed = sum(v for n, v in full.items() if n.startswith("experts.")) / 4  # this rank's 2 of 8 experts
    rest = sum(v for n, v in full.items() if not n.startswith("experts."))
    c = data_parallel_comm(lay, PROF, group_spans(lay, PROF), 0, ComputeWindows(0.0))
    eight, two = GroupSpan(8, 8), GroupSpan(2, 2)
    from meshplan.cost_models.comm import collective_time

    gather = 2 * (collective_time(PROF, "all_gather", rest * 2.0, eight, calls=2)
                  + collective_time(PROF, "all_gather", routed * 2.0, two, calls=1))
    reduce = (collective_time(PROF, "reduce_scatter", rest * 4.0, eight, calls=2)
              + collective_time(PROF, "reduce_scatter", routed * 4.0, two, calls=1))
    assert c.all_gather == pytest.approx(gather, rel=1e-12)
    assert c.reduce_scatter == pytest.approx(reduce, rel=1e-12)


def test_megatron_cores_eager_clamp_and_expert_bias_by_hand():
    """GPT-OSS's experts under Megatron-Core: the clamp before the fused GLU (8 passes over each half of
    fc1's output forward, 10 backward) and the down projection's bias added outside Transformer Engine
    (6 passes over dim forward, 8 backward), per routed pair, in bf16; none where the op fuser fuses them,
    and none for an unclamped, unbiased expert."""
    from dataclasses import replace

    from meshplan.cost_models.compute import memory_bound_time
    from meshplan.cost_models.timing import elementwise_times

    plain = _layout(elementwise_kernels="megatron")
    spec = replace(ONE_LAYER, moe=replace(ONE_LAYER.moe, bias=True, activation_clamp=7.0))
    gpt_oss = plain.with_(spec=spec)
    tokens = 128  # seq 128, micro-batch 1; no EP: every pair of the rank's tokens runs here
    fwd = tokens * K * (8 * F + 6 * D) * 2.0
    bwd = tokens * K * (10 * F + 8 * D) * 2.0
    base, got = elementwise_times(plain, PROF), elementwise_times(gpt_oss, PROF)
    assert got[0] - base[0] == pytest.approx(memory_bound_time(PROF.device, fwd), rel=1e-9)
    assert got[1] - base[1] == pytest.approx(memory_bound_time(PROF.device, bwd), rel=1e-9)
    assert elementwise_times(gpt_oss.with_(moe_fused_mlp=True), PROF) == pytest.approx(base, rel=1e-12)
    # Clamp alone: its passes only.
    clamped = plain.with_(spec=replace(ONE_LAYER, moe=replace(ONE_LAYER.moe, activation_clamp=7.0)))
    assert elementwise_times(clamped, PROF)[1] - base[1] == pytest.approx(
        memory_bound_time(PROF.device, tokens * K * 10 * F * 2.0), rel=1e-9)


def test_gpt_oss_rows_price_the_eager_expert_passes_where_their_recipes_ran_them():
    """Megatron-Bridge's BF16 GPT-OSS recipes run Megatron-Core's eager clamp and expert bias; its
    full-iteration MXFP8 recipes turn Transformer Engine's op fuser on (use_transformer_engine_op_fuser)."""
    from meshplan.cost_models.published import moe_blackwell_rows

    rows = {r.label.split("(")[-1].rstrip(")"): r for r in moe_blackwell_rows() if "GPT-OSS" in r.label}
    assert rows["mb-26.06-gptoss120b-gb200-64g-mxfp8-gbs1280"].layout_overrides["moe_fused_mlp"]
    assert not rows["mb-26.04.01-gptoss120b-gb200-64g-bf16-gbs1280"].layout_overrides["moe_fused_mlp"]
