"""NVSwitch adder bound on NVLS, NVLS-Tree across servers, FP8-saved activations, activation offloading,
the routed-expert roofline, and the fitted switch reduction rate."""
from __future__ import annotations

import pytest

from ringflow.algorithms.schedule import Collective
from ringflow.errors import ConfigError, InvalidArgument
from ringflow.hardware.nvlink import NVSWITCH_REDUCE_GFLOPS
from ringflow.sim.api import choose_algorithm, simulate
from ringflow.sim.nvls import nvls_switch, reduce_bound_us
from ringflow.sim.params import params_for
from ringflow.topology import build_cluster, load_topology
from ringflow.workload import published
from ringflow.workload.compute import expert_roofline_s
from ringflow.workload.layout import Layout
from ringflow.workload.memory import activation_bytes_per_layer, stage_memory
from ringflow.workload.models import ModelSpec, load_model

GiB = 2**30


@pytest.fixture(scope="module")
def nvl72():
    return load_topology("gb200-nvl72")


def test_nvls_on_72_gpus_is_paced_by_the_switch_adders(nvl72) -> None:
    rate = 400.0
    node, _gen = nvls_switch(nvl72, nvl72.endpoints())
    chips = nvl72.graph.nodes[node]["chips"]
    res = simulate(nvl72, "all_reduce", 8 * GiB, algorithm="nvls", nsegs=8, params={"nvls_reduce_gflops": rate})
    # n - 1 adds per 32-bit word over `chips` adders: busbw = 2 (n-1)/n x S / t = 8 chips rate / n
    n = 72
    t_us = (n - 1) * (8 * GiB / 4) / (chips * rate * 1e9) * 1e6
    assert res.time_us == pytest.approx(t_us, rel=1e-9)
    assert res.busbw_GBps == pytest.approx(8 * chips * rate / n, rel=1e-3)
    assert any("NVSwitch adders" in note for note in res.notes) and res.bound == "nvls_reduce"


def test_the_adder_bound_scales_with_the_rate_and_leaves_hopper_alone(nvl72) -> None:
    slow = simulate(nvl72, "all_reduce", 8 * GiB, algorithm="nvls", nsegs=8, params={"nvls_reduce_gflops": 300.0})
    fast = simulate(nvl72, "all_reduce", 8 * GiB, algorithm="nvls", nsegs=8, params={"nvls_reduce_gflops": 350.0})
    assert slow.busbw_GBps / fast.busbw_GBps == pytest.approx(300 / 350, rel=1e-6)
    h100 = load_topology("dgx-h100")
    res = simulate(h100, "all_reduce", 8 * GiB, algorithm="nvls")
    bound = reduce_bound_us(h100, h100.endpoints(), res.collective, 8, 8 * GiB, params_for(h100))
    assert 0 < bound < res.time_us                   # four gen-3 chips for 8 GPUs: the links pace it
    assert not any("NVSwitch adders" in note for note in res.notes) and not res.bound
    assert set(NVSWITCH_REDUCE_GFLOPS) >= {3, 4}


def test_all_gather_is_not_bounded_by_adders(nvl72) -> None:
    prm = params_for(nvl72)
    assert reduce_bound_us(nvl72, nvl72.endpoints(), Collective.ALL_GATHER, 72, GiB, prm) == 0.0
    assert reduce_bound_us(nvl72, nvl72.endpoints(), Collective.REDUCE_SCATTER, 72, GiB / 72, prm) == \
        pytest.approx(reduce_bound_us(nvl72, nvl72.endpoints(), Collective.ALL_REDUCE, 72, GiB, prm))


def test_nvls_tree_is_chosen_across_two_hopper_servers_when_faster() -> None:
    two = build_cluster(load_topology("dgx-h100"), 2)
    algo = choose_algorithm(two, "all_reduce", 16, 8 * GiB)
    tree = simulate(two, "all_reduce", 8 * GiB, algorithm="nvls_tree").time_us
    ring = simulate(two, "all_reduce", 8 * GiB, algorithm="ring").time_us
    assert algo == ("nvls_tree" if tree < ring else "ring")
    assert simulate(two, "all_reduce", 8 * GiB).algorithm == algo


def test_nvls_tree_with_more_ranks_than_endpoints_is_a_typed_error() -> None:
    two = build_cluster(load_topology("dgx-h100"), 2)
    with pytest.raises(InvalidArgument, match="endpoints"):
        simulate(two, "all_reduce", GiB, algorithm="nvls_tree", nranks=32)
    with pytest.raises(InvalidArgument):
        simulate(two, "all_reduce", GiB, algorithm="nvls_tree", nranks=1)
    assert simulate(two, "all_reduce", GiB, algorithm="nvls_tree").busbw_GBps > 0


def test_fp8_keeps_gemm_inputs_in_one_byte_llama3_70b_hand_computed() -> None:
    m = load_model("llama3-70b")
    lay = Layout(tp=4, pp=8, dp=2, interleave=5, micro_batch=1, global_batch=128, seq_len=8192, zero=1,
                 sequence_parallel=True, precision="fp8", fp8_params=True)
    s, h = 8192, 8192
    assert (m.hidden, m.heads, m.kv_hidden, m.ffn_hidden) == (8192, 64, 1024, 28672)
    # per TP rank with SP: (norm inputs 4 + QKV input 1 + MLP input 1) s h; Q, K, V 2 bytes, O input 1 byte;
    # up/gate output 2 x 2 bytes, down input 1 byte per ffn column
    expected = ((4 + 1 + 1) * s * h + (2 * (8192 + 1024 + 1024) + 8192) * s + (2 * 2 + 1) * 28672 * s) / 4
    assert activation_bytes_per_layer(m, lay, "none", index=0) == expected == 452_984_832
    bf16 = activation_bytes_per_layer(m, lay.with_(precision="bf16", fp8_params=False), "none", index=0)
    assert bf16 - expected == (2 * h + 8192 + 28672) * s / 4


def test_offloaded_layers_leave_the_gpu() -> None:
    m = load_model("llama3-8b")
    base = Layout(dp=8, micro_batch=2, global_batch=128, seq_len=8192, zero=3, precision="fp8", fp8_params=True)
    full = stage_memory(m, base, 0, 180e9).activations_bytes
    half = stage_memory(m, base.with_(offload_layers=m.layers // 2), 0, 180e9).activations_bytes
    logits = 4.0 * 2 * 8192 * m.vocab
    assert half - logits == pytest.approx((full - logits) / 2)
    with pytest.raises(ConfigError, match="offload_layers"):
        base.with_(offload_layers=-1)


def test_published_megatron_layout_fits_in_memory() -> None:
    case = next(c for c in published.load_cases() if c["id"] == "bridge-25.11-h100-llama3-70b-fp8")
    pr = published.predict(case, published.Constants.defaults())
    assert pr.info["fits_in_memory"] is True


def test_expert_roofline_hand_computed() -> None:
    # 1e11 FLOPs at 1e15 FLOP/s = 0.1 ms; 1e9 weights of 2 bytes at 2e12 B/s = 1 ms: the weights bind
    fwd, bwd = expert_roofline_s(1e11, 1e9, 2, 1e15, 2e12, grad_bytes=4)
    assert fwd == pytest.approx(1e-3)
    assert bwd == pytest.approx(1e9 * (2 + 2 * 4) / 2e12)
    fwd, bwd = expert_roofline_s(1e13, 1e6, 2, 1e15, 2e12)      # many tokens: the FLOPs bind
    assert (fwd, bwd) == (pytest.approx(1e-2), pytest.approx(2e-2))
    assert expert_roofline_s(0.0, 1e9, 2, 1e15, 2e12) == (0.0, 0.0)


def test_few_tokens_per_expert_are_weight_bound() -> None:
    from ringflow.workload.compute import gpu_spec, microbatch_times
    moe = ModelSpec(name="tiny-moe", layers=4, hidden=2048, heads=16, kv_heads=4, ffn_hidden=768, vocab=32000,
                    seq_len=4096, experts=128, top_k=8)
    gpu = gpu_spec("H100")
    short = microbatch_times(moe, Layout(micro_batch=1, global_batch=1, seq_len=16), gpu)
    long = microbatch_times(moe, Layout(micro_batch=1, global_batch=1, seq_len=4096), gpu)
    # 256x the tokens, far less than 256x the time: at 16 tokens the expert weights' traffic sets it
    assert long.total_s / short.total_s < 256 / 4


def test_fit_learns_the_switch_rate_from_bound_fitting_cases_only() -> None:
    def case(cid: str, sett: str, value: float) -> dict:
        return {"id": cid, "kind": "collective", "set": sett, "value": value, "generation": "blackwell"}

    def predictor(c: dict, k: published.Constants) -> published.Prediction:
        rate = k.nvls_reduce_gflops or NVSWITCH_REDUCE_GFLOPS[4]
        return published.Prediction(2.0 * rate, "ok", {"link_class": "nvls_reduce"})

    cases = [case("a", "fit", 830.0), case("b", "held_out", 10.0)]
    k = published.fit(cases, predictor)
    assert k.nvls_reduce_gflops == pytest.approx(415.0)
    assert k.fitted_on["nvls_reduce_gflops"] == ["a"]
    assert k.sim_overrides()["nvls_reduce_gflops"] == pytest.approx(415.0)


def test_nvlink_generations_scale_by_nccls_per_link_figures() -> None:
    from ringflow.hardware.nvlink import nvlink_efficiency_scale
    assert nvlink_efficiency_scale(4) == 1.0
    assert nvlink_efficiency_scale(3) == pytest.approx((20.0 / 25.0) / (20.6 / 25.0))
    assert nvlink_efficiency_scale(5) == pytest.approx((40.1 / 50.0) / (20.6 / 25.0))
    assert nvlink_efficiency_scale(None) == 1.0
    eff = {"link_efficiency": {"nvlink": 0.8}}
    a100 = simulate(load_topology("dgx-a100"), "all_reduce", GiB, algorithm="ring", params=eff).busbw_GBps
    h100 = simulate(load_topology("dgx-h100"), "all_reduce", GiB, algorithm="ring", params=eff).busbw_GBps
    # the same ring on 12 x 25 and 18 x 25 GB/s of NVLink: busbw ratio = link ratio x the generation scale
    assert a100 / h100 == pytest.approx(12 / 18 * nvlink_efficiency_scale(3), rel=0.02)
