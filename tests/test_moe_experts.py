"""Routed experts run one GEMM per local expert: each at the efficiency of its own rows."""
from __future__ import annotations

from dataclasses import replace

import pytest

from ringflow.errors import ConfigError
from ringflow.workload.compute import EfficiencyModel, expert_gemm_rate, gpu_spec, microbatch_times
from ringflow.workload.layout import Layout
from ringflow.workload.models import load_model
from ringflow.workload.moe import rows_per_expert

QWEN3_30B = "qwen3-30b-a3b"   # the preset (ringflow/workload/models/qwen3.yaml)


def _layout(**kw: object) -> Layout:
    base = dict(dp=8, ep=8, micro_batch=2, global_batch=64, seq_len=4096, zero=1, precision="fp8")
    return Layout(**{**base, **kw})  # type: ignore[arg-type]


def test_a_balanced_expert_gets_its_share_of_the_routed_copies_of_the_ep_group() -> None:
    # Qwen3-30B-A3B, micro-batch 2 x 4096 tokens, top-8 over 128 experts, EP 8: 16 local experts of 4096 rows
    assert rows_per_expert(8192, 8, 8, 128) == 4096
    # TP 2 with sequence parallelism: 2048 tokens per GPU; an expert-TP group of 2 gathers its two halves
    assert rows_per_expert(2048, 8, 8, 128, expert_tp=2) == rows_per_expert(4096, 8, 8, 128)


def test_rows_of_nothing_are_a_config_error_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match="positive tokens"):
        rows_per_expert(0, 8, 8, 128)
    with pytest.raises(ConfigError, match="experts=0"):
        rows_per_expert(4096, 8, 8, 0)


def test_expert_gemms_reach_the_efficiency_of_one_experts_rows() -> None:
    model, layout = load_model(QWEN3_30B), _layout()
    e = replace(EfficiencyModel(), n_half=4096.0, d_half=0.0)
    tokens = layout.micro_batch * layout.seq_len   # 8192 rows in the dense GEMMs, 4096 per expert
    rate = 1e15
    # row factor 4096 / (4096 + 4096) against the dense GEMMs' 8192 / (8192 + 4096)
    assert expert_gemm_rate(model, layout, e, tokens, rate) == pytest.approx(rate * 0.5 / (2 / 3))
    flat = replace(e, n_half=0.0)   # without a row term the experts run at the dense rate
    assert expert_gemm_rate(model, layout, flat, tokens, rate) == pytest.approx(rate)


def test_spreading_the_same_routed_tokens_over_more_experts_slows_the_expert_gemms() -> None:
    gpu, layout = gpu_spec("H100"), _layout()
    few = load_model(QWEN3_30B)
    many = replace(few, name="qwen3-30b-a3b-x4", experts=512)   # 4x the experts, 1/4 the rows

    def slower_backward_s(n_half: float) -> float:
        e = replace(EfficiencyModel(gemm_tables=False), n_half=n_half)   # the curve's row term
        return microbatch_times(many, layout, gpu, e).backward_s - microbatch_times(few, layout, gpu, e).backward_s

    # without a row term only the router's wider scores tell them apart; with one, 1,024-row expert GEMMs
    # (against 4,096) reach 0.5 of the curve's row factor instead of 0.8
    assert slower_backward_s(1024.0) > 5 * slower_backward_s(0.0) > 0
