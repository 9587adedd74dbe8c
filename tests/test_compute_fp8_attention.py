"""The attention kernel of a profile and what FP8 training costs beside its GEMMs (casts, amax, BF16 attention)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from ringflow.errors import InvalidArgument
from ringflow.workload.compute import EfficiencyModel, gpu_spec, microbatch_times
from ringflow.workload.kernels import (
    ATTENTION_KERNELS,
    CAST_READ_BYTES,
    CAST_WRITE_BYTES,
    fp8_cast_bytes_per_token,
    kernel_profile,
)
from ringflow.workload.layout import Layout
from ringflow.workload.models import load_model


def _layout(**kw: object) -> Layout:
    base = dict(dp=8, micro_batch=2, seq_len=8192, global_batch=16, zero=3)
    base.update(kw)
    return Layout(**base)  # type: ignore[arg-type]


def test_triton_flash_attention_takes_longer_by_its_published_factors() -> None:
    model, gpu, e = load_model("mpt-7b"), gpu_spec("H100"), EfficiencyModel()
    layout = _layout(seq_len=2048)
    assert kernel_profile("llm-foundry-2023").attention == "triton-flash"
    assert ATTENTION_KERNELS[kernel_profile("llm-foundry-2023").attention].factors == (1.4, 2.0)
    assert ATTENTION_KERNELS[kernel_profile("megatron-te").attention].factors == (1.0, 1.0)
    ref = microbatch_times(model, layout, gpu, e)
    triton = microbatch_times(model, layout, gpu, replace(e, kernels="llm-foundry-2023"))
    flash2 = microbatch_times(model, layout, gpu, replace(e, kernels="torchtitan-eager"))
    # (1.4, 2.0) over FlashAttention-2, itself slower than cuDNN's overlapped softmax on H100 (test_attention_kernels)
    assert ref.attention_s < flash2.attention_s < triton.attention_s < 2.0 * flash2.attention_s
    assert triton.model_flops == ref.model_flops


def test_fp8_runs_attention_at_the_bf16_rate_and_linears_faster() -> None:
    model, gpu, e = load_model("llama3-8b"), gpu_spec("H100"), EfficiencyModel()
    bf16 = microbatch_times(model, _layout(), gpu, e)
    fp8 = microbatch_times(model, _layout(precision="fp8"), gpu, e)
    assert fp8.attention_s == pytest.approx(bf16.attention_s, rel=1e-12)
    assert fp8.forward_s < bf16.forward_s and fp8.backward_s < bf16.backward_s
    assert fp8.model_flops == bf16.model_flops


def test_cast_bytes_of_a_dense_layer_count_each_operand_once_and_amax_off_the_norms() -> None:
    model = load_model("llama3-8b")
    h, f, q = model.hidden, model.ffn_hidden, model.heads * model.v_dim
    layout = _layout(precision="fp8")
    per_elem = CAST_READ_BYTES + CAST_WRITE_BYTES
    block = fp8_cast_bytes_per_token(model, layout, "block", "forward", 0, 1)
    tensorwise = fp8_cast_bytes_per_token(model, layout, "tensorwise", "forward", 0, 1)
    assert block == (2 * h + q + f) * per_elem             # QKV and fc1 inputs, proj and fc2 inputs
    assert tensorwise - block == (q + f) * CAST_READ_BYTES   # the norms' outputs bring their amax
    back = fp8_cast_bytes_per_token(model, layout, "tensorwise", "backward", 0, 1)
    qkv = model.q_width + model.kv_hidden + model.v_width
    assert back == (qkv + h + 2 * f + h) * (per_elem + CAST_READ_BYTES)
    assert fp8_cast_bytes_per_token(model, layout, "tensorwise", "forward", 0, 4) == 4 * tensorwise
    assert fp8_cast_bytes_per_token(model, _layout(), "tensorwise", "forward", 0, 4) == 0.0


def test_moe_layers_quantize_every_routed_copy() -> None:
    dense = load_model("llama3-8b")
    moe = replace(dense, name="moe-8b", experts=8, top_k=2, expert_ffn_hidden=dense.ffn_hidden // 2)
    layout = _layout(precision="fp8")
    one = replace(moe, top_k=1)
    two = fp8_cast_bytes_per_token(moe, layout, "block", "backward", 0, 1)
    single = fp8_cast_bytes_per_token(one, layout, "block", "backward", 0, 1)
    per_copy = (2 * moe.moe_ffn + moe.hidden) * (CAST_READ_BYTES + CAST_WRITE_BYTES)
    assert two - single == pytest.approx(per_copy)


def test_fp8_casts_cost_time_at_hbm_bandwidth() -> None:
    model, gpu, e = load_model("llama3-8b"), gpu_spec("H100"), EfficiencyModel()
    layout = _layout(precision="fp8")
    tw = microbatch_times(model, layout, gpu, e)
    blk = microbatch_times(model, layout, gpu, replace(e, fp8_recipe="block"))
    tokens, mem_Bps = layout.micro_batch * layout.seq_len, gpu.hbm_GBps * 1e9 * e.mem_eff
    amax_fwd = (fp8_cast_bytes_per_token(model, layout, "tensorwise", "forward", 0, model.layers)
                - fp8_cast_bytes_per_token(model, layout, "block", "forward", 0, model.layers))
    assert amax_fwd > 0
    assert tw.forward_s - blk.forward_s == pytest.approx(tokens * amax_fwd / mem_Bps, rel=1e-9)


def test_an_unknown_fp8_recipe_or_attention_kernel_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="fp8_recipe='delayed'"):
        EfficiencyModel(fp8_recipe="delayed")
    with pytest.raises(InvalidArgument, match="fp8_recipe='mx'"):
        fp8_cast_bytes_per_token(load_model("llama3-8b"), _layout(precision="fp8"), "mx", "forward", 0, 1)
    with pytest.raises(InvalidArgument, match="attention='xformers'"):
        replace(kernel_profile("megatron-te"), attention="xformers")


def test_fp8_leaves_the_output_layers_logit_gemm_in_bf16() -> None:
    model, gpu, e = load_model("llama3-8b"), gpu_spec("H100"), EfficiencyModel()

    def logit_s(precision: str) -> float:
        layout = _layout(dp=4, pp=2, precision=precision)
        last, first = (microbatch_times(model, layout, gpu, e, stage=s) for s in ("last", "first"))
        assert last.model_flops > first.model_flops
        return last.forward_s - first.forward_s

    assert logit_s("fp8") == pytest.approx(logit_s("bf16"), rel=1e-9)
