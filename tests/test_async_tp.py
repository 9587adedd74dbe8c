"""TP communication overlap by mechanism: async TP (PyTorch micro-pipelining) and Transformer Engine userbuffers."""
from __future__ import annotations

import pytest

from ringflow.errors import ConfigError, InvalidArgument
from ringflow.workload import load_model
from ringflow.workload.commmodel import AlphaBetaModel
from ringflow.workload.layercomm import stage_calls
from ringflow.workload.layout import Layout
from ringflow.workload.steptime import step_time
from ringflow.workload.tpoverlap import TpPiece, piece_exposed_s, tp_pieces
from ringflow.workload.validation import cluster_for

M70 = load_model("llama3-70b")
BASE = Layout(tp=8, dp=1, micro_batch=2, global_batch=2, seq_len=8192, recompute="full", sequence_parallel=True,
              precision="fp8")


def test_decomposed_collective_hides_its_copies_while_a_chunk_gemm_outlasts_a_chunk_copy():
    tp, mem, hop = 4, 1e12, 1e-6
    ag = TpPiece("all_gather", "forward", 4e8, 4e12, "decomposed", 1)
    # GEMM 4 s (1 s a chunk), collective 0.9 s (0.3 s a chunk copy): only the local shard copy and barriers show
    assert piece_exposed_s(ag, tp, 0.9, 1e12, 1e12, mem, hop) == pytest.approx(2 * 1e8 / mem + tp * hop)
    # collective 6 s (2 s a chunk copy): the copies pace it, 1 + 3 x 2 = 7 s against the 4 s GEMM
    assert piece_exposed_s(ag, tp, 6.0, 1e12, 1e12, mem, hop) == pytest.approx(3.0 + 2e8 / mem + tp * hop)
    # chunks at a lower efficiency than the whole GEMM cost their difference even when the copies hide
    assert piece_exposed_s(ag, tp, 0.9, 1e12, 0.8e12, mem, hop) == pytest.approx(1.0 + 2e8 / mem + tp * hop)
    rs = TpPiece("reduce_scatter", "forward", 4e8, 4e12, "decomposed", 1)
    # the reduce-scatter ends by summing tp partial chunks: read 4 x 1e8, write 1e8
    assert piece_exposed_s(rs, tp, 0.9, 1e12, 1e12, mem, hop) == pytest.approx(5e8 / mem + tp * hop)
    bulk = TpPiece("reduce_scatter", "backward", 4e8, 4e12, "bulk", 1)
    assert piece_exposed_s(bulk, tp, 5.0, 1e12, 1e12, mem, hop) == pytest.approx(1.0)
    assert piece_exposed_s(bulk, tp, 3.0, 1e12, 1e12, mem, hop) == 0.0
    exposed = TpPiece("reduce_scatter", "backward", 4e8, 4e12, "exposed", 1)
    assert piece_exposed_s(exposed, tp, 3.0, 1e12, 1e12, mem, hop) == 3.0


def test_async_tp_leaves_the_backward_input_gradient_reduce_scatters_to_nccl():
    asy = tp_pieces(M70, BASE.with_(overlap_tp=True, tp_overlap="async_tp"), 0, 80, 1.0, 2.0)
    ub = tp_pieces(M70, BASE.with_(overlap_tp=True), 0, 80, 1.0, 2.0)
    how = {(p.collective, p.pass_, p.how) for p in asy}
    assert ("reduce_scatter", "backward", "exposed") in how
    assert all(p.how == "decomposed" for p in asy if p.pass_ != "backward" or p.collective == "all_gather")
    assert {p.how for p in ub if p.collective == "reduce_scatter" and p.pass_ == "backward"} == {"bulk"}
    # attention and MLP regions, forward + backward + recompute, an all-gather and a reduce-scatter each
    assert sum(p.count for p in asy) == 2 * 80 * 3 * 2
    # the reduce-scatter after O decomposes with O's GEMM, the all-gather before QKV with QKV's
    tokens = 2 * 8192
    o = next(p for p in asy if p.collective == "reduce_scatter" and p.pass_ == "forward")
    assert o.gemm_flops == pytest.approx(tokens * 2 * 8192 * 8192 / 8)
    qkv = next(p for p in asy if p.collective == "all_gather" and p.pass_ == "forward")
    assert qkv.gemm_flops == pytest.approx(tokens * 2 * 8192 * (8192 + 2 * 1024) / 8)


def test_fp8_runs_all_gather_one_byte_elements_and_reduce_scatter_bf16():
    act = 2 * 8192 * 8192 * 2
    calls = {c.collective: c for c in stage_calls(M70, BASE, 0) if c.dim == "tp"}
    assert calls["all_gather"].nbytes == act / 2 and calls["reduce_scatter"].nbytes == act
    bf16 = {c.collective: c for c in stage_calls(M70, BASE.with_(precision="bf16"), 0) if c.dim == "tp"}
    assert bf16["all_gather"].nbytes == act


def test_tp_overlap_orders_no_overlap_above_async_tp_above_userbuffers():
    topo = cluster_for("dgx-h100", 1)
    comm = AlphaBetaModel()
    none = step_time(M70, BASE, topo, comm=comm).breakdown["tp_exposed"]
    asy = step_time(M70, BASE.with_(overlap_tp=True, tp_overlap="async_tp"), topo, comm=comm).breakdown["tp_exposed"]
    ub = step_time(M70, BASE.with_(overlap_tp=True), topo, comm=comm).breakdown["tp_exposed"]
    assert none > asy > ub > 0
    # async TP never hides the backward reduce-scatters: at least their NCCL time stays exposed
    rs = comm.time_s("reduce_scatter", 2 * 8192 * 8192 * 2, topo.endpoints()[:8], topo)
    assert asy >= 2 * 80 * rs


def test_tp_overlap_needs_sequence_parallelism_and_a_known_implementation():
    with pytest.raises(ConfigError, match="sequence parallelism"):
        Layout(tp=8, overlap_tp=True, global_batch=8)
    with pytest.raises(ConfigError, match="tp_overlap"):
        Layout(tp=8, sequence_parallel=True, overlap_tp=True, tp_overlap="flux", global_batch=8)
    Layout(tp=1, overlap_tp=True, global_batch=8)   # nothing to overlap on one GPU: accepted


def test_a_non_reentrant_recompute_leaves_out_the_reduce_scatter_ending_each_layer():
    def tp(checkpoint: str, lay: Layout = BASE) -> dict[str, float]:
        return {c.collective: c.calls for c in stage_calls(M70, lay, 0, checkpoint) if c.dim == "tp"}
    rerun, needed = tp("reentrant"), tp("non-reentrant")
    assert rerun == {"all_gather": 2 * 80 * 3, "reduce_scatter": 2 * 80 * 3}
    # the recompute gathers both regions' inputs again but stops before the MLP's reduce-scatter
    assert needed == {"all_gather": 2 * 80 * 3, "reduce_scatter": 2 * 80 * 3 - 80}
    assert tp("non-reentrant", BASE.with_(recompute="selective")) == tp("reentrant", BASE.with_(recompute="selective"))
    no_sp = {c.collective: c.calls for c in stage_calls(M70, BASE.with_(sequence_parallel=False), 0, "non-reentrant")
             if c.dim == "tp"}
    assert no_sp == {"all_reduce": 2 * 80 * 3 - 80}
    pieces = tp_pieces(M70, BASE.with_(overlap_tp=True, tp_overlap="async_tp"), 0, 80, 1.0, 2.0, "non-reentrant")
    recompute_rs = [p for p in pieces if p.pass_ == "recompute" and p.collective == "reduce_scatter"]
    assert [p.gemm_flops for p in recompute_rs] == [pytest.approx(2 * 8192 * 2 * 8192 * 8192 / 8)]   # O only
    with pytest.raises(InvalidArgument, match="checkpoint"):
        stage_calls(M70, BASE, 0, "selective")


def test_torchtitan_profiles_checkpoint_non_reentrant_and_an_unknown_checkpoint_is_refused():
    from ringflow.workload.kernels import PROFILES, KernelProfile
    assert PROFILES["torchtitan-compile"].checkpoint == PROFILES["torchtitan-eager"].checkpoint == "non-reentrant"
    assert PROFILES["megatron-te"].checkpoint == "reentrant"
    with pytest.raises(InvalidArgument, match="checkpoint"):
        KernelProfile("x", "fused", "fused", "fused", "", checkpoint="early")


def test_sequence_parallel_along_the_second_dimension_copies_each_nccl_collectives_buffer():
    act = 2 * 8192 * 8192 * 2
    s_first = {c.collective: c for c in stage_calls(M70, BASE, 0) if c.dim == "tp"}
    s_second = {c.collective: c for c in stage_calls(M70, BASE, 0, "reentrant", 1) if c.dim == "tp"}
    assert s_first["all_gather"].copy_bytes == s_first["reduce_scatter"].copy_bytes == 0.0
    # (b, s, h) shards: the gathered FP8 output and the BF16 reduce-scatter input, each read and written once
    assert s_second["all_gather"].copy_bytes == pytest.approx(2 * act / 2)
    assert s_second["reduce_scatter"].copy_bytes == pytest.approx(2 * act)
    assert s_second["all_gather"].wire_bytes == s_first["all_gather"].wire_bytes   # the wire carries the same
    with pytest.raises(InvalidArgument, match="sequence_dim"):
        stage_calls(M70, BASE, 0, "reentrant", 2)
    # async TP: a fused collective takes its chunks in place, an NCCL reduce-scatter still copies
    pieces = tp_pieces(M70, BASE.with_(overlap_tp=True, tp_overlap="async_tp"), 0, 80, 1.0, 2.0, "reentrant", 4.0)
    assert {p.copy_bytes for p in pieces if p.how == "exposed"} == {4.0}
    assert {p.copy_bytes for p in pieces if p.how == "decomposed"} == {0.0}
    exposed = next(p for p in pieces if p.how == "exposed")
    assert piece_exposed_s(exposed, 8, 3.0, 1e12, 1e12, 2.0, 0.0) == pytest.approx(3.0 + 4.0 / 2.0)


def test_step_time_adds_the_layout_copies_of_a_torchtitan_profile_to_the_exposed_tp_time():
    from dataclasses import replace

    from ringflow.workload.compute import EfficiencyModel, gpu_spec
    from ringflow.workload.kernels import PROFILES
    topo = cluster_for("dgx-h100", 1)
    titan = PROFILES["torchtitan-compile"]
    lay = BASE.with_(recompute="selective")
    eff_b = EfficiencyModel(kernels=titan)
    eff_s = EfficiencyModel(kernels=replace(titan, sequence_dim=0))
    gpu = gpu_spec("H100")
    b = step_time(M70, lay, topo, comm=AlphaBetaModel(), eff=eff_b, gpu=gpu).breakdown["tp_exposed"]
    s = step_time(M70, lay, topo, comm=AlphaBetaModel(), eff=eff_s, gpu=gpu).breakdown["tp_exposed"]
    act = 2 * 8192 * 8192 * 2
    copies = 2 * 80 * 2 * (2 * act / 2 + 2 * act)   # regions x passes x (all-gather + reduce-scatter copies)
    assert b - s == pytest.approx(copies / (gpu.hbm_GBps * 1e9 * eff_b.mem_eff))


def test_a_non_reentrant_recompute_leaves_out_each_layers_down_projection_except_an_eager_fp8_linear():
    from dataclasses import replace

    from ringflow.workload.compute import EfficiencyModel, gpu_spec, microbatch_times
    from ringflow.workload.kernels import PROFILES
    lay = BASE.with_(recompute="full")
    down_flops = lay.micro_batch * lay.seq_len * 2 * M70.hidden * M70.ffn_hidden / lay.tp * M70.layers

    def rec(profile: str, checkpoint: str, layout: Layout = lay) -> float:
        kp = replace(PROFILES[profile], checkpoint=checkpoint)
        t = microbatch_times(M70, layout, gpu_spec("H100"), EfficiencyModel(kernels=kp))
        return t.hardware_flops - t.model_flops
    assert rec("torchtitan-compile", "reentrant") - rec("torchtitan-compile", "non-reentrant") == \
        pytest.approx(down_flops)
    fp8 = lay.with_(precision="fp8")
    assert rec("torchtitan-eager", "non-reentrant", fp8) == pytest.approx(rec("torchtitan-eager", "reentrant", fp8))
    assert rec("torchtitan-compile", "non-reentrant", fp8) < rec("torchtitan-compile", "reentrant", fp8)
