import json

import pytest

from meshplan.errors import InputError
from meshplan.specs.model_file import from_hf_config
from meshplan.specs.registry import BUILTIN_MODELS, resolve_model

# Published parameter counts (Meta model cards / HF safetensors totals; Llama 2 paper).
PUBLISHED = {
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
}


@pytest.mark.parametrize("name,count", PUBLISHED.items())
def test_parameter_counts_match_published(name, count):
    assert resolve_model(name).num_params() == count


@pytest.mark.parametrize("alias", ["llama70b", "llama3-70b", "llama3.1-70b", "LLAMA70B"])
def test_aliases_name_the_same_model(alias):
    assert resolve_model(alias) is BUILTIN_MODELS["llama3-70b"]


def test_inline_spec_defaults_kv_heads_to_heads():
    m = resolve_model({"name": "g", "arch": "gpt", "dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 256,
                       "vocab_size": 100, "max_seq_len": 32})
    assert m.n_kv_heads == 4
    # GPT block: qkv + out with biases, 2-matrix MLP with biases, two LayerNorms with bias.
    d, f = 64, 256
    assert m.layer_params() == 4 * d * d + 4 * d + 2 * d * f + f + d + 4 * d


def test_hf_config_import_matches_registry(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
           "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
           "tie_word_embeddings": False, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert resolve_model(str(path)).num_params() == PUBLISHED["llama3-70b"]
    assert from_hf_config(cfg, "x").num_params() == PUBLISHED["llama3-70b"]


@pytest.mark.parametrize("bad,field", [
    ({"name": "m", "dim": 60, "n_layers": 2, "n_heads": 7, "ffn_dim": 8, "vocab_size": 10}, "model.dim"),
    ({"name": "m", "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 3, "ffn_dim": 8, "vocab_size": 10}, "model.n_kv_heads"),
    ({"name": "m", "dim": 64, "n_layers": 0, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10}, "model.n_layers"),
    # a depth the cost model would walk block by block for ever (the CLI fuzz test drew 10**30)
    ({"name": "m", "dim": 64, "n_layers": 10**30, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10}, "model.n_layers"),
    ({"name": "m", "dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10,
      "moe": {"experts": 10**30, "top_k": 2, "expert_ffn_dim": 8}}, "model.moe.experts"),
    ({"name": "m", "dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10,
      "moe": {"experts": 60000, "top_k": 30000, "expert_ffn_dim": 8}}, "model.moe.top_k"),
    ({"name": "m", "arch": "rnn", "dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10}, "model.arch"),
    ({"dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10}, "model.name"),
    ({"name": "m", "dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10, "colour": 1}, "model.colour"),
])
def test_bad_model_specs_name_the_field(bad, field):
    with pytest.raises(InputError) as e:
        resolve_model(bad)
    assert e.value.field == field


def test_unknown_model_lists_valid_names():
    with pytest.raises(InputError, match="llama3-70b"):
        resolve_model("llama9000b")


def test_a_width_beyond_any_model_is_refused_by_name_before_the_cost_model_overflows():
    """The fuzzer's model file with dim 1.34e154 (an integral float) reached the matmul roofline and overflowed
    converting m x k to a float; every width is bounded at MAX_WIDTH, and the widest allowed model is still
    estimated in finite time."""
    from meshplan.specs.moe import MAX_WIDTH

    base = {"name": "m", "dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10}
    for key in ("dim", "n_heads", "ffn_dim", "vocab_size"):
        with pytest.raises(InputError, match=rf"model\.{key}.*<= {MAX_WIDTH}"):
            resolve_model({**base, key: 1.3407807929942597e+154})
    with pytest.raises(InputError, match="expert_ffn_dim"):
        resolve_model({**base, "moe": {"experts": 8, "top_k": 2, "expert_ffn_dim": MAX_WIDTH + 1}})
    assert resolve_model({**base, "dim": MAX_WIDTH, "n_heads": 1}).dim == MAX_WIDTH


@pytest.mark.timeout(60)
def test_the_deepest_and_widest_allowed_models_are_read_and_counted_at_once():
    """At the bounds a model is still read and counted quickly: parameters grow by one block per block (10,000
    of them), and a token's destination nodes among 65,536 experts choosing 1,024 lie between 0 and the
    other nodes' count."""
    from meshplan.cost_models.moe import remote_nodes_per_token
    from meshplan.specs.model import MAX_LAYERS
    from meshplan.specs.moe import MAX_EXPERTS, MAX_TOP_K

    base = {"name": "m", "dim": 64, "n_layers": 2, "n_heads": 4, "ffn_dim": 8, "vocab_size": 10}
    two, deep = resolve_model(base), resolve_model({**base, "n_layers": MAX_LAYERS})
    assert deep.num_params() - two.num_params() == (MAX_LAYERS - 2) * two.block_params(0)
    wide = resolve_model({**base, "moe": {"experts": MAX_EXPERTS, "top_k": MAX_TOP_K, "expert_ffn_dim": 8}})
    assert (wide.moe.experts, wide.moe.top_k) == (MAX_EXPERTS, MAX_TOP_K)
    assert 0.0 < remote_nodes_per_token(MAX_EXPERTS, MAX_TOP_K, 8) <= 7.0
