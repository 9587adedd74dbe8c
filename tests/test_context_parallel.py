"""torch's ring attention (torchtitan's context parallelism): per-step kernels, FP32 merge bytes, exposed exchange."""
from __future__ import annotations

import pytest

from ringflow.errors import InvalidArgument
from ringflow.workload import load_model
from ringflow.workload.commmodel import AlphaBetaModel
from ringflow.workload.compute import EfficiencyModel, gpu_spec, microbatch_times
from ringflow.workload.context_parallel import (
    merge_bytes,
    ring_calls,
    ring_elements,
    ring_exposed_s,
    ring_kernels,
    uses_torch_ring,
)
from ringflow.workload.kernels import KernelProfile
from ringflow.workload.layout import Layout
from ringflow.workload.steptime import step_time
from ringflow.workload.validation import cluster_for

TITAN = EfficiencyModel(kernels="torchtitan-compile")
EAGER = EfficiencyModel(kernels="torchtitan-eager")


def _layout(cp: int, method: str = "allgather", tp: int = 1) -> Layout:
    """Llama-3-style runs at 32k local tokens per CP rank, as torchtitan's Table 2 rows."""
    return Layout(tp=tp, cp=cp, dp=1, micro_batch=1, global_batch=1, seq_len=32768 * cp, recompute="full",
                  cp_comm=method, precision="bf16")


def test_ring_carries_k_and_v_at_the_query_heads():
    m = load_model("llama3-8b")
    el = ring_elements(m, _layout(2))
    assert el.q == el.k == 32768 * 32 * 128       # repeat_kv: 32 heads, not the 8 K/V heads
    assert el.kv_bytes == 2 * 32768 * 32 * 128 * 2
    assert ring_elements(m, _layout(2, tp=8)).k == 32768 * 4 * 128


def test_merge_bytes_for_two_ranks():
    m = load_model("llama3-8b")
    el = ring_elements(m, _layout(2))
    e = el.q
    # compiled, rank 1 (its second step uses the full query): fwd = cat 8 + casts 6 + 6 + merge 10 (x E);
    # bwd = cat 8 + first adds 6 x 3 + casts back 6 x 3 + dQ add 10 + half dK, dV adds 9 x 2
    assert merge_bytes(el, 2, 1, compiled=True) == {"forward": 30 * e, "backward": 72 * e}
    # eager, rank 0 (second step: half the query): contiguous 8 + cat 8 + casts 12 + half merge 19 + cat 8
    assert merge_bytes(el, 2, 0, compiled=False, method="p2p")["forward"] == 55 * e


def test_merge_bytes_grow_with_cp_and_eager_moves_more():
    el = ring_elements(load_model("llama3-8b"), _layout(2))
    totals = [sum(max((merge_bytes(el, cp, r, True) for r in range(cp)), key=lambda b: sum(b.values())).values())
              for cp in (2, 4, 8)]
    assert totals[0] < totals[1] < totals[2]
    assert sum(merge_bytes(el, 4, 3, False).values()) > 2 * sum(merge_bytes(el, 4, 3, True).values())


def test_bad_rank_or_method_is_a_typed_error():
    el = ring_elements(load_model("llama3-8b"), _layout(2))
    with pytest.raises(InvalidArgument, match="CP rank 2"):
        merge_bytes(el, 2, 2, True)
    with pytest.raises(InvalidArgument, match="a2a"):
        merge_bytes(el, 2, 0, True, method="a2a")
    with pytest.raises(InvalidArgument, match="context_parallel"):
        KernelProfile("x", "fused", "fused", "fused", "test", context_parallel="ulysses")


def test_only_torch_profiles_with_a_ring_exchange_use_it():
    assert uses_torch_ring(_layout(2), "torchtitan-compile")
    assert uses_torch_ring(_layout(2, "p2p"), "torchtitan-eager")
    assert not uses_torch_ring(_layout(2), "megatron-te")          # Transformer Engine's CP: layercomm's pricing
    assert not uses_torch_ring(_layout(1), "torchtitan-compile")
    assert not uses_torch_ring(_layout(2, "a2a"), "torchtitan-compile")


def test_later_steps_run_at_the_non_causal_rate():
    m, gpu = load_model("llama3-8b"), gpu_spec("H100")
    lay = _layout(4)
    k = ring_kernels(m, lay, gpu, TITAN, 1e15, m.layers, 4e14)
    assert k.step["forward"] < k.first["forward"] and k.step["backward"] < k.first["backward"]
    assert k.total_s("forward", 4) == pytest.approx(k.first["forward"] + 3 * k.step["forward"])


def test_ring_attention_adds_merge_time_in_every_pass():
    m, gpu = load_model("llama3-8b"), gpu_spec("H100")
    lay = _layout(8)
    ring = microbatch_times(m, lay, gpu, TITAN)
    te = microbatch_times(m, lay, gpu, EfficiencyModel(kernels="megatron-te"))
    eager = microbatch_times(m, lay, gpu, EAGER)
    assert ring.attention_s != te.attention_s
    mem = gpu.hbm_GBps * 1e9 * TITAN.mem_eff
    el = ring_elements(m, lay)
    fwd_merge = max((merge_bytes(el, 8, r, True) for r in range(8)), key=lambda b: sum(b.values()))["forward"]
    k = ring_kernels(m, lay, gpu, TITAN, lay.seq_len / 8 * m.span_flops_per_token(lay.seq_len, 0, m.layers)[1],
                     m.layers, 1.0)
    assert ring.attention_s > m.layers * (k.total_s("forward", 8) + fwd_merge / mem)
    assert eager.attention_s > ring.attention_s   # eager merges op by op


def test_exposed_exchange_grows_with_cp_across_servers():
    m, gpu = load_model("llama3-405b"), gpu_spec("H100")
    nic_Bps = 50e9

    def time_s(coll: str, nbytes: float) -> float:   # a ring over one 400 Gb/s NIC per GPU
        return nbytes / nic_Bps * ((1 - 1 / cp) if coll == "all_gather" else 1.0)

    out = []
    for cp in (2, 4, 8):
        lay = _layout(cp, tp=8)
        attn = 32768 * m.span_flops_per_token(lay.seq_len, 0, 16)[1] / 8
        out.append(ring_exposed_s(m, lay, gpu, TITAN, attn, 16, time_s))
    assert 0 < out[0] < out[1] < out[2]
    el = ring_elements(m, _layout(2, tp=8))
    assert out[0] >= 16 * el.kv_bytes * 2 / nic_Bps   # at least the last FP32 dK/dV send of each layer


def test_step_time_reports_the_ring_traffic():
    m = load_model("llama3-8b")
    lay = Layout(tp=1, cp=8, dp=1, micro_batch=1, global_batch=1, seq_len=262144, zero=3, fsdp_units="per_block",
                 recompute="full", cp_comm="allgather", precision="fp8")
    topo = cluster_for("dgx-h100", 1)
    r = step_time(m, lay, topo, comm=AlphaBetaModel(), eff=TITAN)
    calls = ring_calls(m, lay, m.layers)
    assert r.comm_bytes_per_step["cp"] == pytest.approx(sum(c.wire_bytes for c in calls))
    assert r.breakdown["cp_exposed"] > 0
    te = step_time(m, lay, topo, comm=AlphaBetaModel(), eff=EfficiencyModel(kernels="megatron-te"))
    assert te.comm_bytes_per_step["cp"] < r.comm_bytes_per_step["cp"]   # GQA K/V, no FP32 dK/dV
