"""The measured GEMM table (ringflow/data/gemm_tables.yaml): its grid read back, wave quantization between its
points, peak scaling, the bound the planner uses, and the compute model pricing Hopper GEMMs with it."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringflow.errors import InvalidArgument
from ringflow.workload.compute import EfficiencyModel, gpu_spec, linear_gemms, microbatch_times, table_rates
from ringflow.workload.gemm_tables import gemm_flops_per_s, max_flops_per_s, table_for, tables
from ringflow.workload.layout import Layout
from ringflow.workload.models import load_model

PEAK = 989.5e12


def test_a_grid_point_reads_back_its_measured_rate_in_both_dtypes() -> None:
    t = table_for("H200")
    assert t is not None and t.sms == 132
    for dtype, peak in (("bf16", PEAK), ("fp8", 2 * PEAK)):
        shape, tflops = next((s, r) for s, r in t.rates[dtype].items() if s == (8192, 4096, 4096))
        assert gemm_flops_per_s("H200", peak, dtype, *shape) == pytest.approx(tflops * 1e12)


def test_a_width_that_leaves_the_last_wave_part_empty_is_slower_than_both_grid_neighbours() -> None:
    # 8192 x 768 outputs in 128 x 256 tiles: 192 tiles on 132 SMs, a second wave 45 % full
    t = table_for("H100")
    assert t is not None and t.wave_share(8192, 768) == pytest.approx(192 / 264)
    mid = gemm_flops_per_s("H100", PEAK, "bf16", 8192, 768, 4096)
    lo, hi = (gemm_flops_per_s("H100", PEAK, "bf16", 8192, n, 4096) for n in (512, 1024))
    assert mid is not None and lo is not None and hi is not None and mid < 0.85 * min(lo, hi)


def test_rates_scale_with_the_peak_and_gpus_without_a_table_have_none() -> None:
    base = gemm_flops_per_s("H800", PEAK, "bf16", 8192, 6144, 4096)
    assert base is not None
    assert gemm_flops_per_s("H800", PEAK / 2, "bf16", 8192, 6144, 4096) == pytest.approx(base / 2)
    for gpu in ("A100", "B200", "GB300", "H20"):
        assert gemm_flops_per_s(gpu, PEAK, "bf16", 8192, 6144, 4096) is None
        assert max_flops_per_s(gpu, PEAK, "bf16") is None


@settings(max_examples=60, deadline=None)
@given(st.floats(16, 200_000), st.floats(16, 200_000), st.floats(16, 200_000), st.sampled_from(["bf16", "fp8"]))
def test_no_shape_runs_faster_than_the_bound_the_planner_uses(m: float, n: float, k: float, dtype: str) -> None:
    rate = gemm_flops_per_s("H100", PEAK, dtype, m, n, k)
    bound = max_flops_per_s("H100", PEAK, dtype)
    assert rate is not None and bound is not None and 0 < rate <= bound * (1 + 1e-12)


def test_bad_arguments_and_a_malformed_table_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="dtype"):
        gemm_flops_per_s("H100", PEAK, "fp4", 1, 1, 1)
    with pytest.raises(InvalidArgument, match="positive sizes"):
        gemm_flops_per_s("H100", PEAK, "bf16", 0, 1, 1)
    bad = tmp_path / "gemm.yaml"
    bad.write_text("tables:\n- gpu: X\n  peak_tflops: {bf16: 1}\n  applies_to: [X]\n  source: s\n  sms: 1\n"
                   "  tile: [1, 1]\n  columns: [m, n, k, bf16_tflops]\n  rows:\n  - [1, 1, 1, -2]\n")
    with pytest.raises(InvalidArgument, match="positive"):
        tables(str(bad))


def test_the_compute_model_prices_a_hopper_layers_gemms_at_the_tables_rates() -> None:
    m = load_model("llama3-8b")
    lay = Layout(tp=2, pp=1, dp=1, micro_batch=1, global_batch=1, seq_len=8192)
    gpu = gpu_spec("H200")
    rates = table_rates(gpu, "bf16", linear_gemms(m, lay, 8192))
    assert rates is not None
    fwd_rate, bwd_rate = rates

    def one_layer(e: EfficiencyModel) -> tuple[float, float]:   # two layers less one: the logits cancel
        two, one = (microbatch_times(replace(m, layers=n), lay, gpu, e) for n in (2, 1))
        return two.forward_s - one.forward_s, two.backward_s - one.backward_s
    (f_on, b_on), (f_off, b_off) = (one_layer(EfficiencyModel(gemm_tables=t)) for t in (True, False))
    flops = 8192 * m.span_flops_per_token(8192, 0, 1)[0] / 2   # one layer's linear FLOPs on one of 2 TP ranks
    curve = gpu.bf16_flops * EfficiencyModel().gemm_efficiency(m.hidden / 2, 8192)
    assert f_on - f_off == pytest.approx(flops / fwd_rate - flops / curve)
    assert b_on - b_off == pytest.approx(2 * flops / bwd_rate - 2 * flops / curve)
    assert table_rates(gpu_spec("A100"), "bf16", linear_gemms(m, lay, 8192)) is None
