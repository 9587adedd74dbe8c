"""Model specs: parameter counts and FLOPs computed from the dimensions, user files, bad input."""
from __future__ import annotations

import json

import pytest

from ringflow.errors import ConfigError, InvalidArgument
from ringflow.workload import load_model, preset_names
from ringflow.workload.validation import TABLE1


def test_llama3_70b_parameter_count_near_70_6e9():
    m = load_model("llama3-70b")
    assert abs(m.params() - 70.6e9) / 70.6e9 < 0.003
    assert m.nominal() == 70e9  # the size in the name, which seed 004's arithmetic uses


@pytest.mark.parametrize("name,billions,tol", [("llama3-8b", 8.03, 0.01), ("llama3-405b", 405.8, 0.01),
                                               ("gpt3-175b", 174.6, 0.01)])
def test_preset_parameter_counts(name, billions, tol):
    assert abs(load_model(name).params() / 1e9 - billions) / billions < tol


def test_megatron_family_matches_narayanan_eq2_and_table1_sizes():
    for row in TABLE1:
        m = load_model(row.model)
        L, h, V, s = m.layers, m.hidden, m.vocab, m.seq_len
        eq2 = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
        assert m.params() - eq2 == pytest.approx(m.norm_params(), abs=1e-3)  # Eq. 2 omits the final LayerNorm
        assert abs(m.params() / 1e9 - row.params_b) / row.params_b < 0.03, row.model


def test_mixtral_total_and_active_parameters():
    m = load_model("mixtral-8x7b")
    assert abs(m.params() / 1e9 - 46.7) < 0.3
    assert abs(m.active_params() / 1e9 - 12.9) < 0.2
    assert m.training_flops_per_token() < 6 * m.params()  # only top-2 experts compute


def test_flops_per_token_megatron_formula():
    # Narayanan et al. Eq. 3 without recomputation: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per B s tokens
    m = load_model("megatron-gpt-145.6b")
    L, h, V, s = m.layers, m.hidden, m.vocab, 2048
    per_token = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    assert m.training_flops_per_token(s) == pytest.approx(per_token, rel=1e-12)


def test_user_spec_from_yaml_and_json(tmp_path):
    y = tmp_path / "tiny.yaml"
    y.write_text("layers: 2\nhidden: 64\nheads: 4\nkv_heads: 2\nffn_hidden: 128\nvocab: 1000\n")
    m = load_model(str(y))
    assert m.name == "tiny" and m.kv_hidden == 32
    j = tmp_path / "moe.json"
    j.write_text(json.dumps({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn_hidden": 128,
                             "vocab": 1000, "experts": 4, "top_k": 1}))
    moe = load_model(str(j))
    assert moe.params() > moe.active_params()


def test_bad_specs_name_the_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("layers: 2\nhidden: 64\n")
    with pytest.raises(ConfigError, match="lacks heads"):
        load_model(str(bad))
    odd = tmp_path / "odd.yaml"
    odd.write_text("layers: 2\nhidden: 65\nheads: 4\nkv_heads: 4\nffn_hidden: 8\nvocab: 10\n")
    with pytest.raises(ConfigError, match="multiple of heads"):
        load_model(str(odd))
    with pytest.raises(InvalidArgument, match="unknown model"):
        load_model("no-such-model")
    assert "llama3-70b" in preset_names()


def test_every_preset_cites_its_source():
    for name in preset_names():
        src = load_model(name).source
        assert "http" in src, name
