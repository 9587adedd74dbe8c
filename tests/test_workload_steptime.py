"""Memory formulas, the 1F1B bubble, step time sanity, Narayanan et al. Table 1, planner, parameter servers."""
from __future__ import annotations

import pytest

from ringflow.errors import ConfigError, InvalidArgument
from ringflow.workload import load_model
from ringflow.workload.commmodel import AlphaBetaModel
from ringflow.workload.layout import Layout, rank_coords, rank_groups
from ringflow.workload.memory import activation_bytes_per_layer, memory_per_gpu, model_state_bytes_per_param
from ringflow.workload.param_server import compare, parse_straggler, ssp_finish_times
from ringflow.workload.planner import PlanSpace, plan
from ringflow.workload.steptime import bubble_fraction, step_time
from ringflow.workload.validation import TABLE1, cluster_for, predict_table1

GPT = load_model("megatron-gpt-18.4b")  # GPT layer with dropout: Korthikanti's constants apply exactly


@pytest.mark.parametrize("p,m,v,want", [(1, 8, 1, 0.0), (4, 8, 1, 3 / 11), (8, 64, 1, 7 / 71), (8, 64, 4, 7 / 263)])
def test_bubble(p, m, v, want):
    assert bubble_fraction(p, m, v) == pytest.approx(want)
    with pytest.raises(InvalidArgument):
        bubble_fraction(0, 1)


def test_step_bubble_share_is_p_minus_1_over_m_plus_p_minus_1():
    from ringflow.workload.compute import gpu_spec, in_training, microbatch_times
    topo = cluster_for("dgx-h100", 4)
    m8 = load_model("llama3-8b")
    for v in (1, 2):
        lay = Layout(tp=8, pp=4, dp=1, micro_batch=1, global_batch=12, seq_len=2048, recompute="selective",
                     sequence_parallel=True, interleave=v)
        r = step_time(m8, lay, topo, comm=AlphaBetaModel())
        mb = microbatch_times(m8, lay, in_training(gpu_spec("H100")), stage="last")
        assert r.bubble_fraction == pytest.approx(3 / (12 * v + 3))
        # the bubble is (p-1)/v idle micro-batch slots of the slowest stage
        assert r.breakdown["bubble"] == pytest.approx(3 / v * mb.total_s)
        assert r.step_time_s == pytest.approx(sum(r.breakdown.values()))


def _korthikanti(h, a, s, b, t, sp, mode):
    if mode == "full":
        return 2 * s * b * h / (t if sp else 1)
    score = 0 if mode == "selective" else 5 * a * s / h
    if sp:
        return s * b * h / t * (34 + score)
    return s * b * h * (10 + 24 / t + score / t)


@pytest.mark.parametrize("t,sp,mode", [(1, False, "none"), (8, False, "none"), (8, True, "none"),
                                       (8, True, "selective"), (4, False, "selective"), (8, True, "full"),
                                       (2, False, "full")])
def test_activation_memory_matches_korthikanti(t, sp, mode):
    lay = Layout(tp=t, micro_batch=2, global_batch=2, seq_len=2048, recompute=mode, sequence_parallel=sp,
                 flash_attention=False)
    want = _korthikanti(GPT.hidden, GPT.heads, 2048, 2, t, sp, mode)
    assert activation_bytes_per_layer(GPT, lay) == pytest.approx(want)


def test_flash_attention_removes_the_score_term():
    lay = Layout(tp=8, micro_batch=1, global_batch=1, seq_len=4096, sequence_parallel=True)
    assert activation_bytes_per_layer(GPT, lay) == pytest.approx(_korthikanti(GPT.hidden, GPT.heads, 4096, 1, 8,
                                                                                True, "selective"))


def test_model_state_per_zero_stage():
    d = 8
    assert model_state_bytes_per_param(0, d) == 2 + 4 + 12
    assert model_state_bytes_per_param(1, d) == 2 + 4 + 12 / d
    assert model_state_bytes_per_param(2, d) == 2 + 16 / d
    assert model_state_bytes_per_param(3, d) == 18 / d
    m = load_model("llama3-8b")
    mems = [memory_per_gpu(m, Layout(dp=8, global_batch=8, seq_len=1024, zero=z), 80e9) for z in range(4)]
    assert mems[0].optimizer_bytes == pytest.approx(8 * mems[1].optimizer_bytes)
    assert mems[1].grads_bytes == pytest.approx(8 * mems[2].grads_bytes)
    assert mems[2].weights_bytes > mems[3].weights_bytes
    assert [x.total_bytes for x in mems] == sorted((x.total_bytes for x in mems), reverse=True)


def test_out_of_memory_verdict():
    m = load_model("llama3-70b")
    assert not memory_per_gpu(m, Layout(global_batch=1, seq_len=8192), 80e9).fits
    assert memory_per_gpu(m, Layout(tp=8, pp=8, dp=16, global_batch=1024, seq_len=8192, zero=1,
                                    recompute="selective", sequence_parallel=True), 80e9).fits


def test_megatron_rank_order():
    lay = Layout(tp=8, pp=8, dp=16, global_batch=16)
    g = rank_groups(lay)
    assert g.tp[0] == tuple(range(8))           # TP innermost: one server
    assert g.dp[0] == tuple(range(0, 128, 8))   # then DP
    assert g.pp[0] == tuple(range(0, 1024, 128))  # PP outermost
    assert rank_coords(lay, 1023) == {"tp": 7, "cp": 0, "dp": 15, "pp": 7}
    with pytest.raises(ConfigError):
        Layout(tp=8, pp=8, dp=16, global_batch=10)


def test_more_nic_bandwidth_never_slows_a_step():
    m = load_model("llama3-8b")
    lays = [Layout(tp=1, pp=1, dp=32, global_batch=64, seq_len=4096, zero=z, recompute="selective")
            for z in (0, 1, 3)] + [Layout(tp=2, pp=4, dp=4, global_batch=64, seq_len=4096, zero=1, interleave=2,
                                          sequence_parallel=True, recompute="selective")]
    prev = None
    for gbps in (100, 200, 400, 800):
        topo = cluster_for("dgx-h100", 4, nic_gbps=gbps)
        times = [step_time(m, lay, topo, comm=AlphaBetaModel()).step_time_s for lay in lays]
        best = plan(m, topo, 32, 64, 4096, space=PlanSpace(tp=(1, 2, 4), micro_batch=(1, 2), interleave=(1,)),
                    refine=None, keep=1).ranked[0].step_time_s
        if prev is not None:
            assert all(t <= p + 1e-12 for t, p in zip(times + [best], prev, strict=True))
        prev = times + [best]


def test_narayanan_table1_within_10_percent():
    rows = predict_table1(comm=AlphaBetaModel())
    assert len(rows) == len(TABLE1) == 10
    published = [r["published_tflops"] for r in rows]
    assert published == [137, 138, 142, 135, 138, 140, 148, 155, 163, 163]
    for r in rows:
        assert abs(r["error"]) < 0.10, (r["model"], r["published_tflops"], r["predicted_tflops"])


def test_planner_top_layouts_fit_and_are_sorted():
    m = load_model("llama3-8b")
    topo = cluster_for("dgx-h100", 2)
    p = plan(m, topo, 16, 32, 4096, refine=None, keep=10)
    times = [r.step_time_s for r in p.ranked]
    assert times == sorted(times) and p.evaluated + p.oom + p.pruned == p.searched and p.pruned > 0
    assert all(r.memory.fits for r in p.top(10))
    assert p.top(1)[0].layout.gpus == 16
    with pytest.raises(InvalidArgument):
        plan(m, topo, 64, 32)


def test_the_refine_pass_stops_within_one_call_of_its_budget():
    """One refine call can take long (a big group without a fast path): the budget is checked before
    every call, not only between layouts; a clock that advances 1 s per call makes that exact."""
    m = load_model("llama3-8b")
    topo = cluster_for("dgx-h100", 2)
    now = [0.0]

    class OneSecondPerCall(AlphaBetaModel):
        def time_s(self, *a):
            now[0] += 1.0
            return super().time_s(*a)

    slow = OneSecondPerCall()

    def run(top: int, budget_s: float):
        now[0] = 0.0
        return plan(m, topo, 16, 32, 4096, refine=slow, refine_top=top, refine_budget_s=budget_s, keep=2,
                    clock=lambda: now[0])
    first = run(1, 1e9)
    calls_first = now[0]
    full = run(2, 1e9)
    assert calls_first >= 2 and now[0] - calls_first >= 2   # several calls per layout
    cut = run(2, calls_first + 0.5)
    assert list(cut.checked) == [0] and cut.budget_spent and not full.budget_spent
    # the second layout ran out of budget part-way ...
    assert now[0] == calls_first + 1               # ... and stopped after its first call
    assert cut.checked[0].step_time_s == full.checked[0].step_time_s == first.checked[0].step_time_s


def test_parameter_servers_incast_and_consistency():
    topo = cluster_for("dgx-h100", 8)
    workers = [topo.gpus(h)[0] for h in topo.hosts()]
    res = {(r.layout, r.consistency): r for r in compare(2e9, 0.2, workers, topo, straggler="bernoulli:0.2:4",
                                                          staleness=2, iters=100)}
    # incast: a central server is slower than sharded servers and than a ring all-reduce
    assert res[("gpu0", "BSP")].step_time_s > res[("sharded", "BSP")].step_time_s
    assert res[("cpu", "BSP")].server_time_s > res[("sharded", "BSP")].server_time_s
    # with stragglers, relaxing consistency never slows a step: BSP >= SSP >= ASP
    for lay in ("sharded", "gpu0", "cpu"):
        assert res[(lay, "BSP")].step_time_s >= res[(lay, "SSP(2)")].step_time_s >= res[(lay, "ASP")].step_time_s
    assert res[("ring all-reduce", "BSP")].step_time_s < res[("cpu", "BSP")].step_time_s


def test_ssp_bound_and_straggler_specs():
    import numpy as np
    c = np.ones((10, 3))
    c[:, 0] = 5.0  # one worker five times slower
    bsp = ssp_finish_times(c, 0.0, 0)
    asp = ssp_finish_times(c, 0.0, float("inf"))
    assert bsp[-1].max() == pytest.approx(50.0) and asp[:, 1].max() == pytest.approx(10.0)
    s1 = ssp_finish_times(c, 0.0, 1)
    # a fast worker never gets more than s+1 iterations ahead of the slow one
    assert s1[3, 1] >= s1[1, 0]
    for bad in ("weird", "bernoulli:2:3", "lognormal", "exp:x"):
        with pytest.raises(InvalidArgument):
            parse_straggler(bad)


def test_contention_all_groups_at_once():
    from ringflow.topology import build_cluster
    from ringflow.workload.contention import dimension_factor
    m = load_model("llama3-8b")
    lay = Layout(tp=4, pp=2, dp=4, global_batch=16, seq_len=2048, zero=0, recompute="selective",
                 sequence_parallel=True)
    rail = cluster_for("dgx-h100", 4)
    r = step_time(m, lay, rail, comm=AlphaBetaModel(), contention=True)
    assert r.contention["tp"] == pytest.approx(1.0)   # TP stays inside servers
    assert r.contention["dp"] == pytest.approx(1.0, abs=0.02)  # rails keep DP groups apart
    # PCIe servers with 2 NICs for 8 GPUs: two groups on GPUs 0 and 1 share a NIC, eight groups share two
    box = cluster_for("pcie-8gpu", 2)
    a, b = box.gpus(box.hosts()[0]), box.gpus(box.hosts()[1])
    two = dimension_factor(box, "all_reduce", 1e9, [[a[0], b[0]], [a[1], b[1]]])
    eight = dimension_factor(box, "all_reduce", 1e9, [[a[i], b[i]] for i in range(8)])
    assert two["groups"] == 2 and 1.5 < two["factor"] <= 2.05
    assert eight["factor"] > two["factor"]
    tree = build_cluster("dgx-h100", 4, fabric="fat-tree", oversubscription=4.0)
    slow = step_time(m, lay, tree, comm=AlphaBetaModel(), contention=True)
    assert slow.step_time_s >= step_time(m, lay, tree, comm=AlphaBetaModel()).step_time_s


def test_contention_of_in_switch_all_reduces_keeps_each_ranks_leg_to_its_switch():
    from ringflow.algorithms.schedule import Collective
    from ringflow.sim.api import simulate_table, table_for
    from ringflow.workload.contention import dimension_factor, merge_tables
    topo = cluster_for("dgx-h100", 2)
    eps = topo.endpoints()
    # TP 8 picks NVLS: each server's group runs on its own NVSwitch, so the groups share nothing
    tp = dimension_factor(topo, "all_reduce", 1e8, [eps[0:8], eps[8:16]])
    assert tp["algorithm"] == "nvls" and tp["factor"] == pytest.approx(1.0)
    r = step_time(load_model("llama3-70b"), Layout(tp=8, dp=2, global_batch=2, seq_len=2048, sequence_parallel=True),
                  topo, comm=AlphaBetaModel(), contention=True)
    assert r.contention["tp"] == pytest.approx(1.0)
    # two NVLS groups on one switch: their rank-to-switch rows stay in-switch rows, and the pair is no faster
    coll = Collective.parse("all_reduce")
    tabs = [table_for(topo, coll, 4, "nvls", endpoints=g) for g in (eps[0:4], eps[4:8])]
    merged = merge_tables(tabs)
    assert merged.in_switch is not None and merged.in_switch.size == sum(t.ntransfers for t in tabs)
    one = simulate_table(topo, tabs[0], 1 << 26, engine="flow", dtype="bfloat16", endpoints=eps[0:4]).time_us
    both = simulate_table(topo, merged, 2 << 26, engine="flow", dtype="bfloat16", endpoints=eps[0:8]).time_us
    assert both >= one * 0.999
