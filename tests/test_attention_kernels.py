"""Attention time by kernel generation: tensor-core FLOPs over the causal half of the scores and one exponential
per score and pass on the special-function units, added (FlashAttention-2) or overlapped (FlashAttention-3,
cuDNN on GPUs with asynchronous tensor cores)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from ringflow.errors import InvalidArgument
from ringflow.hardware.gpus import GPU_MODELS
from ringflow.workload.compute import EfficiencyModel, efficiency_for, gpu_spec, microbatch_times
from ringflow.workload.kernels import (
    ATTENTION_KERNELS,
    attention_pass_s,
    attention_work,
    kernel_profile,
)
from ringflow.workload.layout import Layout
from ringflow.workload.models import ModelSpec, load_model


def _layout(**kw: object) -> Layout:
    base = dict(dp=1, micro_batch=1, seq_len=8192, global_batch=1)
    base.update(kw)
    return Layout(**base)  # type: ignore[arg-type]


def _one_layer(name: str = "llama3-8b", **kw: object) -> ModelSpec:
    return replace(load_model(name), layers=1, **kw)  # type: ignore[arg-type]


def _attention_s(model: ModelSpec, gpu: str, software: str, **layout: object) -> float:
    return microbatch_times(model, _layout(**layout), gpu_spec(gpu), efficiency_for(software)).attention_s


def test_the_kernel_keeps_half_the_scores_and_recomputes_qk_in_the_backward() -> None:
    m = _one_layer()
    d, s = m.head_dim, 8192
    _, model_flops, _ = m.span_flops_per_token(s, 0, 1)
    w = attention_work(m, model_flops)
    assert w.exps == pytest.approx(m.heads * s / 2)             # causal: half of s keys per query and head
    assert w.forward_flops == pytest.approx(w.exps * 4 * d)     # QK^T and PV
    assert w.backward_flops == pytest.approx(w.exps * 10 * d)   # QK^T again, dV, dP, dQ, dK
    mla = load_model("deepseek-v3")
    dqk, dv = mla.qk_head_dim, mla.v_dim
    assert dqk != dv
    w = attention_work(mla, 1e12)
    assert w.backward_flops / w.forward_flops == pytest.approx((3 * dqk + 2 * dv) / (dqk + dv))


def test_h100_exponentials_take_half_the_tensor_time_at_head_dim_128_as_flashattention3_counts() -> None:
    h100 = GPU_MODELS["H100"]
    assert h100.exp_per_s == pytest.approx(3.9e12, rel=0.01)   # "only 3.9 TFLOPS of special functions"
    w = attention_work(_one_layer(), 1e12)
    peak = h100.bf16_tflops * 1e12  # type: ignore[operator]
    tensor = attention_pass_s("flash3", replace(w, exps=0.0), "forward", peak, h100.exp_per_s, True)
    exps = attention_pass_s("flash2", replace(w, forward_flops=0.0), "forward", peak, h100.exp_per_s, True)
    assert exps / tensor == pytest.approx(0.5, rel=0.01)        # 512x the FLOPs, 256x lower throughput


def test_a_pass_is_tensor_bound_or_exponential_bound_by_its_shape() -> None:
    gb200 = gpu_spec("GB200")
    rate = gb200.bf16_flops * 0.7
    wide = attention_work(_one_layer(), 1e12)                    # head_dim 128
    narrow = attention_work(_one_layer(head_dim=32), 1e12)       # same FLOPs, four times the scores
    for w in (wide, narrow):
        tensor_s, exp_s = w.forward_flops / rate, w.exps / gb200.exp_per_s
        overlapped = attention_pass_s("cudnn", w, "forward", rate, gb200.exp_per_s, gb200.async_mma)
        assert overlapped == pytest.approx(max(tensor_s, exp_s))
    assert wide.forward_flops / rate > wide.exps / gb200.exp_per_s        # tensor-bound
    assert narrow.forward_flops / rate < narrow.exps / gb200.exp_per_s    # exponential-bound


def test_flashattention2_is_slower_than_the_overlapped_kernels_only_where_tensor_cores_run_async() -> None:
    m = _one_layer()
    w = attention_work(m, m.span_flops_per_token(8192, 0, 1)[1])
    for name in ("H100", "B200", "A100"):
        g = gpu_spec(name)
        rate = g.bf16_flops * 0.7
        for pass_ in ("forward", "backward"):
            fa2, fa3, cudnn = (attention_pass_s(k, w, pass_, rate, g.exp_per_s, g.async_mma)
                               for k in ("flash2", "flash3", "cudnn"))
            assert fa3 == cudnn
            if g.async_mma:
                assert fa2 > fa3
            else:
                assert fa2 == pytest.approx(fa3)
    # through the compute model: torchtitan's SDPA (FlashAttention-2) against Megatron-Core's cuDNN attention
    assert _attention_s(m, "H100", "torchtitan-eager") > _attention_s(m, "H100", "megatron-core-2025")
    assert _attention_s(m, "A100", "torchtitan-eager") == pytest.approx(_attention_s(m, "A100", "megatron-core-2025"))


def test_gb300_runs_attention_faster_than_gb200_only_where_the_exponentials_bind() -> None:
    narrow, wide = _one_layer(head_dim=64), _one_layer()
    assert GPU_MODELS["GB300"].exp_per_s > 2 * GPU_MODELS["GB200"].exp_per_s
    assert _attention_s(narrow, "GB300", "megatron-core-2025") < _attention_s(narrow, "GB200", "megatron-core-2025")
    assert _attention_s(wide, "GB300", "megatron-core-2025") == pytest.approx(
        _attention_s(wide, "GB200", "megatron-core-2025"))   # tensor-bound: same tensor cores
    assert _attention_s(wide, "GB300", "torchtitan-eager") < _attention_s(wide, "GB200", "torchtitan-eager")


def test_triton_flash_attention_takes_its_published_factors_over_flashattention2() -> None:
    g = gpu_spec("A100")
    w = attention_work(_one_layer("mpt-7b"), 1e12)
    for pass_, factor in (("forward", 1.4), ("backward", 2.0)):
        fa2 = attention_pass_s("flash2", w, pass_, 2e14, g.exp_per_s, g.async_mma)
        assert attention_pass_s("triton-flash", w, pass_, 2e14, g.exp_per_s, g.async_mma) == pytest.approx(
            factor * fa2)
    m = _one_layer("mpt-7b")
    assert _attention_s(m, "H100", "llm-foundry-2023", seq_len=2048) > _attention_s(
        m, "H100", "torchtitan-eager", seq_len=2048)


def test_without_flashattention_the_full_square_runs_at_the_gemm_rate_whatever_the_kernel() -> None:
    m = _one_layer()
    layout = _layout(flash_attention=False)
    g = gpu_spec("H100")
    e = EfficiencyModel(gemm_tables=False)   # the curve's rate (the GEMM table's rate is tested in test_gemm_tables)
    times = {sw: microbatch_times(m, layout, g, efficiency_for(sw, e)).attention_s
             for sw in ("megatron-core-2025", "torchtitan-eager", "llm-foundry-2023")}
    rate = g.bf16_flops * e.gemm_efficiency(m.hidden, 8192)
    expected = 3 * 8192 * m.span_flops_per_token(8192, 0, 1)[1] / rate
    assert all(t == pytest.approx(expected) for t in times.values())


def test_each_framework_names_its_attention_kernel_and_every_gpu_its_exponential_rate() -> None:
    assert kernel_profile("megatron-te").attention == "cudnn"
    assert kernel_profile("torchtitan-eager").attention == "flash2"
    assert kernel_profile("torchtitan-compile").attention == "flash2"
    assert kernel_profile("llm-foundry-2023").attention == "triton-flash"
    assert "FusedAttention" in kernel_profile("megatron-te").source
    assert "1963fc8" in kernel_profile("torchtitan-eager").source
    assert set(ATTENTION_KERNELS) == {"flash2", "flash3", "cudnn", "triton-flash"}
    for g in GPU_MODELS.values():
        assert g.exp_per_s > 0 and g.exp_source
        assert g.async_mma == (g.name[0] in "HGB")   # Hopper and Blackwell
        assert gpu_spec(g.name).exp_per_s == g.exp_per_s
    assert "assumed" in GPU_MODELS["H20"].exp_source


def test_unknown_kernels_passes_and_rates_are_refused_by_name() -> None:
    w = attention_work(_one_layer(), 1e12)
    with pytest.raises(InvalidArgument, match="attention='flash5'"):
        replace(kernel_profile("megatron-te"), attention="flash5")
    with pytest.raises(InvalidArgument, match="attention kernel 'xformers'"):
        attention_pass_s("xformers", w, "forward", 1e15, 1e12, True)
    with pytest.raises(InvalidArgument, match="pass 'sideways'"):
        attention_pass_s("flash2", w, "sideways", 1e15, 1e12, True)
    with pytest.raises(InvalidArgument, match="flops_per_s=0"):
        attention_pass_s("flash2", w, "forward", 0, 1e12, True)
