"""`meshplan plan`'s table: one line per plan at 120 columns, the layout as one string, a legend
of what the rows use; the same string in the candidates CSV."""

from __future__ import annotations

import csv

import pytest

from meshplan import cli
from meshplan.specs.plan import plan_from_dict
from meshplan.specs.plan_label import legend, plan_label


def _plan(**edits):
    d = {"model": "llama3-70b", "cluster": "h100-80g-dgx", "gpus": 256,
         "training": {"seq_len": 8192, "global_batch": 512, "micro_batch": 1, "dtype": "bf16"},
         "parallel": {"dp_replicate": 1, "dp_shard": 16, "tp": 4, "sequence_parallel": True, "async_tp": True,
                      "pp": 4, "pp_schedule": "Interleaved1F1B", "pp_virtual_stages": 4, "cp": 1},
         "memory": {"activation_checkpointing": "selective", "sac_ops": ["attention", "ffn_in"], "float8": True,
                    "reshard_after_forward": False},
         "compile": True}
    for key, value in edits.items():
        section, _, name = key.partition("__")
        if name:
            d[section][name] = value
        else:
            d[section] = value
    return plan_from_dict(d)


@pytest.mark.parametrize("edits, label", [
    ({}, "fsdp16·tp4·pp4 I1F1B v4 mb1 SAC(att,fi) fp8 compile aTP"),
    ({"parallel__dp_replicate": 2, "parallel__dp_shard": 8}, "hsdp2x8·tp4·pp4 I1F1B v4 mb1 SAC(att,fi) fp8 compile aTP"),
    ({"parallel__dp_shard": 64, "parallel__pp": 1, "parallel__pp_schedule": "1F1B", "parallel__pp_virtual_stages": 1,
      "memory__activation_checkpointing": "full", "memory__sac_ops": None, "memory__reshard_after_forward": False,
      "parallel__sequence_parallel": False, "parallel__async_tp": False, "compile": False},
     "fsdp64·tp4 mb1 AC fp8 noSP keep"),
    ({"parallel__pp_layers": [4] + [5] * 14 + [6]}, "fsdp16·tp4·pp4 I1F1B v4 split mb1 SAC(att,fi) fp8 compile aTP"),
    ({"mesh_order": ["pp", "dp_replicate", "tp", "cp", "dp_shard"]},
     "fsdp16·tp4·pp4 I1F1B v4 mb1 SAC(att,fi) fp8 compile aTP order pp>tp>dp_shard"),
])
def test_layout_label_by_hand(edits, label):
    assert plan_label(_plan(**edits)) == label


def test_legend_lists_only_what_the_rows_use():
    text = legend(["fsdp16·tp4·pp4 I1F1B v4 mb1 SAC(att,fi) fp8 compile aTP"])
    assert text == ("layout: fsdpN shards; I1F1B Interleaved1F1B; vN virtual stages; "
                    "SAC(saved op kinds: att attention, ao attn_out, fi ffn_in, fo ffn_out); aTP async TP")
    assert "AC full AC" in legend(["ddp2 mb4 AC"]) and "SAC" not in legend(["ddp2 mb4 AC"])


def test_top_ten_of_70b_fit_16_lines_of_120_columns(tmp_path, capsys):
    out = tmp_path / "best.yaml"
    assert cli.main(["plan", "--model", "llama70b", "--gpus", "256", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("llama3-70b on 256"))
    end = next(i for i, line in enumerate(lines) if line.startswith("layout:"))
    table = lines[start:end + 1]
    while end + 1 < len(lines) and not lines[end + 1].startswith("searched"):  # the legend's continuation
        end += 1
        table.append(lines[end])
    assert len(table) <= 16 and all(len(line) <= 120 for line in table), table
    rows = [line for line in table if line.split() and line.split()[0].isdigit()]
    assert [int(r.split()[0]) for r in rows] == list(range(1, 11))
    with open(str(out).replace(".yaml", ".candidates.csv")) as f:
        ranked = [r for r in csv.DictReader(f) if r["rank"]]
    assert all(r["layout"] in rows[int(r["rank"]) - 1] for r in ranked)
