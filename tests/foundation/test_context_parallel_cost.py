"""Context parallelism by hand: ring attention's fp32 merging, and K/V at the query's width (repeat_kv)."""

from dataclasses import replace

import pytest

from meshplan.cost_models.compute import attention_tflops, memory_bound_time
from meshplan.cost_models.estimate import group_spans
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.memory import rank_memory
from meshplan.cost_models.timing import block_time
from meshplan.profiles.registry import load_profile
from meshplan.specs.registry import resolve_model

H100 = load_profile("h100-96g-gt")


def _layout(cp: int, **kw) -> Layout:
    base = dict(spec=resolve_model("llama3-8b"), gpus=8, seq_len=32768 * cp, global_batch=8 // cp, micro_batch=1,
                dtype="bf16", dp_replicate=1, dp_shard=8 // cp, tp=1, sp=False, async_tp=False, pp=1,
                schedule="1F1B", v=1, stage_layers=(32,), cp=cp, ac="full", sac_ops=None, float8=False,
                reshard_after_forward=True, compile=True,
                attention_kernel="flash")  # the profile's untagged points, one rate and backward_ratio below
    base.update(kw)
    return Layout(**base)


def _block(lay: Layout):
    return block_time(lay, H100, group_spans(lay, H100))


def test_ring_bookkeeping_by_hand():
    """cp - 1 forward merges (50 B per query element, 8 per K/V element) and cp backward steps (20 and 20),
    on top of the attention kernels, in forward, recompute and backward."""
    lay = _layout(4, cp_attention="ring")
    same_tokens = replace(lay, cp=1, seq_len=32768, global_batch=2, dp_shard=8)
    ring, no_ring = _block(lay), _block(same_tokens)
    q, kv = 32768 * 4096, 32768 * 1024  # local tokens x query width, x key/value width
    fwd = memory_bound_time(H100.device, 3 * (50 * q + 8 * kv))
    bwd = memory_bound_time(H100.device, 4 * (20 * q + 20 * kv))
    rate = attention_tflops(H100.device, 131072, "bf16") * 1e12
    assert rate == attention_tflops(H100.device, 32768, "bf16") * 1e12  # both past the last point
    kernel = 2 * (131072 - 32768) * 4096 * 32768 / rate  # causal forward: the keys grow 4x
    assert ring.forward - no_ring.forward == pytest.approx(kernel + fwd, rel=1e-9)
    assert ring.recompute - no_ring.recompute == pytest.approx(kernel + fwd, rel=1e-9)
    kernel_bwd = 2.5 * kernel / H100.device.attention.backward_ratio
    assert ring.backward_input - no_ring.backward_input == pytest.approx(kernel_bwd + bwd, rel=1e-9)


def test_gather_attention_has_no_ring_bookkeeping():
    """meshplan's runtime gathers K/V and attends once: the kernels grow with the keys, nothing else."""
    gather, ring = _block(_layout(4)), _block(_layout(4, cp_attention="ring"))
    q, kv = 32768 * 4096, 32768 * 1024
    assert ring.forward - gather.forward == pytest.approx(memory_bound_time(H100.device, 3 * (50 * q + 8 * kv)))
    assert ring.cp_comm == gather.cp_comm


def test_repeated_kv_widens_what_cp_moves_and_holds():
    lay = _layout(8, cp_attention="ring")
    wide = replace(lay, kv_repeated=True)
    assert (lay.cp_kv_dim, wide.cp_kv_dim) == (1024, 4096)
    narrow_mem = rank_memory(lay, 0, 1.0, H100.overheads).parts["cp_buffers"]
    wide_mem = rank_memory(wide, 0, 1.0, H100.overheads).parts["cp_buffers"]
    assert narrow_mem == 2 * 262144 * 1024 * 2.0  # K and V of the whole sequence, one layer, bf16
    assert wide_mem == 4 * narrow_mem
    # the ring's K/V bookkeeping grows with the width: 8 B forward and 20 B backward per added element
    added = 32768 * (4096 - 1024)
    fwd = memory_bound_time(H100.device, 7 * 8 * added)
    assert _block(wide).forward - _block(lay).forward == pytest.approx(fwd, rel=1e-9)
    # the exposed K/V all-gather moves 4x the bytes (NVLink inside the node: latency is small against it)
    assert _block(wide).cp_comm / _block(lay).cp_comm == pytest.approx(4.0, rel=0.01)


def test_no_ring_without_cp():
    lay = _layout(1)
    assert _block(lay).cp_comm == 0.0
    assert _block(replace(lay, kv_repeated=True)).forward == _block(lay).forward


def test_transformer_engines_ring_hides_each_exchange_under_a_step_of_attention():
    """Megatron-Core's P2P ring (Layout.cp_ring_overlap): cp - 1 of the cp attention steps each cover one K/V
    exchange, forward; the K/V and gradient exchanges (2 per pass) under the backward's. By hand from the
    block's own issued exchange and attention, at a short and a long sequence: the long one hides it all."""
    for seq in (8192, 131072):
        plain = _layout(4, cp_attention="ring", seq_len=seq, ac="none")
        te = replace(plain, cp_ring_overlap=True)
        bt_plain, bt_te = _block(plain), _block(te)
        per_pass = bt_plain.cp_comm_issued / 3  # one forward + 2 backward exchanges, AC none
        assert bt_plain.cp_comm == pytest.approx(3 * per_pass)  # PyTorch's ring: in line (cp_overlap 0)
        kinds = bt_te.kinds
        want = (max(0.0, per_pass - 0.75 * kinds.attention_forward)
                + max(0.0, 2 * per_pass - 0.75 * kinds.attention_backward))
        assert bt_te.cp_comm == pytest.approx(want, rel=1e-9)
        assert bt_te.cp_comm < bt_plain.cp_comm
    assert bt_te.cp_comm == 0.0  # at 128k a step's attention outlasts its exchange


def test_megatron_cores_ring_moves_grouped_kv_and_the_runtimes_ring_every_query_heads():
    """On NCCL the runtime's ring (PyTorch's context_parallel) takes K/V expanded to every query head; Transformer
    Engine's P2P ring, which Megatron-Core feeds unexpanded (num_gqa_groups), moves them at the KV heads. Llama 3
    70B: 8 KV heads of 128 against 64 query heads, 1024 against 8192 a token. Qwen3-30B-A3B's queries are wider
    than its model (32 heads of 128 = 4096 over a width of 2048): expanded, K/V take the queries' width, 4096,
    not the model's."""
    from meshplan.cost_models.layout import layout_of, runtime_paths
    from meshplan.specs.plan import plan_from_dict

    def kv_dim(model: str, stack: str, tp: int = 8) -> int:
        plan = plan_from_dict({
            "version": 1, "model": model, "cluster": "h100-80g-dgx", "gpus": 64, "stack": stack,
            "training": {"seq_len": 131072, "global_batch": 8, "micro_batch": 1, "dtype": "bf16"},
            "parallel": {"dp_replicate": 1, "dp_shard": 64 // (8 * tp), "tp": tp, "sequence_parallel": True,
                         "async_tp": False, "pp": 1, "pp_schedule": "1F1B", "pp_virtual_stages": 1, "pp_layers": None,
                         "cp": 8},
            "memory": {"activation_checkpointing": "full", "sac_ops": None, "float8": False,
                       "reshard_after_forward": True},
            "compile": False})
        return runtime_paths(layout_of(plan), load_profile(plan.cluster)).cp_kv_dim

    assert kv_dim("llama3-70b", "meshplan") == 64 * 128
    assert kv_dim("llama3-70b", "megatron-core") == 8 * 128
    assert kv_dim("qwen3-30b-a3b", "meshplan", tp=4) == 32 * 128
    assert kv_dim("qwen3-30b-a3b", "megatron-core", tp=4) == 4 * 128
