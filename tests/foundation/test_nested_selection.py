"""Model forms (forms.py) and their choice by nested cross-validation (nested.py): the async-TP window
form by hand, and on three small published tables, that a held-out table never takes part in choosing
the form it is then predicted with."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost_models import forms
from meshplan.cost_models.comm import collective_time
from meshplan.cost_models.crossval import fit, row_errors, training_rows, transform_of
from meshplan.cost_models.estimate import group_spans
from meshplan.cost_models.layout import Layout
from meshplan.cost_models.nested import choose_forms, nested_cross_validate, nested_text, table_mean_error
from meshplan.cost_models.timing import block_compute, block_time
from meshplan.profiles.registry import load_profile
from meshplan.specs.registry import resolve_model

PROF = load_profile("h100-80g-dgx")


def _layout(model: str, **kw) -> Layout:
    base = dict(spec=resolve_model(model), gpus=8, seq_len=8192, global_batch=1, micro_batch=1, dtype="bf16",
                dp_replicate=1, dp_shard=1, tp=8, sp=True, async_tp=True, pp=1, schedule="1F1B", v=1,
                stage_layers=(resolve_model(model).n_layers,), cp=1, ac="none", sac_ops=None, float8=False,
                reshard_after_forward=True, compile=True)
    base.update(kw)
    return Layout(**base)


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b"])
def test_async_tp_window_form_by_hand(model):
    """Window form: each of the block's 2 all-gathers and 2 reduce-scatters hides under tp_async_overlap x
    the matmul it is fused with (qkv, attn_out, ffn_in, ffn_out), per pass (forward and backward here).
    Traffic form: that share of all of them. Without async TP nothing is hidden."""
    lay = _layout(model)
    spans = group_spans(lay, PROF)
    share = PROF.overheads.tp_async_overlap
    payload = 8192 * lay.spec.dim * 2.0
    ag = collective_time(PROF, "all_gather", payload, spans["tp"])
    rs = collective_time(PROF, "reduce_scatter", payload, spans["tp"])
    mm = block_compute(lay, PROF).matmul_by_kind
    window = 2 * sum(max(0.0, c - share * mm[k]) for c, k in ((ag, "qkv"), (rs, "attn_out"), (ag, "ffn_in"),
                                                                (rs, "ffn_out")))
    with forms.forms(async_tp="window"):
        assert block_time(lay, PROF, spans).tp_comm == pytest.approx(window, rel=1e-12)
    assert block_time(lay, PROF, spans).tp_comm == pytest.approx(2 * 2 * (ag + rs) * (1 - share), rel=1e-12)
    assert block_time(replace(lay, async_tp=False), PROF, spans).tp_comm == pytest.approx(2 * 2 * (ag + rs))


def test_window_form_hides_less_of_a_thinner_models_traffic():
    """Collectives grow with the width, matmuls with its square: under the window form the 8B model's TP
    traffic is less hidden than the 70B model's, by share; under the traffic form equally."""
    hidden = {}
    for model in ("llama3-8b", "llama3-70b"):
        lay = _layout(model)
        spans = group_spans(lay, PROF)
        with forms.forms(async_tp="window"):
            bt = block_time(lay, PROF, spans)
        hidden[model] = 1 - bt.tp_comm / bt.tp_comm_issued
    assert hidden["llama3-8b"] < hidden["llama3-70b"]


def test_an_unknown_alternative_is_refused():
    with pytest.raises(ValueError, match="async_tp"):
        with forms.forms(async_tp="bogus"):
            pass


TABLES = ("TorchTitan H100 (Table 1)", "TorchTitan H100 (Table 3)", "TorchTitan H100 (Table 4)")


@pytest.fixture(scope="module")
def small():
    rows = [r for r in training_rows() if r.table in TABLES]
    return rows, nested_cross_validate(rows)


def test_each_held_out_table_is_predicted_with_what_the_others_chose(small):
    """Recomputed here fold by fold: the choice made on the other tables alone, the constants refitted
    with it on them, the held-out rows predicted with those."""
    rows, result = small
    assert [f.held_out for f in result.folds] == list(TABLES)
    for fold in result.folds:
        train = [r for r in rows if r.table != fold.held_out]
        chosen, inner = choose_forms(train, forms.ALTERNATIVES)
        assert (chosen, inner) == (fold.chosen, fold.inner)
        assert chosen["async_tp"] == min(inner["async_tp"], key=inner["async_tp"].get)
        with forms.forms(**chosen):
            want = row_errors([r for r in rows if r.table == fold.held_out], transform_of(fit(train)))
        got = [e for e in result.out_of_sample if e.source == fold.held_out]
        assert [e.step for e in got] == pytest.approx([e.step for e in want], rel=1e-12)
    assert len(result.out_of_sample) == len(rows)
    assert (result.on_every_table.chosen, result.on_every_table.inner) == choose_forms(rows, forms.ALTERNATIVES)
    text = nested_text(result)
    assert all(t in text for t in TABLES) and "form async_tp" in text


def test_inner_error_weighs_each_table_alike():
    from meshplan.cost_models.crossval import RowError
    import math

    errs = [RowError("a", str(i), math.expm1(0.1)) for i in range(9)] + [RowError("b", "1", math.expm1(0.3))]
    assert table_mean_error(errs) == pytest.approx((0.01 + 0.09) / 2)
