"""A mixture-of-experts layer's costs in one place: how tokens are routed on a rank, its grouped expert
GEMMs, the dispatch and combine all-to-alls, the routed experts' parameters per rank, and the tensors
it keeps for backward.

How the layer runs (TorchTitan's expert parallelism, expert-TP 1; specs/rules.ep_reason):
- ep = 1: every rank holds every routed expert, TP-sharded like the dense MLP (each TP rank runs all of
  its micro-batch's tokens through its slice of each expert); no all-to-all.
- ep > 1: each rank holds experts / ep whole experts. It dispatches its sequence-parallel share of
  the micro-batch (tokens / tp) to the ranks holding their top-k experts (one all-to-all), runs the
  tokens it receives through its local experts as one grouped GEMM, and combines them back (one
  all-to-all); backward repeats both. Balanced routing gives each rank as many token-expert pairs as
  it dispatched; the busiest rank runs `imbalance` times that.
- Shared experts and the router run on every token like the dense MLP (TP-sharded).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from meshplan.cost_models.comm import GroupSpan, collective_time, forwarded_all_to_all_time
from meshplan.cost_models.compute import grouped_matmul_time
from meshplan.cost_models.saved_tensor import ActivationTensor
from meshplan.profiles.schema import ClusterProfile
from meshplan.specs.model import ModelSpec
from meshplan.specs.rules import expert_tp


@dataclass(frozen=True)
class Routing:
    """One micro-batch through one MoE layer on the busiest rank of its EP group."""

    dispatched: float  # tokens this rank routes (its share of the micro-batch)
    pairs: float  # token-expert pairs its local experts run (imbalance included)
    local_experts: int
    width: int  # FFN width of a local expert on this rank (expert_ffn_dim / expert TP)

    @property
    def tokens_per_expert(self) -> float:
        return self.pairs / self.local_experts


def pairs_per_token(spec: ModelSpec, ep: int, imbalance: float) -> float:
    """Token-expert pairs the busiest rank runs per token it dispatches. Imbalance binds only under EP:
    with every expert local, a rank runs all of its tokens' pairs however the router spreads them."""
    return spec.moe.top_k * (imbalance if ep > 1 else 1.0)


def dispatched_share(tp: int, ep: int) -> float:
    """The share of its micro-batch's tokens a rank routes: under EP each TP rank dispatches its 1/tp of the
    sequence-sharded tokens; without EP every rank runs them all."""
    return 1.0 if ep == 1 else 1.0 / tp


def routing(spec: ModelSpec, tokens: float, tp: int, ep: int, imbalance: float) -> Routing:
    """`tokens`: the micro-batch's tokens on one rank (after CP)."""
    moe = spec.moe
    dispatched = tokens * dispatched_share(tp, ep)
    return Routing(dispatched, dispatched * pairs_per_token(spec, ep, imbalance), moe.experts // ep,
                   moe.expert_ffn_dim // expert_tp(ep, tp))


def routed_expert_times(spec: ModelSpec, r: Routing, prof: ClusterProfile, dtype: str) -> dict[str, float]:
    """Forward seconds of the local experts' grouped GEMMs by matmul kind: gate and up (dim -> width) and
    down (width -> dim), each expert over the tokens routed to it, at the grouped GEMM's rate for that many
    tokens per expert (compute.grouped_matmul_time: measured where the profile has grouped points, else
    each expert as a matmul of its shape, thin groups falling to the memory roofline)."""
    d, m, w = spec.dim, r.tokens_per_expert, r.width
    n = r.local_experts
    return {"expert_in": n * 2 * grouped_matmul_time(prof.device, n, m, w, d, dtype),
            "expert_out": n * grouped_matmul_time(prof.device, n, m, d, w, dtype)}


def dispatch_bytes(spec: ModelSpec, r: Routing, act_bytes: float) -> float:
    """One all-to-all's payload on the busiest rank: a hidden vector per token-expert pair it receives
    (tokens travel in the compute dtype; float8 dispatch is not modelled)."""
    return r.pairs * spec.dim * act_bytes


def ep_comm_forward(spec: ModelSpec, r: Routing, ep: int, act_bytes: float, prof: ClusterProfile,
                    span: GroupSpan, dispatch: str = "all_to_all") -> float:
    """Dispatch and combine of one forward (0 without EP), as the stack sends them (Layout.ep_dispatch):
    all_to_all: NCCL's all-to-all, every token-expert pair to its expert's rank (collective_time);
    deepep: DeepEP's normal kernels, where a token crosses the network once to each other node holding
    one of its experts and is forwarded over the node level from there (the combine reduces inside the
    node first, the same bytes back); on one node both are the node level's all-to-all. Whether they run
    under compute is ep_exposed's question (timing.py)."""
    if ep == 1:
        return 0.0
    payload = dispatch_bytes(spec, r, act_bytes)
    if dispatch == "deepep" and span.nodes > 1:
        moe = spec.moe
        network = payload * remote_nodes_per_token(moe.experts, moe.top_k, span.nodes, moe.expert_groups,
                                                   moe.groups_per_token, moe.router) / moe.top_k
        node = payload * (span.ranks_per_node - 1) / span.ranks_per_node
        return 2 * forwarded_all_to_all_time(prof, network, node)
    return 2 * collective_time(prof, "all_to_all", payload, span)


def remote_nodes_per_token(experts: int, top_k: int, nodes: int, groups: int = 1, per_token: int = 1,
                           router: str = "sigmoid") -> float:
    """Nodes other than its own that a token's top-k experts lie on, on average, with the experts spread
    evenly over the EP group's nodes in order and chosen as force-balanced routing chooses them (random
    logits). Without deduplication a token sends top_k x (nodes - 1) / nodes copies across nodes instead.

    Ungrouped, each other node holds experts / nodes of them and is missed with probability
    C(experts - experts/nodes, k) / C(experts, k). Group-limited routing (MoESpec.expert_groups) is sampled
    (grouped_remote_nodes): which groups win depends on the scores' sizes, not only their order."""
    if nodes <= 1:
        return 0.0
    if groups > 1 and per_token < groups:
        return grouped_remote_nodes(experts, top_k, nodes, groups, per_token, router)
    per_node = experts // nodes
    missed = math.comb(experts - per_node, top_k) / math.comb(experts, top_k)
    return (nodes - 1) * (1.0 - missed)


# Tokens sampled for group-limited routing's node count: its standard error is below 0.5 % of the count.
GROUPED_ROUTING_SAMPLES = 8192


@functools.lru_cache(maxsize=None)
def grouped_remote_nodes(experts: int, top_k: int, nodes: int, groups: int, per_token: int, router: str) -> float:
    """remote_nodes_per_token under group-limited routing, as Megatron-Core routes a force-balanced token
    (moe_utils.py at d98e8a6: RandomSTE draws standard normal logits; group_limited_topk ranks the contiguous
    groups by the sum of their best top_k // per_token scores, masks all but the best `per_token` groups and
    takes the top_k scores left), over a fixed sample of tokens: the same figure on every call. The token sits
    on node 0; expert e lies on node e x nodes // experts (e // (experts / nodes) where nodes divide them; a
    group straddling hosts, estimate.group_spans, may not)."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((GROUPED_ROUTING_SAMPLES, experts))
    if router == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
    else:
        scores = np.exp(logits - logits.max(axis=1, keepdims=True))
        scores /= scores.sum(axis=1, keepdims=True)
    size, best = experts // groups, max(1, top_k // per_token)
    by_group = scores.reshape(GROUPED_ROUTING_SAMPLES, groups, size)
    group_score = -np.sort(-by_group, axis=2)[:, :, :best].sum(axis=2)
    losing = np.argsort(-group_score, axis=1)[:, per_token:]
    masked = by_group.copy()
    np.put_along_axis(masked, losing[:, :, None], -np.inf, axis=1)
    picked = np.argpartition(-masked.reshape(GROUPED_ROUTING_SAMPLES, experts), top_k - 1, axis=1)[:, :top_k]
    node_of = picked * nodes // experts
    reached = np.zeros((GROUPED_ROUTING_SAMPLES, nodes), dtype=bool)
    np.put_along_axis(reached, node_of, True, axis=1)
    return float(reached[:, 1:].sum(axis=1).mean())


def ep_span(spans: dict[str, GroupSpan], ep: int, cp: int, tp: int) -> GroupSpan:
    """The EP group on the cluster: all of tp and cp and the inner ep / (cp*tp) of dp_shard
    (rules.ep_reason), so as many of its ranks share a node as those groups' members do."""
    inner = spans["tp"].ranks_per_node * spans["cp"].ranks_per_node
    return GroupSpan(ep, inner * min(ep // (cp * tp), spans["dp_shard"].ranks_per_node))


def routed_params(spec: ModelSpec, layer: int) -> int:
    """Parameters of block `layer`'s routed experts (0 in a dense block)."""
    if not spec.is_moe_layer(layer):
        return 0
    return spec.moe.experts * spec.moe.expert_params(spec.dim)


def rank_block_params(spec: ModelSpec, layer: int, tp: int, ep: int) -> tuple[float, float]:
    """(all, routed) parameters of block `layer` one rank holds unsharded by FSDP: the routed experts
    split over EP (and TP with ep = 1), the rest over TP."""
    routed = routed_params(spec, layer)
    local_routed = routed / (ep * expert_tp(ep, tp))
    return (spec.block_params(layer) - routed) / tp + local_routed, local_routed


def moe_tensors(spec: ModelSpec, ep: int, imbalance: float, linear_input_bytes: float | None = None,
                probs_in_activation: bool = False) -> list[ActivationTensor]:
    """What an MoE layer keeps for backward, per token of the micro-batch on one rank, in place of the
    dense MLP's: the router's logits and scores (fp32), the dispatched tokens in expert order, each local
    expert's gate and up outputs, SwiGLU product and down output over the pairs it runs, and the shared
    experts like a dense MLP of their width. Routed tensors are per pair: top_k pairs per dispatched
    token, scaled by the busiest rank's imbalance; under EP a rank dispatches its tp-th of the tokens
    (shard "tp"), without EP each TP rank runs every token through its width slice.

    `linear_input_bytes`: what the expert linears keep of their inputs an element (None: the activation
    dtype; Transformer Engine's quantized copies under fp8, activations.TE_QUANTIZED_BYTES).
    `probs_in_activation`: the experts weigh their activation by the router's probabilities (Megatron-Core)
    and keep those (fp32, one a pair) in place of their outputs, which the combine then only sums."""
    moe = spec.moe
    d, f, k = spec.dim, moe.expert_ffn_dim, pairs_per_token(spec, ep, imbalance)
    token_shard = "tp" if ep > 1 else "gathered"
    lin = linear_input_bytes
    t = [ActivationTensor("router_scores", "other", 2 * moe.experts, "gathered", 4.0),
         ActivationTensor("routed_in", "other", k * d, token_shard, lin),
         ActivationTensor("expert_in_0", "ffn_in", k * f, "tp"), ActivationTensor("expert_in_1", "ffn_in", k * f, "tp"),
         ActivationTensor("expert_gated", "other", k * f, "tp", lin)]
    if probs_in_activation:
        t += [ActivationTensor("expert_probs", "other", k, token_shard, 4.0)]
    else:
        # The combine weighs each expert output by its router score: the score's gradient needs the output.
        t += [ActivationTensor("expert_out_mm", "ffn_out", k * d, token_shard)]
    if moe.shared_experts:
        s = moe.shared_experts * f
        t += [ActivationTensor("shared_in_0", "ffn_in", s, "tp"), ActivationTensor("shared_in_1", "ffn_in", s, "tp"),
              ActivationTensor("shared_gated", "other", s, "tp", lin)]
    return t


def moe_elementwise_elems(spec: ModelSpec, ep: int, imbalance: float, tp: int) -> float:
    """Elements per token one MoE layer's memory-bound kernels pass over in the forward beyond the SwiGLU
    activation: the router's softmax/sigmoid and top-k over the expert scores, and the permutation of the
    dispatched tokens into expert order and back (gather and scatter, each read and written)."""
    share = dispatched_share(tp, ep)
    return (3 * spec.moe.experts + 4 * pairs_per_token(spec, ep, imbalance) * spec.dim) * share


# What Megatron-Core's grouped-GEMM experts (TEGroupedMLP, as Megatron-Bridge's recipes pin it: Megatron-Core
# 0d8e0714 to cd4afffa, containers 25.11-26.08) run eagerly for GPT-OSS's experts beyond a plain SwiGLU's
# fused activation, element passes (forward, backward) in activation-size units:
# - the clamp (MoESpec.activation_clamp), per element of a half of fc1's output (the expert width):
#   fusions/fused_bias_geglu.weighted_bias_quick_geglu_impl chunks fc1's output, clamps each half and
#   concatenates them before its compiled GLU: two clamps each read and write a half (4), torch.cat reads
#   and writes both (4); backward, each clamp's gradient reads the gradient and its input and writes (6)
#   and chunk's gradient concatenates the two halves' (4);
# - the down projection's bias (MoESpec.bias), per element of its output (dim): TE's fc2 is built with
#   skip_bias_add=True and experts._apply_bias adds the bias per local expert, scaled by each token's
#   routing probability, torch.cat([t + b * p ...]): b * p written (1), the add read and written (3), the
#   cat read and written (2); backward, the bias's and the probability's gradients each multiply and reduce
#   (3 + 3) and split's gradient concatenates the experts' slices (2). The probabilities are taken in the
#   activation dtype.
# TE applies fc1's bias in its GEMM's epilogue and folds its gradient into the weight-gradient GEMM
# (grouped_linear.py: "Grad bias is fused with wgrad GEMM"), so it costs no pass.
MEGATRON_CLAMP_PASSES = (8.0, 10.0)
MEGATRON_EXPERT_BIAS_PASSES = (6.0, 8.0)


def megatron_expert_eager_elems(spec: ModelSpec, ep: int, imbalance: float, tp: int) -> tuple[float, float]:
    """(forward, backward) elements per token of the eager clamp and down-projection bias Megatron-Core's
    experts run on one rank (MEGATRON_CLAMP_PASSES, MEGATRON_EXPERT_BIAS_PASSES); 0 for a plain SwiGLU."""
    moe, per_token = spec.moe, routing(spec, 1.0, tp, ep, imbalance)
    clamp = per_token.width if moe.activation_clamp is not None else 0
    bias = spec.dim if moe.bias else 0
    fwd, bwd = (per_token.pairs * (c * clamp + b * bias)
                for c, b in zip(MEGATRON_CLAMP_PASSES, MEGATRON_EXPERT_BIAS_PASSES))
    return fwd, bwd


# What Megatron-Core's recompute modules leave out of what an MoE layer keeps (moe_tensors; the block's own,
# activations.megatron_recompute_drops): moe_act discards the experts' activation output once fc2 consumed it
# and runs the activation again from fc1's output (experts.py, CheckpointWithoutOutput); shared_experts
# checkpoints the shared experts from their input.
MOE_RECOMPUTE_DROPS = {"moe_act": ("expert_gated",), "shared_experts": ("shared_in_0", "shared_in_1", "shared_gated")}


def moe_recompute_drops(modules: tuple[str, ...]) -> set[str]:
    """Names of an MoE layer's own tensors the recompute `modules` leave out (MOE_RECOMPUTE_DROPS)."""
    return {name for m in modules for name in MOE_RECOMPUTE_DROPS.get(m, ())}


def megatron_act_recompute_elems(spec: ModelSpec, ep: int, imbalance: float, tp: int, act_passes: float,
                                 eager_clamp: bool) -> float:
    """Elements per token moe_act's recompute passes over on one rank: the fused activation's `act_passes`
    over each routed pair's expert width, and the eager clamp's forward before it where the model clamps and
    the stack runs it eagerly (MEGATRON_CLAMP_PASSES; not under Transformer Engine's op fuser)."""
    per_token = routing(spec, 1.0, tp, ep, imbalance)
    clamp = MEGATRON_CLAMP_PASSES[0] if eager_clamp and spec.moe.activation_clamp is not None else 0.0
    return per_token.pairs * per_token.width * (act_passes + clamp)


# Host work of an MoE layer on meshplan's runtime (runtime/moe.py, torch 2.13, eager), per micro-batch, as
# (forward, backward) ops beyond the dense SwiGLU MLP it replaces. Counted on tiny-moe with a
# TorchDispatchMode, one block as the difference of 5- and 3-layer models, with and without shared experts
# and aux loss (tests/calibrate/test_host_costs.py counts them again): the router, top-k, sort, the grouped
# GEMMs and the weighted combine; the shared experts (one SwiGLU); the Switch aux loss (its statistics and
# the gradient hook). Full AC's replay of an MoE block is 1.55x its forward ops, as a dense block's (1.52x),
# so checkpoint_op_s per forward op prices it. The routed part's 25 forward ops include the per-expert count's
# zeros, ones and scatter-add (runtime/moe.expert_counts, in place of a bincount that syncs on CUDA).
MOE_ROUTED_OPS = (25.0, 30.0)
MOE_SHARED_OPS = (15.0, 32.0)
MOE_AUX_OPS = (16.0, 16.0)
# Under EP, per MoE layer and micro-batch: the dispatcher's ops beyond the local one's (the counts exchange,
# the splits, the regrouping of what arrives: 67 more ops a step at one micro-batch than without EP, less
# the 50 of the experts' own FSDP2 unit, which host._data_parallel_host prices as any unit; put in forward),
# and its collective calls: the counts' all-to-all and the dispatch and combine in forward, their two
# gradients in backward.
EP_DISPATCH_OPS = 17.0
EP_CALLS = (3.0, 2.0)


def moe_host_ops(spec: ModelSpec, ep: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((forward, backward) ops, (forward, backward) collective calls) an MoE layer adds to a dense block on
    one rank for one micro-batch."""
    moe = spec.moe
    parts = [MOE_ROUTED_OPS] + ([MOE_SHARED_OPS] if moe.shared_experts else []) + (
        [MOE_AUX_OPS] if moe.load_balance == "aux_loss" else [])
    fwd, bwd = sum(p[0] for p in parts), sum(p[1] for p in parts)
    if ep == 1:
        return (fwd, bwd), (0.0, 0.0)
    return (fwd + EP_DISPATCH_OPS, bwd), EP_CALLS


def routed_tensors(spec: ModelSpec) -> int:
    """Parameter tensors an MoE layer holds beyond the dense MLP's: the router's gate, the routed experts'
    three and the shared experts' three (each with its bias where the model has them), less the MLP's."""
    moe = spec.moe
    per_swiglu = 3 * (2 if moe.bias else 1)
    return (2 if moe.bias else 1) + per_swiglu + (per_swiglu if moe.shared_experts else 0) - spec.ffn_matrices
