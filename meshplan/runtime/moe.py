"""A mixture-of-experts MLP shaped by specs/moe.py's MoESpec, the way TorchTitan builds one: a router
picks each token's top-k routed experts, the tokens are sorted by expert and run through all the local
experts as grouped GEMMs (`torch._grouped_mm`), and the outputs, weighted by their router scores, are
added back per token beside the shared experts' output.

Where the tokens go is the dispatcher's business: `LocalDispatch` keeps them on this rank (every expert
local); expert_parallel.py's all-to-all dispatcher sends them to the ranks holding their experts. The
layer is the same module either way, so every parameter keeps its name and global shape under every
layout (the routed experts are (experts, out, in) tensors, Shard(0) over EP).

Load balance, as the spec says:
- "aux_loss": the Switch Transformer loss coef * E * sum_i f_i * P_i (f_i the share of the micro-batch's
  token-expert pairs routed to expert i, P_i the mean router probability of i), its gradient attached to
  the layer's output (Megatron's MoEAuxLossAutoScaler) so it reaches the router under any schedule.
- "bias": DeepSeek-V3's aux-loss-free expert bias, added to the scores for the choice of experts only and
  moved after each optimizer step by BIAS_UPDATE_RATE towards the mean load (`finish_step`).

`balanced_routing` is the test mode: token position p takes experts (p*k + j) mod E, j < k, whatever the
scores say (TorchTitan's _debug_force_load_balance, keyed by the global position so every layout routes a
token alike); the scores still weigh the outputs, so the router trains.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from meshplan.specs.model import ModelSpec
from meshplan.specs.moe import MoESpec
from meshplan.specs.rules import grouped_mm_kernel

# Qwen3-MoE's router_aux_loss_coef (its config.json); Switch Transformer used 1e-2, Mixtral 2e-2.
AUX_LOSS_COEF = 1e-3
# DeepSeek-V3 (arXiv 2412.19437, section 4.2): bias update speed gamma = 0.001 for most of pre-training.
BIAS_UPDATE_RATE = 1e-3


class AttachAuxLoss(torch.autograd.Function):
    """Returns `out` unchanged; in backward, the auxiliary loss gets gradient `scale` as if it had been added
    to the training loss (which is scaled the same way: 1/micro-batches, and so on; MoE.aux_grad_scale)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.aux_meta = (aux.shape, aux.dtype, aux.device)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        shape, dtype, device = ctx.aux_meta
        return grad, torch.full(shape, ctx.scale, dtype=dtype, device=device), None


class SumOverGroup(torch.autograd.Function):
    """All-reduce (sum) in forward, identity in backward: each rank holds a share of a micro-batch's tokens
    (sequence or context parallel), computes the same loss from the summed statistics and sends gradient to
    its own share only, so nothing is counted twice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def expert_counts(flat: torch.Tensor, experts: int) -> torch.Tensor:
    """Token-expert pairs per expert, without waiting for the device: torch.bincount on CUDA reads the
    input's maximum back to size its output (a device-to-host sync in every MoE layer, which keeps the
    host from running ahead of the kernels); a scatter-add into `experts` zeros does not."""
    return torch.zeros(experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))


def grouped_mm_runs(x: torch.Tensor) -> bool:
    """Whether torch._grouped_mm takes these activations (specs/rules.py grouped_mm_kernel)."""
    capability = torch.cuda.get_device_capability(x.device) if x.device.type == "cuda" else None
    return grouped_mm_kernel(x.device.type, "bf16" if x.dtype == torch.bfloat16 else str(x.dtype), capability)


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows of `x` grouped by expert (`counts` rows each, `offsets` their int32 ends) times each expert's
    (out, in) `weight`: one grouped GEMM where the device has one, else a loop over the experts."""
    w = weight.transpose(-2, -1)
    if grouped_mm_runs(x):
        return torch._grouped_mm(x, w, offs=offsets)
    parts = torch.split(x, counts.tolist())
    return torch.cat([p @ w[e] for e, p in enumerate(parts)]) if parts else x.new_zeros(0, w.shape[-1])


class ScaleGrad(torch.autograd.Function):
    """Identity in forward; multiplies the gradient by `factor` in backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


class GroupedExperts(nn.Module):
    """`n` routed SwiGLU experts: w1 and w3 (n, ffn, dim), w2 (n, dim, ffn); biases where the model has them.
    `grad_scale`: the factor expert parallelism puts on their gradients (data_parallel.apply_expert_fsdp)."""

    def __init__(self, n: int, dim: int, ffn: int, bias: bool):
        super().__init__()
        self.grad_scale = 1.0
        self.w1 = nn.Parameter(torch.empty(n, ffn, dim))
        self.w3 = nn.Parameter(torch.empty(n, ffn, dim))
        self.w2 = nn.Parameter(torch.empty(n, dim, ffn))
        self.w1_bias = nn.Parameter(torch.empty(n, ffn)) if bias else None
        self.w3_bias = nn.Parameter(torch.empty(n, ffn)) if bias else None
        self.w2_bias = nn.Parameter(torch.empty(n, dim)) if bias else None

    def local(self, name: str) -> torch.Tensor | None:
        """A weight as this rank computes with it: its expert-parallel shard (a DTensor's local part)."""
        t = getattr(self, name)
        if t is None:
            return None
        t = t.to_local() if hasattr(t, "to_local") else t
        return ScaleGrad.apply(t, self.grad_scale) if self.grad_scale != 1.0 else t

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """`x`: rows sorted by local expert, `counts[e]` rows for expert e."""
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        w1, w2, w3 = self.local("w1"), self.local("w2"), self.local("w3")
        a = grouped_linear(x, w1, counts, offsets)
        b = grouped_linear(x, w3, counts, offsets)
        if self.w1_bias is not None:
            rows = torch.repeat_interleave(torch.arange(len(counts), device=x.device), counts, output_size=x.shape[0])
            a, b = a + self.local("w1_bias")[rows], b + self.local("w3_bias")[rows]
        out = grouped_linear(F.silu(a) * b, w2, counts, offsets)
        if self.w2_bias is not None:
            out = out + self.local("w2_bias")[rows]
        return out


class SharedExperts(nn.Module):
    """Every token's SwiGLU of width shared_experts * expert_ffn_dim (one MLP, as TorchTitan fuses them)."""

    def __init__(self, dim: int, ffn: int, bias: bool):
        super().__init__()
        self.w1 = nn.Linear(dim, ffn, bias=bias)
        self.w3 = nn.Linear(dim, ffn, bias=bias)
        self.w2 = nn.Linear(ffn, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


@dataclass
class Routed:
    """One micro-batch's routing on this rank: each of its T tokens' k experts and their weights."""

    experts: torch.Tensor  # (T, k) int64
    weights: torch.Tensor  # (T, k) fp32
    scores: torch.Tensor  # (T, E) fp32: softmax or sigmoid of the router's logits


class Router(nn.Module):
    def __init__(self, dim: int, moe: MoESpec):
        super().__init__()
        self.moe = moe
        self.gate = nn.Linear(dim, moe.experts, bias=moe.bias)

    def forward(self, x: torch.Tensor, expert_bias: torch.Tensor | None, positions: torch.Tensor | None) -> Routed:
        """`x` (batch, seq, dim); `positions` (seq,) global positions when routing is forced balanced."""
        logits = self.gate(x)
        logits = (logits.to_local() if hasattr(logits, "to_local") else logits).flatten(0, 1).float()
        scores = torch.sigmoid(logits) if self.moe.router == "sigmoid" else torch.softmax(logits, dim=-1)
        k, n = self.moe.top_k, self.moe.experts
        if positions is not None:
            batch = logits.shape[0] // positions.numel()
            pos = positions.repeat(batch)
            experts = (pos[:, None] * k + torch.arange(k, device=pos.device)[None, :]) % n
        else:
            choice = scores + expert_bias if expert_bias is not None else scores
            experts = torch.topk(self._within_groups(choice), k, dim=-1).indices
        weights = scores.gather(1, experts)
        # Top-k weights normalised to sum to 1 (Mixtral, Qwen3's norm_topk_prob, DeepSeek-V3's sigmoid router).
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return Routed(experts, weights, scores)

    def _within_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """Group-limited routing (MoESpec.expert_groups): every expert outside the token's best
        groups_per_token groups masked out, each group ranked by the sum of its best top_k // groups_per_token
        scores (Megatron-Core's group_limited_topk: DeepSeek-V3 ranks its 8 groups by their best 2 and keeps 4)."""
        moe = self.moe
        if moe.expert_groups == 1 or moe.groups_per_token == moe.expert_groups:
            return choice
        by_group = choice.view(choice.shape[0], moe.expert_groups, -1)
        group_score = by_group.topk(max(1, moe.top_k // moe.groups_per_token), dim=-1).values.sum(-1)
        kept = torch.zeros_like(group_score, dtype=torch.bool)
        kept.scatter_(1, torch.topk(group_score, moe.groups_per_token, dim=-1).indices, True)
        return by_group.masked_fill(~kept[:, :, None], float("-inf")).flatten(1)


class LocalDispatch:
    """Every routed expert on this rank: the rows, sorted by expert (`counts[e]` for expert e), run here."""

    def __call__(self, experts: GroupedExperts, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return experts(x, counts)


@dataclass
class SequenceShare:
    """Which share of the micro-batch's tokens this rank routes: its sequence-parallel chunk of its
    context-parallel positions, and the group holding the other shares (None: all of them here)."""

    sp_rank: int = 0
    sp_size: int = 1
    group: object = None
    grad_scale: float = 1.0  # the aux loss's gradient factor from data averaging over CP ranks


class MoE(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        moe = spec.moe
        self.spec = moe
        self.router = Router(spec.dim, moe)
        self.experts = GroupedExperts(moe.experts, spec.dim, moe.expert_ffn_dim, moe.bias)
        self.shared_experts = (SharedExperts(spec.dim, moe.shared_experts * moe.expert_ffn_dim, moe.bias)
                               if moe.shared_experts else None)
        self.register_buffer("expert_bias", torch.zeros(moe.experts) if moe.load_balance == "bias" else None)
        # Routed pairs per expert and the aux loss summed over the step's micro-batches (finish_step reads them).
        self.register_buffer("tokens_per_expert", torch.zeros(moe.experts), persistent=False)
        self.register_buffer("aux_loss_sum", torch.zeros(()), persistent=False)
        self.dispatch = LocalDispatch()
        self.share = SequenceShare()
        self.balanced_routing = False
        self.counting = True  # False while a forward is not training (routing_not_counted)
        self.aux_grad_scale = 1.0  # set by the trainer: 1/micro-batches with accumulation, 1 under PP
        self.seq_layout = None  # set by context parallelism (model.SeqLayout)

    def matmul_kinds(self) -> tuple[str, ...]:
        """Op kinds of the layer's matmuls in forward order (flops._SAC_KIND): the router's, the routed
        experts' gate, up and down grouped GEMMs, then the shared experts'."""
        shared = ("ffn_in", "ffn_in", "ffn_out") if self.shared_experts is not None else ()
        return ("ffn_in", "ffn_in", "ffn_in", "ffn_out") + shared

    def positions(self, local_len: int, device: torch.device) -> torch.Tensor:
        """Global positions of this rank's tokens (balanced routing's key)."""
        full = local_len * self.share.sp_size
        pos = self.seq_layout.positions(full, device) if self.seq_layout is not None else torch.arange(full, device=device)
        return pos[self.share.sp_rank * local_len:(self.share.sp_rank + 1) * local_len]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to_local() if hasattr(x, "to_local") else x  # a sequence-parallel norm's Shard(1) output
        bs, seqlen, dim = x.shape
        positions = self.positions(seqlen, x.device) if self.balanced_routing else None
        r = self.router(x, self.expert_bias, positions)
        tokens = x.reshape(-1, dim)
        flat = r.experts.flatten()
        counts = expert_counts(flat, self.spec.experts)  # pairs per expert: dispatch, aux loss, metrics
        order = torch.argsort(flat, stable=True)
        token_of = order // self.spec.top_k
        routed = self.dispatch(self.experts, tokens[token_of], counts)
        weighted = routed * r.weights.flatten()[order, None].to(routed.dtype)
        out = torch.zeros_like(tokens).index_add(0, token_of, weighted.to(tokens.dtype)).view(bs, seqlen, dim)
        self._count(counts)
        if self.spec.load_balance == "aux_loss":
            scale = AUX_LOSS_COEF * self.aux_grad_scale * self.share.grad_scale
            out = AttachAuxLoss.apply(out, self._aux_loss(r, counts), scale)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out

    def _aux_loss(self, r: Routed, counts: torch.Tensor) -> torch.Tensor:
        """E * sum_i f_i * P_i over the micro-batch's tokens (all shares of them; unscaled by the coefficient)."""
        n = self.spec.experts
        stats = torch.cat([counts.to(r.scores.dtype), r.scores.sum(0),
                           torch.tensor([r.scores.shape[0]], dtype=r.scores.dtype, device=r.scores.device)])
        if self.share.group is not None:
            stats = SumOverGroup.apply(stats, self.share.group)
        counts, prob_sums, tokens = stats[:n], stats[n:2 * n], stats[-1].detach()
        aux = n * torch.sum(counts / (tokens * self.spec.top_k) * prob_sums / tokens)
        if self._counts():
            self.aux_loss_sum += aux.detach()
        return aux

    def _counts(self) -> bool:
        # Not when activation checkpointing re-runs the forward in backward, nor in a pipeline's shape probe.
        return self.counting and not _recomputing()

    @torch.no_grad()
    def _count(self, counts: torch.Tensor) -> None:
        if self._counts():
            self.tokens_per_expert += counts.to(self.tokens_per_expert.dtype)


def _recomputing() -> bool:
    """Whether this forward runs inside backward (an activation-checkpoint recomputation)."""
    return torch._C._current_graph_task_id() != -1


@contextlib.contextmanager
def routing_not_counted(module: nn.Module):
    """Forwards under this are not training steps: the MoE layers of `module` do not count their routing."""
    layers = [m for m in module.modules() if isinstance(m, MoE)]
    for m in layers:
        m.counting = False
    try:
        yield
    finally:
        for m in layers:
            m.counting = True


def moe_layers(parts: list[nn.Module]) -> list[MoE]:
    return [m for part in parts for m in part.modules() if isinstance(m, MoE)]


@dataclass
class RoutingStats:
    """One step's routing over the model's MoE layers (every token of the global batch)."""

    tokens_per_expert: tuple[float, float, float]  # min, mean, max over (layer, expert) of routed pairs
    imbalance: float  # mean over layers of the busiest EP rank's pairs over the mean rank's
    aux_loss: float  # mean over micro-batches, summed over layers (before the coefficient)


# finish_step's tensor: what is summed over pipeline stages, then what is maxed (-min, max).
_SUMMED, _NONE = 4, -1e30


@torch.no_grad()
def finish_step(layers: list[MoE], group, ep: int, sharers: int, device: torch.device) -> torch.Tensor:
    """After the optimizer step: sum each layer's routed pairs and aux loss over `group` (the ranks of this
    pipeline stage), move the aux-loss-free expert biases, reset the counters. Returns, as float64 on the
    device for the step's one host read, [layers, sum of mean pairs per expert, sum of imbalance, aux sum,
    -min pairs, max pairs]; the aux sum counted once per micro-batch (`sharers` ranks compute each alike)."""
    if not layers:
        return torch.tensor([0.0] * _SUMMED + [_NONE, _NONE], dtype=torch.float64, device=device)
    counts = torch.stack([m.tokens_per_expert for m in layers])
    aux = torch.stack([m.aux_loss_sum for m in layers]).sum().reshape(1)
    both = torch.cat([counts.flatten(), aux])
    if group is not None:
        dist.all_reduce(both, group=group)
    counts, aux = both[:-1].view_as(counts), both[-1] / sharers
    for m, c in zip(layers, counts):
        if m.expert_bias is not None:
            m.expert_bias += BIAS_UPDATE_RATE * torch.sign(c.mean() - c)
        m.tokens_per_expert.zero_()
        m.aux_loss_sum.zero_()
    per_rank = counts.view(len(layers), ep, -1).sum(-1)
    imbalance = (per_rank.max(-1).values / per_rank.mean(-1).clamp_min(1e-9)).sum()
    return torch.stack([torch.tensor(float(len(layers)), device=device), counts.mean(-1).sum(), imbalance, aux,
                        -counts.min(), counts.max()]).double()


def combine_over_stages(stats: torch.Tensor, group) -> torch.Tensor:
    """finish_step's tensors of every pipeline stage: layers, sums and aux added, extremes kept."""
    summed, extremes = stats[:_SUMMED].clone(), stats[_SUMMED:].clone()
    dist.all_reduce(summed, group=group)
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
    return torch.cat([summed, extremes])


def routing_stats(values: list[float], micro_batches: int) -> RoutingStats | None:
    """RoutingStats from combined finish_step values; `micro_batches` over the whole data-parallel batch."""
    layers, mean_sum, imbalance, aux, neg_min, hi = values
    if layers == 0:
        return None
    return RoutingStats((-neg_min, mean_sum / layers, hi), imbalance / layers, aux / micro_batches)
