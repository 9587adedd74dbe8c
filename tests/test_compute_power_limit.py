"""A GPU under a board power limit: its compute-bound rates follow the sustained SM clock the source measured there,
its memory-bound ones do not."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ringflow.errors import InvalidArgument
from ringflow.hardware.gpus import GPU_MODELS
from ringflow.workload.compute import gpu_spec, microbatch_times
from ringflow.workload.layout import Layout
from ringflow.workload.models import load_model


def test_the_h100s_default_limit_is_the_700_w_the_tables_were_measured_at() -> None:
    h100 = GPU_MODELS["H100"]
    assert h100.power_limit_W == 700.0 and gpu_spec("H100").power_limit_W == 700.0
    assert h100.clock_ratio(700.0) == 1.0
    assert "2604.11391" in h100.sustained_clock_source


def test_at_500_w_the_tensor_and_exponential_rates_take_the_measured_clock_ratio_and_hbm_stays() -> None:
    full = gpu_spec("H100")
    capped = full.at_power_limit(500.0)
    r = 1731.0 / 1969.0
    assert capped.bf16_flops == pytest.approx(full.bf16_flops * r)
    assert capped.fp8_flops == pytest.approx(full.fp8_flops * r)
    assert capped.exp_per_s == pytest.approx(full.exp_per_s * r)
    assert (capped.hbm_GBps, capped.memory_bytes, capped.power_limit_W) == (full.hbm_GBps, full.memory_bytes, 500.0)


def test_limits_compose_and_a_limit_between_two_measured_ones_lies_between_their_clocks() -> None:
    full = gpu_spec("H100")
    assert full.at_power_limit(500.0).at_power_limit(700.0).bf16_flops == pytest.approx(full.bf16_flops)
    assert full.at_power_limit(700.0) is full
    at = {w: full.at_power_limit(w).bf16_flops for w in (400.0, 450.0, 500.0)}
    assert at[400.0] < at[450.0] < at[500.0]
    assert at[450.0] == pytest.approx((at[400.0] + at[500.0]) / 2)


@pytest.mark.parametrize("watts", [150.0, 750.0, 0.0, -500.0, math.nan])
def test_a_limit_outside_the_measured_range_or_not_positive_is_refused(watts: float) -> None:
    with pytest.raises(InvalidArgument, match="power limit"):
        gpu_spec("H100").at_power_limit(watts)


def test_a_gpu_without_a_measured_clock_runs_only_at_its_default_limit() -> None:
    h200 = gpu_spec("H200")
    assert h200.at_power_limit(700.0) is h200
    with pytest.raises(InvalidArgument, match="no measured sustained clock"):
        h200.at_power_limit(500.0)
    with pytest.raises(InvalidArgument, match="default power limit is not known"):
        gpu_spec("A100").at_power_limit(300.0)


@pytest.fixture(scope="module")
def llama8b() -> tuple:
    return load_model("llama3-8b"), Layout(dp=8, micro_batch=1, seq_len=8192, flash_attention=True)


def test_with_memory_free_a_micro_batch_stretches_by_exactly_the_clock_ratio(llama8b: tuple) -> None:
    model, lay = llama8b
    free = replace(gpu_spec("H100"), hbm_GBps=math.inf)
    full, capped = (microbatch_times(model, lay, g) for g in (free, free.at_power_limit(500.0)))
    assert capped.forward_s / full.forward_s == pytest.approx(1969.0 / 1731.0, rel=1e-9)
    assert capped.backward_s / full.backward_s == pytest.approx(1969.0 / 1731.0, rel=1e-9)


def test_memory_bound_time_does_not_stretch_so_the_whole_micro_batch_stretches_less(llama8b: tuple) -> None:
    model, lay = llama8b
    h100 = gpu_spec("H100")
    full, capped = (microbatch_times(model, lay, g) for g in (h100, h100.at_power_limit(500.0)))
    assert 1.0 < capped.total_s / full.total_s < 1969.0 / 1731.0
