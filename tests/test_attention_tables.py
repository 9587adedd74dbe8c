"""Published attention-kernel tables: the FlashAttention-3 paper's H100 measurements, read along sequence length
and head dimension, scaled to a GPU's peak, and used in place of the mechanism where they cover the GPU."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ringflow.errors import InvalidArgument
from ringflow.workload.attention_tables import measured_flops, table_for, tables
from ringflow.workload.compute import efficiency_for, gpu_spec, microbatch_times
from ringflow.workload.kernels import attention_work
from ringflow.workload.layout import Layout
from ringflow.workload.models import load_model

H100_PEAK = 989.5e12


def test_table_points_are_returned_as_published_and_interpolated_in_log_sequence_length() -> None:
    t = table_for("H100", "flash2")
    assert t is not None and t.peak_tflops == 989.5
    row = t.rates["flash2"]["forward_causal"][128]
    assert measured_flops("H100", H100_PEAK, "flash2", "forward", 128, 8192) == pytest.approx(row[4] * 1e12)
    mid = measured_flops("H100", H100_PEAK, "flash2", "forward", 128, 8192 * 2 ** 0.5)
    assert mid == pytest.approx((row[4] + row[5]) / 2 * 1e12)
    # flat beyond the measured lengths
    assert measured_flops("H100", H100_PEAK, "flash2", "forward", 128, 262144) == pytest.approx(row[-1] * 1e12)
    assert measured_flops("H100", H100_PEAK, "flash2", "forward", 128, 128) == pytest.approx(row[0] * 1e12)


def test_head_dimensions_between_tables_interpolate_and_outside_take_the_nearest() -> None:
    r64, r128 = (measured_flops("H100", H100_PEAK, "cudnn", "forward", d, 4096) for d in (64, 128))
    assert r64 is not None and r128 is not None and r64 < r128
    assert measured_flops("H100", H100_PEAK, "cudnn", "forward", 96, 4096) == pytest.approx((r64 + r128) / 2)
    assert measured_flops("H100", H100_PEAK, "cudnn", "forward", 192, 4096) == pytest.approx(r128)


def test_a_causal_backward_loses_what_the_causal_forward_loses_to_the_masked_tiles() -> None:
    rates = table_for("H100", "flash3").rates["flash3"]  # type: ignore[union-attr]
    i = 3   # 4k
    expected = rates["backward"][128][i] * rates["forward_causal"][128][i] / rates["forward"][128][i]
    got = measured_flops("H100", H100_PEAK, "flash3", "backward", 128, 4096)
    assert got == pytest.approx(expected * 1e12)
    full = measured_flops("H100", H100_PEAK, "flash3", "backward", 128, 4096, causal=False)
    assert full == pytest.approx(rates["backward"][128][i] * 1e12) and got < full


def test_a_gpu_of_the_table_gpus_kind_scales_by_its_peak_and_others_have_no_table() -> None:
    base = measured_flops("H100", H100_PEAK, "flash2", "forward", 128, 8192)
    capped = measured_flops("H100", 912.5e12, "flash2", "forward", 128, 8192)
    assert base is not None and capped == pytest.approx(base * 912.5 / 989.5)
    assert measured_flops("H800", H100_PEAK, "flash2", "forward", 128, 8192) == pytest.approx(base)
    for gpu in ("A100", "B200", "GB300"):
        assert measured_flops(gpu, 2.25e15, "flash2", "forward", 128, 8192) is None
    assert measured_flops("H100", H100_PEAK, "triton-flash", "forward", 128, 8192) is None


def test_the_measured_generations_rank_as_the_paper_found_at_long_sequences() -> None:
    for pass_ in ("forward", "backward"):
        fa2, cudnn, fa3 = (measured_flops("H100", H100_PEAK, k, pass_, 128, 16384)
                           for k in ("flash2", "cudnn", "flash3"))
        assert fa2 is not None and cudnn is not None and fa3 is not None
        assert fa2 < cudnn < fa3


def test_bad_arguments_and_a_malformed_table_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="pass"):
        measured_flops("H100", H100_PEAK, "flash2", "sideways", 128, 8192)
    with pytest.raises(InvalidArgument, match="head_dim"):
        measured_flops("H100", H100_PEAK, "flash2", "forward", 0, 8192)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables:\n  - gpu: X\n    peak_tflops: 1\n    applies_to: [X]\n    source: s\n"
                   "    seq_len: [512, 1024]\n    kernels:\n      k:\n        forward: {64: [1, 2]}\n"
                   "        forward_causal: {64: [1]}\n        backward: {64: [1, 2]}\n")
    with pytest.raises(InvalidArgument, match="one per sequence length"):
        tables(str(bad))


def test_on_h100_an_attention_pass_runs_at_the_table_rate_of_the_profiles_kernel() -> None:
    m = replace(load_model("llama3-8b"), layers=1)
    lay = Layout(dp=1, micro_batch=1, seq_len=8192, global_batch=1)
    gpu = gpu_spec("H100")
    _, attn_model_flops, _ = m.span_flops_per_token(8192, 0, 1)
    work = attention_work(m, 8192 * attn_model_flops)
    for software, kernel in (("torchtitan-eager", "flash2"), ("megatron-core-2025", "cudnn")):
        mb = microbatch_times(m, lay, gpu, efficiency_for(software))
        fwd = measured_flops("H100", gpu.bf16_flops, kernel, "forward", m.qk_head_dim, 8192)
        bwd = measured_flops("H100", gpu.bf16_flops, kernel, "backward", m.qk_head_dim, 8192)
        assert fwd is not None and bwd is not None
        assert mb.attention_s == pytest.approx(work.forward_flops / fwd + work.backward_flops / bwd, rel=1e-9)


def test_a_measured_causal_backward_is_read_where_a_table_has_one_and_derived_where_not() -> None:
    t = table_for("H200", "cudnn")
    assert t is not None and "backward_causal" in t.rates["cudnn"]
    row = t.rates["cudnn"]["backward_causal"][128]
    got = measured_flops("H200", H100_PEAK, "cudnn", "backward", 128, t.seq_len[3])
    assert got == pytest.approx(row[3] * 1e12)
    paper = table_for("H100", "cudnn")
    assert paper is not None and "backward_causal" not in paper.rates["cudnn"]
    derived = measured_flops("H100", H100_PEAK, "cudnn", "backward", 128, 8192)
    r = paper.rates["cudnn"]
    i = paper.seq_len.index(8192)
    assert derived == pytest.approx(r["backward"][128][i] * r["forward_causal"][128][i] / r["forward"][128][i] * 1e12)
