"""MoE mechanisms of the training model: router, permute, dispatcher, imbalance and hierarchical dispatch."""
from __future__ import annotations

from dataclasses import replace

import pytest

from ringflow.errors import ConfigError
from ringflow.workload.compute import EfficiencyModel, gpu_spec, in_training, microbatch_times
from ringflow.workload.layercomm import stage_calls
from ringflow.workload.layout import Layout
from ringflow.workload.models import load_model
from ringflow.workload.moe import PERMUTE_INDEXING_FRACTION, dispatch_bytes, host_wait_s, layer_cost

QWEN3_30B = "qwen3-30b-a3b"   # the preset (ringflow/workload/models/qwen3.yaml)


def _layout(**kw: object) -> Layout:
    base = dict(dp=8, ep=8, micro_batch=1, global_batch=64, seq_len=4096, zero=1, precision="bf16")
    return Layout(**{**base, **kw})  # type: ignore[arg-type]


def test_dispatcher_time_is_routed_elements_over_its_rate() -> None:
    c = layer_cost(4096, 8, 2048, 128, 2.0e12, 3.35e12, dispatch_eps=1e10)
    assert c.dispatcher_s == pytest.approx(4096 * 8 * 2048 / 1e10)
    assert layer_cost(4096, 8, 2048, 128, 2.0e12, 3.35e12).dispatcher_s == 0.0


def test_sorting_by_local_expert_copies_the_routed_tokens_twice_per_pass() -> None:
    sorted_ = layer_cost(4096, 8, 2048, 128, 2.0e12, 3.35e12, sort_local=True)
    plain = layer_cost(4096, 8, 2048, 128, 2.0e12, 3.35e12)
    assert plain.sort_s == 0.0
    assert sorted_.sort_s == pytest.approx(2 * (4096 * 8 * 2048 * 2 + 4096 * 8 * 2048 * 2) / 2.0e12)
    assert sorted_.total_s - plain.total_s == pytest.approx(sorted_.sort_s)


def test_only_the_alltoall_dispatcher_with_several_local_experts_sorts() -> None:
    model, gpu = load_model(QWEN3_30B), gpu_spec("H100")
    e = EfficiencyModel(alltoall_dispatch_eps=0.0, flex_dispatch_eps=0.0, alltoall_host_s=0.0, flex_host_s=0.0)
    a2a = microbatch_times(model, _layout(), gpu, e).moe_s
    flex = microbatch_times(model, _layout(ep_dispatcher="flex"), gpu, e).moe_s
    routed = 4096 * 8 * 2048
    per_layer_pass = 2 * (2 * routed * 2) / (gpu.hbm_GBps * 1e9 * e.mem_eff)
    assert a2a - flex == pytest.approx(2 * model.layers * per_layer_pass, rel=1e-9)
    one_each = replace(model, experts=8)   # EP 8 over 8 experts: one local expert, nothing to sort
    assert microbatch_times(one_each, _layout(), gpu, e).moe_s == pytest.approx(
        microbatch_times(one_each, _layout(ep_dispatcher="flex"), gpu, e).moe_s)


def test_indexing_permute_runs_at_the_measured_fraction_of_hbm() -> None:
    fused = layer_cost(4096, 8, 2048, 128, 2.68e12, 3.35e12, fused_permute=True).permute_s
    eager = layer_cost(4096, 8, 2048, 128, 2.68e12, 3.35e12, fused_permute=False).permute_s
    assert eager / fused == pytest.approx(2.68e12 / (3.35e12 * PERMUTE_INDEXING_FRACTION))
    assert PERMUTE_INDEXING_FRACTION == pytest.approx(0.95 / 4.8)


def test_hierarchical_dispatch_sends_a_token_once_per_remote_server() -> None:
    flat = dispatch_bytes(8192, 8, 7168, ep=64, per_server=8, hierarchical=False)
    hier = dispatch_bytes(8192, 8, 7168, ep=64, per_server=8, hierarchical=True, node_limit=4)
    assert flat[1] == pytest.approx(8192 * 8 * 7 / 8 * 7168 * 2)
    assert hier[1] < flat[1] / 2          # at most 4 servers per token instead of 7 of 8 copies
    assert hier[1] <= 8192 * 4 * 7168 * 2
    one_server = dispatch_bytes(8192, 8, 7168, ep=8, per_server=8, hierarchical=True)
    assert one_server[1] == 0.0


def test_bad_dispatch_or_imbalance_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="ep_dispatcher"):
        _layout(ep_dispatcher="deepep-v9")
    with pytest.raises(ConfigError, match="expert_imbalance"):
        _layout(expert_imbalance=0.5)
    with pytest.raises(ConfigError, match="multiple of the ranks per server"):
        dispatch_bytes(1024, 8, 1024, ep=12, per_server=8, hierarchical=True)


def test_imbalance_slows_the_experts_and_grows_the_dispatch() -> None:
    model, gpu = load_model(QWEN3_30B), gpu_spec("H100")
    eff = replace(EfficiencyModel(), alltoall_host_s=0.0)   # the GPU's time, not the host's, paces the forward
    even = microbatch_times(model, _layout(), gpu, eff)
    skew = microbatch_times(model, _layout(expert_imbalance=1.5), gpu, eff)
    assert skew.forward_s > even.forward_s and skew.backward_s > even.backward_s
    a2a = {L: next(c for c in stage_calls(model, L, 0) if c.dim == "ep").nbytes
           for L in (_layout(), _layout(expert_imbalance=1.5))}
    assert list(a2a.values())[1] == pytest.approx(1.5 * list(a2a.values())[0])


def test_the_dispatcher_rate_of_the_layouts_kind_is_used() -> None:
    model, gpu = load_model(QWEN3_30B), gpu_spec("H100")
    eff = replace(EfficiencyModel(), alltoall_dispatch_eps=1e10, flex_dispatch_eps=1e12, alltoall_host_s=0.0,
                  flex_host_s=0.0)
    slow = microbatch_times(model, _layout(ep_dispatcher="alltoall"), gpu, eff)
    fast = microbatch_times(model, _layout(ep_dispatcher="flex"), gpu, eff)
    routed = 4096 * 8 * 2048
    sort = 2 * (2 * routed * 2) / (gpu.hbm_GBps * 1e9 * eff.mem_eff)   # the all-to-all dispatcher's own sort
    per_layer = routed * (1 / 1e10 - 1 / 1e12) + sort
    assert slow.forward_s - fast.forward_s == pytest.approx(48 * per_layer, rel=1e-6)


def test_per_operator_checkpointing_keeps_odd_matmuls_and_recomputes_even_ones() -> None:
    from ringflow.workload.memory_activations import activation_bytes_per_layer, op_checkpoint_split
    model = load_model("llama3-8b")
    kept, rec = op_checkpoint_split(model)
    h, f = model.hidden, model.ffn_hidden
    assert kept == h + model.heads * model.v_dim + model.q_width + model.v_width + f + h   # input, attn, Q V W1 W2
    assert rec == pytest.approx(2 * h * (model.kv_hidden + model.heads * model.v_dim + f))  # K, O, W3
    lay = Layout(dp=8, micro_batch=1, global_batch=8, seq_len=8192, zero=3, recompute="op")
    mem = {r: activation_bytes_per_layer(model, lay, r) for r in ("full", "op", "selective")}
    assert mem["full"] < mem["op"] < mem["selective"]
    gpu = gpu_spec("H100")
    t_op = microbatch_times(model, lay, gpu)
    t_full = microbatch_times(model, lay.with_(recompute="full"), gpu)
    assert 0 < t_op.recompute_s < t_full.recompute_s
    assert t_op.hardware_flops - t_op.model_flops == pytest.approx(8192 * rec * model.layers)


@pytest.mark.long
def test_a_release_with_add_new_keeps_recorded_digests_and_adds_only_new_held_out_cases(tmp_path) -> None:
    import json

    from ringflow.workload.fitting import release
    from ringflow.workload.published import load_cases
    held = [c["id"] for c in load_cases() if c["set"] == "held_out"]
    out = tmp_path / "release.json"
    out.write_text(json.dumps({"tag": "old", "held_out": {held[0]: "digest-then", "gone-case": "x"}}))
    doc = release("new", out=out, add_new=True)
    assert doc["tag"] == "new" and doc["held_out"][held[0]] == "digest-then"
    assert set(doc["held_out"]) == set(held)


def test_a_flex_dispatch_across_servers_sends_fewer_network_bytes_than_the_flat_all_to_all() -> None:
    from ringflow.sim.references import build_topology
    from ringflow.workload.commmodel import AlphaBetaModel
    from ringflow.workload.steptime import step_time
    model = load_model("deepseek-v3")
    assert model.node_limit == 4
    topo, _ = build_topology({"preset": "dgx-h100", "nodes": 8}, 64)
    base = dict(pp=2, dp=32, ep=32, stage_layers=(31, 30), global_batch=64, seq_len=4096, zero=1,
                precision="fp8")
    eff = replace(EfficiencyModel(), alltoall_dispatch_eps=0.0, flex_dispatch_eps=0.0, alltoall_host_s=0.0,
                  flex_host_s=0.0)
    flat = step_time(model, Layout(**base, ep_dispatcher="alltoall"), topo, comm=AlphaBetaModel(), eff=eff)
    hier = step_time(model, Layout(**base, ep_dispatcher="flex"), topo, comm=AlphaBetaModel(), eff=eff)
    assert 0 < hier.breakdown["ep_exposed"] < 0.75 * flat.breakdown["ep_exposed"]
    assert hier.breakdown["compute"] == pytest.approx(flat.breakdown["compute"])


def test_a_layer_waits_for_the_host_only_beyond_its_gpu_time() -> None:
    assert host_wait_s(2e-3, 5e-3) == pytest.approx(3e-3)
    assert host_wait_s(6e-3, 5e-3) == 0.0
    with pytest.raises(ConfigError, match="non-negative"):
        host_wait_s(1e-3, -1.0)


def test_a_dropless_moe_forward_waits_for_the_host_and_a_padded_one_does_not() -> None:
    model, gpu = load_model(QWEN3_30B), gpu_spec("H100")
    quiet = replace(EfficiencyModel(), alltoall_host_s=0.0, flex_host_s=0.0)
    slow_host = replace(quiet, alltoall_host_s=0.05)   # far beyond the GPU's time for one layer
    first = _layout(pp=2, global_batch=128)   # stage 0: 24 MoE layers, no logits
    gpu_only = microbatch_times(model, first, gpu, quiet, stage=0)
    waited = microbatch_times(model, first, gpu, slow_host, stage=0)
    assert waited.forward_s == pytest.approx(24 * 0.05, rel=1e-9)   # every layer host-bound
    assert waited.backward_s == pytest.approx(gpu_only.backward_s)  # the backward reuses the counts: no wait
    padded = _layout(capacity_factor=1.0)
    assert microbatch_times(model, padded, gpu, slow_host).forward_s == \
        pytest.approx(microbatch_times(model, padded, gpu, quiet).forward_s)
    flex = _layout(ep_dispatcher="flex")
    assert microbatch_times(model, flex, gpu, slow_host).forward_s == \
        pytest.approx(microbatch_times(model, flex, gpu, quiet).forward_s)


def _synthetic_fit(slopes: dict[str, float]) -> object:
    """fit_dispatchers on two alltoall cases whose prediction is exact at a 4 ms host time, too fast below it
    by `slopes[case]` per second (a flat slope: host times the cases cannot tell apart)."""
    from ringflow.workload.moe_fit import fit_dispatchers
    from ringflow.workload.published import Constants, Prediction
    cases = [{"id": cid, "kind": "training", "set": "fit", "model": QWEN3_30B, "value": 100.0,
              "layout": {"ep": 8}} for cid in slopes]

    def predictor(c: dict, consts: Constants) -> Prediction:
        host, rate = consts.dispatch_host_s.get("alltoall", 0.0), consts.dispatch_eps.get("alltoall", 0.0)
        slower = 1.0 / (1.0 + 1e10 / rate) if rate else 1.0
        return Prediction(c["value"] * (1.0 + slopes[c["id"]] * (4e-3 - host)) * slower)

    consts = Constants.defaults()
    fit_dispatchers(cases, consts, predictor)
    return consts


def test_the_dispatcher_fit_finds_the_host_time_its_cases_share() -> None:
    consts = _synthetic_fit({"a": 50.0, "b": 100.0})
    assert consts.dispatch_host_s["alltoall"] == pytest.approx(4e-3)
    assert "alltoall" not in consts.dispatch_eps   # exact without the per-element term: it stays out
    assert consts.fitted_on["dispatch_host_s[alltoall]"] == ["a", "b"]


def test_a_host_time_the_cases_cannot_tell_apart_stays_out() -> None:
    consts = _synthetic_fit({"a": 0.0, "b": 0.0})
    assert "alltoall" not in consts.dispatch_host_s


def test_the_step_breakdown_shows_the_moe_dispatch_apart_and_still_sums_to_the_step() -> None:
    from ringflow.sim.references import build_topology
    from ringflow.workload.commmodel import AlphaBetaModel
    from ringflow.workload.steptime import step_time
    model = load_model(QWEN3_30B)
    topo, _ = build_topology({"preset": "dgx-h100"}, 8)
    eff = replace(EfficiencyModel(), alltoall_dispatch_eps=1e10, alltoall_host_s=0.05)
    lay = _layout()
    r = step_time(model, lay, topo, comm=AlphaBetaModel(), eff=eff)
    mb = microbatch_times(model, lay, in_training(gpu_spec("H100")), eff)
    assert r.breakdown["moe_dispatch"] == pytest.approx(lay.microbatches * mb.moe_s)
    assert mb.moe_s > 48 * 0.05   # the host wait of every layer and the dispatcher of both passes
    assert r.step_time_s == pytest.approx(sum(r.breakdown.values()))
    dense = step_time(load_model("llama3-8b"), Layout(dp=8, micro_batch=1, global_batch=8, seq_len=4096), topo,
                      comm=AlphaBetaModel())
    assert dense.breakdown["moe_dispatch"] == 0.0


def test_ep_overlap_hides_only_the_steady_phase_of_the_combined_1f1b_schedule() -> None:
    from ringflow.workload.steptime import ep_overlap_share
    assert ep_overlap_share(_layout(pp=8, dp=8, interleave=4, global_batch=1024, stage_layers=(6,) * 8)) == \
        pytest.approx(1 - (7 * 2 + 3 * 8 + 1) / (128 * 4))
    assert ep_overlap_share(_layout(global_batch=128)) == pytest.approx(1 - 1 / 16)   # first forward, last backward
    assert ep_overlap_share(_layout(global_batch=8)) == 0.0                             # one micro-batch: all alone


def test_an_overlapped_all_to_all_stays_exposed_in_the_warm_up_and_cool_down() -> None:
    from ringflow.sim.references import build_topology
    from ringflow.workload.commmodel import AlphaBetaModel
    from ringflow.workload.steptime import ep_overlap_share, step_time
    model = load_model(QWEN3_30B)
    topo, _ = build_topology({"preset": "dgx-h100", "nodes": 2}, 16)
    eff = replace(EfficiencyModel(), alltoall_host_s=0.0)
    lay = Layout(dp=16, ep=16, micro_batch=1, global_batch=64, seq_len=4096, zero=1)   # EP over both servers
    plain = step_time(model, lay, topo, comm=AlphaBetaModel(), eff=eff)
    hidden = step_time(model, lay.with_(overlap_ep=True), topo, comm=AlphaBetaModel(), eff=eff)
    a2a = plain.breakdown["ep_exposed"]
    assert 0 < hidden.breakdown["ep_exposed"] < a2a
    assert hidden.breakdown["ep_exposed"] >= (1 - ep_overlap_share(lay)) * a2a * (1 - 1e-9)
