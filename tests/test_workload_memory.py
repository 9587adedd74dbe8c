"""Memory per GPU: every published run that ran fits under the settings its source states; model state as
Megatron documents it, recompute modules, FP8 weight copies per GPU, FSDP resharding, offload, allowances."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ringflow.errors import ConfigError
from ringflow.workload.layout import Layout
from ringflow.workload.memory import (
    MemoryPolicy,
    activation_bytes_per_layer,
    communicators,
    load_allowances,
    memory_per_gpu,
    overhead_bytes,
    peak_memory,
    stage_memory,
    stage_param_split,
    weight_bytes,
)
from ringflow.workload.memory_cases import GIB, case_layout, case_memory, measured_memory
from ringflow.workload.models import load_model
from ringflow.workload.published import load_cases

RAN = [c for c in load_cases() if c["kind"] == "training" and c.get("layout")]


@pytest.mark.parametrize("case", RAN, ids=[c["id"] for c in RAN])
def test_every_published_run_fits_under_its_stated_memory_settings(case):
    m = case_memory(case)
    assert m.fits, f"{case['id']}: {m.total_bytes / 1e9:.1f} GB of {m.capacity_bytes / 1e9:.0f} GB"


def test_layout_without_sharding_that_cannot_fit_still_does_not():
    m = load_model("llama3-405b")
    lay = Layout(dp=8, zero=0, global_batch=8, seq_len=8192)  # 405B replicated on each of 8 GPUs
    mem = peak_memory(m, lay, 80e9, policy=MemoryPolicy(grad_bytes=2, recompute_modules=("mlp",)))
    assert not mem.fits and mem.weights_bytes > 800e9


def test_distributed_optimizer_bytes_per_parameter_as_megatron_documents():
    m = load_model("llama3-8b")
    lay = Layout(dp=8, zero=1, global_batch=8, seq_len=2048)
    p = sum(stage_param_split(m, lay, 0))
    fp32 = stage_memory(m, lay, 0, 80e9)
    assert fp32.weights_bytes + fp32.grads_bytes + fp32.optimizer_bytes == pytest.approx(p * (6 + 12 / 8))
    assert fp32.step_temp_bytes == 0
    bf16 = stage_memory(m, lay, 0, 80e9, policy=MemoryPolicy(grad_bytes=2))
    # 16-bit params and grads: 4 + 16/d, the 4/d being the fp32 grad shard the optimizer steps on
    assert bf16.weights_bytes + bf16.grads_bytes + bf16.optimizer_bytes + bf16.step_temp_bytes == \
        pytest.approx(p * (4 + 16 / 8))
    assert bf16.total_bytes == pytest.approx(bf16.weights_bytes + bf16.grads_bytes + bf16.optimizer_bytes +
                                             max(bf16.activations_bytes, bf16.step_temp_bytes) +
                                             bf16.overhead_bytes)


def test_recompute_modules_drop_the_tensors_they_rebuild():
    ds = load_model("deepseek-v3")
    lay = Layout(tp=2, dp=8, ep=8, etp=1, global_batch=8, seq_len=4096, sequence_parallel=True)
    s, t, moe = 4096, 2, ds.layers - 1
    base = activation_bytes_per_layer(ds, lay, index=moe)
    up = base - activation_bytes_per_layer(ds, lay, index=moe, modules=("mla_up_proj",))
    assert up == pytest.approx(2 * (ds.q_width + ds.kv_hidden + ds.v_width) * s / t)
    act = base - activation_bytes_per_layer(ds, lay, index=moe, modules=("moe_act",))
    assert act == pytest.approx(2 * s * ds.moe_ffn * ds.top_k / t)
    norm = base - activation_bytes_per_layer(ds, lay, index=moe, modules=("layernorm",))
    assert norm == pytest.approx((2 + 2) * s * ds.hidden / t)  # MLA's input-norm output and the router input
    llama = load_model("llama3-8b")
    dense = Layout(dp=8, global_batch=8, seq_len=4096)
    mlp = activation_bytes_per_layer(llama, dense) - activation_bytes_per_layer(llama, dense, modules=("mlp",))
    assert mlp == pytest.approx((2 * 2 + 2) * 4096 * llama.ffn_hidden)
    assert activation_bytes_per_layer(llama, dense, modules=("layernorm",)) == activation_bytes_per_layer(llama, dense)


def test_bad_memory_settings_are_config_errors_naming_the_choices():
    with pytest.raises(ConfigError, match="mla_up_proj"):
        MemoryPolicy(recompute_modules=("attention",))
    with pytest.raises(ConfigError, match="expandable"):
        MemoryPolicy(allocator="buddy")
    with pytest.raises(ConfigError, match="fraction"):
        MemoryPolicy(optimizer_offload_fraction=1.5)
    with pytest.raises(ConfigError, match="allocator"):
        MemoryPolicy.from_dict({"alocator": "classic"})


def test_fp8_weight_copies_per_gpu_generation():
    assert weight_bytes("fp8", fp8_params=True, gpu="H100") == 2        # data + transpose (TN-only FP8 GEMMs)
    assert weight_bytes("fp8", fp8_params=True, gpu="GB200") == 1       # non-TN FP8 GEMMs on Blackwell
    assert weight_bytes("fp8", fp8_params=True, gpu="GB200", fp8_recipe="block") == 2  # MXFP8 row + column
    assert weight_bytes("fp8", fp8_params=False, gpu="B200") == 3
    assert weight_bytes("bf16", gpu="GB200") == 2


def test_fsdp_resharding_after_forward_holds_two_layers_not_the_stage():
    m = load_model("llama3-70b")
    lay = Layout(dp=64, zero=3, global_batch=64, seq_len=4096, recompute="full")
    resh = stage_memory(m, lay, 0, 80e9)
    keep = stage_memory(m, lay, 0, 80e9, policy=MemoryPolicy(reshard_after_forward=False))
    p = sum(stage_param_split(m, lay, 0))
    assert resh.weights_bytes == pytest.approx(2 * p / 64 + 2 * 2 * m.layer_params())
    assert keep.weights_bytes == pytest.approx(2 * p)


def test_optimizer_offload_moves_its_fraction_to_the_host():
    m = load_model("llama3-8b")
    lay = Layout(dp=8, zero=1, global_batch=8, seq_len=2048)
    full = stage_memory(m, lay, 0, 80e9).optimizer_bytes
    assert stage_memory(m, lay, 0, 80e9, policy=MemoryPolicy(optimizer_offload_fraction=0.75)).optimizer_bytes \
        == pytest.approx(full / 4)


def test_overhead_is_context_nccl_buffers_and_fragmentation():
    a = load_allowances()
    lay = Layout(tp=8, pp=4, dp=16, ep=8, global_batch=64)   # TP, DP, PP, EP and expert-DP communicators
    assert communicators(lay) == 5
    classic = overhead_bytes(lay, 60e9, MemoryPolicy(allocator="classic"))
    assert classic["nccl_buffers_bytes"] == 5 * 4 * 2 ** 20 * 32 * 2
    assert classic["fragmentation_bytes"] == pytest.approx(0.15 * 60e9)
    assert classic["cuda_context_bytes"] == a["cuda_context_bytes"]
    assert overhead_bytes(lay, 60e9)["fragmentation_bytes"] == 0.0   # expandable segments


def test_fixed_reserve_still_replaces_the_computed_overhead():
    m = load_model("llama3-8b")
    lay = Layout(dp=8, global_batch=8, seq_len=2048)
    assert memory_per_gpu(m, lay, 80e9, 5e9).overhead_bytes == 5e9
    assert memory_per_gpu(m, lay, 80e9).overhead_bytes < 5e9


def test_case_layout_refuses_gpus_that_do_not_divide():
    with pytest.raises(ConfigError, match="multiple"):
        case_layout({"id": "x", "gpus": 10, "layout": {"tp": 4}})


def test_docs_table_of_predicted_against_published_memory_is_current():
    text = (Path(__file__).resolve().parents[1] / "docs" / "workload.md").read_text()
    for r in measured_memory():
        row = re.search(rf"\| `{re.escape(r.id)}` \| ([\d.]+) \| ([\d.]+) \| ([+-][\d.]+) %", text)
        assert row, f"docs/workload.md has no row for {r.id}"
        assert float(row.group(1)) == round(r.published_bytes / GIB, 1)
        assert float(row.group(2)) == round(r.predicted_bytes / GIB, 1)
        assert float(row.group(3)) == round(100 * r.error, 1)


def test_bf16_adam_moments_and_dualpipe_weight_copies():
    m = load_model("llama3-8b")
    lay = Layout(pp=2, dp=4, zero=1, global_batch=8, seq_len=2048)
    base = stage_memory(m, lay, 0, 80e9)
    ds = stage_memory(m, lay, 0, 80e9, policy=MemoryPolicy(optimizer_bytes=8, weight_copies=2))
    assert ds.optimizer_bytes == pytest.approx(base.optimizer_bytes * 8 / 12)
    assert ds.weights_bytes == pytest.approx(2 * base.weights_bytes)
    with pytest.raises(ConfigError, match="weight copies"):
        MemoryPolicy(weight_copies=3)
