"""DeepSeek's multi-head latent attention (runtime/mla.py) against attention written out here: per head,
the query (nope, rope) against every earlier key (the head's nope part from the normed latent, the rope part
shared by all heads), softmax at 1/sqrt(qk_head_dim), times the head's values; its parameters against
MLASpec.params; and the layouts the runtime refuses for it."""

from __future__ import annotations

import math

import pytest
import torch

from meshplan.runtime.initialisation import init_weights
from meshplan.runtime.model import build_model
from meshplan.runtime.positions import rope
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import plan_from_dict
from meshplan.specs.registry import BUILTIN_MODELS, resolve_model
from meshplan.specs.rules import unsupported_fields

TINY = resolve_model("tiny-deepseek")


def _no_q_lora() -> ModelSpec:
    data = TINY.to_dict()
    data["mla"] = {**data["mla"], "q_lora_rank": 0}
    return ModelSpec.from_dict(data)


@pytest.mark.parametrize("spec", [TINY, _no_q_lora()], ids=["q_lora", "plain_q"])
def test_latent_attention_by_hand(spec):
    model = build_model(spec, "cpu")
    init_weights(model, spec, 0)
    att, a = model.layers["0"].attention, spec.mla
    x = torch.randn(1, 6, spec.dim)
    with torch.no_grad():
        got = att(x)[0]
        t = x[0]
        q = att.wq_b(att.q_norm(att.wq_a(t))) if a.q_lora_rank else att.wq(t)
        latent, k_pe = att.wkv_a(t).split([a.kv_lora_rank, a.qk_rope_head_dim], -1)
        kv = att.wkv_b(att.kv_norm(latent))
        pos = torch.arange(6)
        k_pe = rope(k_pe[None, :, None, :], pos, spec.rope_theta)[0, :, 0]
        heads = []
        for h in range(spec.n_heads):
            qh = q[:, h * a.qk_head_dim:(h + 1) * a.qk_head_dim]
            q_pe = rope(qh[None, :, None, a.qk_nope_head_dim:], pos, spec.rope_theta)[0, :, 0]
            qh = torch.cat([qh[:, :a.qk_nope_head_dim], q_pe], -1)
            kvh = kv[:, h * (a.qk_nope_head_dim + a.v_head_dim):(h + 1) * (a.qk_nope_head_dim + a.v_head_dim)]
            kh, vh = torch.cat([kvh[:, :a.qk_nope_head_dim], k_pe], -1), kvh[:, a.qk_nope_head_dim:]
            scores = qh @ kh.T / math.sqrt(a.qk_head_dim)
            scores = scores.masked_fill(torch.triu(torch.ones(6, 6, dtype=torch.bool), 1), float("-inf"))
            heads.append(torch.softmax(scores, -1) @ vh)
        want = att.wo(torch.cat(heads, -1))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny-deepseek", "deepseek-v3-16b", "deepseek-v3"])
def test_mla_models_hold_the_parameters_their_spec_counts(name):
    spec = BUILTIN_MODELS[name]
    model = build_model(spec, "meta")
    assert sum(p.numel() for p in model.parameters()) == spec.num_params()
    attention = model.layers["0"].attention
    assert sum(p.numel() for p in attention.parameters()) == spec.mla.params(spec.dim, spec.n_heads)


@pytest.mark.parametrize("tp, cp, field", [(2, 1, "parallel.tp"), (1, 2, "parallel.cp")])
def test_mla_under_tp_or_cp_is_refused_in_one_line(tp, cp, field):
    plan = plan_from_dict({"model": "tiny-deepseek", "cluster": "cpu-gloo", "gpus": 2 * tp * cp,
                           "training": {"seq_len": 64, "global_batch": 8, "micro_batch": 1},
                           "parallel": {"dp_replicate": 1, "dp_shard": 2, "tp": tp, "cp": cp, "pp": 1, "ep": 2 * tp * cp,
                                        "sequence_parallel": tp > 1, "async_tp": False, "pp_schedule": "1F1B",
                                        "pp_virtual_stages": 1},
                           "memory": {"activation_checkpointing": "none", "float8": False, "reshard_after_forward": True},
                           "compile": False})
    found = dict(unsupported_fields(plan, "gloo"))
    assert "MLA" in found[field] and "\n" not in found[field]
