"""The planner: its EP x TP x PP x DP x CP search space under Megatron's rules, the branch and bound against timing
every layout (same best layouts; bounds never above the step), forked workers, and the out-of-memory answer."""
from __future__ import annotations

import pytest

from ringflow.errors import InvalidArgument
from ringflow.workload import load_model
from ringflow.workload.commmodel import AlphaBetaModel
from ringflow.workload.compute import EfficiencyModel, gpu_spec
from ringflow.workload.memory import memory_per_gpu
from ringflow.workload.planner import _EXAMINE, PlanSpace, _Job, _Search, plan
from ringflow.workload.planner_space import cp_degrees, end_stage_splits, shapes, stage_splits, to_layout
from ringflow.workload.validation import cluster_for

# Qwen3-235B-A22B (128 experts, 94 layers: no power-of-two PP divides them) at a long sequence: every new
# dimension of the search applies (EP, expert TP, dispatcher, CP and its exchange, asymmetric end stages, op)
MOE = ("qwen3-235b-a22b", 64, 64, 8192)
MOE_SPACE = PlanSpace(tp=(2, 4), pp=(4, 8), micro_batch=(1,), interleave=(1,), zero=(1, 3),
                      recompute=("selective", "op"))
DENSE = ("llama3-8b", 16, 32, 8192)
DENSE_SPACE = PlanSpace(tp=(1, 2, 4), micro_batch=(1, 2), interleave=(1, 2), zero=(0, 1, 3))


def _plan(case: tuple[str, int, int, int], space: PlanSpace, **kw: object):
    name, gpus, batch, seq = case
    return plan(load_model(name), cluster_for("dgx-h100", gpus // 8), gpus, batch, seq, space=space, refine=None,
                **kw)


def test_end_stages_share_what_the_middle_stages_leave() -> None:
    assert end_stage_splits(61, 16) == [(1, 4), (2, 3), (3, 2), (4, 1)]   # DeepSeek-V3: 14 x 4 in the middle
    assert end_stage_splits(126, 16) == [(6, 8), (7, 7), (8, 6)]          # Llama 3 405B: 14 x 8
    assert end_stage_splits(61, 2) == [(30, 31), (31, 30)]
    assert end_stage_splits(61, 32) == []                                  # 30 x 2 leaves one layer for two ends
    splits = stage_splits(61, PlanSpace())
    assert (16, 1, 4) in splits and (61, 0, 0) in splits and not any(pp == 32 for pp, _, _ in splits)
    assert [s for s in stage_splits(126, PlanSpace(asymmetric_stages=False)) if s[0] == 16] == [(16, 7, 7)]
    assert not [s for s in stage_splits(126, PlanSpace(uneven_stages=False)) if s[0] == 16]


def test_every_moe_candidate_follows_megatrons_divisibility_rules() -> None:
    m = load_model("deepseek-v3")
    space = PlanSpace(micro_batch=(1,), zero=(1,), recompute=("full",), interleave=(1,))
    found = list(shapes(m, 1024, 512, 4096, space))
    for s in found:
        lay = to_layout(s, 512, 4096)
        lay.check_model(m)
        assert s.tp * s.cp * s.pp * s.dp == 1024 and 512 % s.dp == 0
        assert m.experts % s.ep == 0 and (s.tp * s.cp * s.dp) % (lay.expert_tp * s.ep) == 0
        assert m.moe_ffn % lay.expert_tp == 0 and (s.dispatcher == "alltoall" or s.ep > 1)
        assert 4096 % (2 * s.cp) == 0 and (4096 // s.cp) % s.tp == 0
        assert s.cp_comm != "a2a" or m.heads % (s.tp * s.cp) == 0
        assert s.tp == 1 or lay.sequence_parallel   # Megatron: EP with TP needs sequence parallelism
    assert {s.ep for s in found} >= {1, 8, 64, 256} and {s.etp for s in found} == {0, 1}
    assert {s.dispatcher for s in found} == {"alltoall", "flex"} and {s.cp for s in found} == {1, 2}
    assert {(s.first, s.last) for s in found if s.pp == 16} == {(1, 4), (2, 3), (3, 2), (4, 1)}
    assert len({s for s in found}) == len(found)


def test_a_dense_model_searches_no_experts_and_cp_only_on_long_sequences() -> None:
    m = load_model("llama3-70b")
    found = list(shapes(m, 256, 256, 8192, PlanSpace(micro_batch=(1,), zero=(1,))))
    assert {(s.ep, s.etp, s.dispatcher) for s in found} == {(1, 0, "alltoall")}
    assert {s.cp for s in found} == {1, 2, 4} and {s.recompute for s in found} == {"none", "selective", "full", "op"}
    assert cp_degrees(4096, PlanSpace()) == (1, 2) and cp_degrees(2048, PlanSpace()) == (1,)
    assert cp_degrees(8192, PlanSpace(cp=(1, 8))) == (1, 8)


@pytest.mark.parametrize("case, space", [(MOE, MOE_SPACE), (DENSE, DENSE_SPACE)], ids=["moe", "dense"])
def test_the_bounded_search_returns_the_layouts_timing_every_one_ranks_first(case, space) -> None:
    full = _plan(case, space, workers=1)
    bounded = _plan(case, space, workers=1, keep=10)
    assert full.pruned == 0 and full.evaluated + full.oom == full.searched
    assert bounded.pruned > full.searched / 2 and bounded.evaluated + bounded.oom + bounded.pruned == full.searched
    assert [r.layout for r in bounded.top(10)] == [r.layout for r in full.top(10)]
    assert [r.step_time_s for r in bounded.top(10)] == [r.step_time_s for r in full.top(10)]
    if case is MOE:   # the best layout uses what the search added
        best = full.top(1)[0].layout
        assert best.ep > 1 and best.cp > 1


def test_no_bound_exceeds_the_step_of_any_layout_it_covers() -> None:
    name, gpus, batch, seq = MOE
    space = PlanSpace(tp=(2, 4), pp=(4,), micro_batch=(1,), interleave=(1,), zero=(1, 3), recompute=("op",))
    full = _plan(MOE, space, workers=1)
    step = {(r.layout.tp, r.layout.cp, r.layout.pp, r.layout.first_stage_layers, r.layout.last_stage_layers,
             r.layout.ep, r.layout.etp, r.layout.ep_dispatcher, r.layout.cp_comm, r.layout.zero): r.step_time_s
            for r in full.ranked}
    m, topo = load_model(name), cluster_for("dgx-h100", gpus // 8)
    job = _Job(m, topo, gpu_spec("H100"), AlphaBetaModel(), EfficiencyModel(), batch, seq, "bf16")
    found = list(shapes(m, gpus, batch, seq, space))
    search = _Search(job, found, keep=1, progress=None)
    stack, checked = search._groups(), 0
    while stack:   # every entry expanded (the split itself raises where a level's bound falls below its parent's)
        bound, _, level, members = stack.pop()
        if level < _EXAMINE:
            stack.extend(search._split(level, bound, members))
            continue
        s = found[members[0]]
        t = step.get((s.tp, s.cp, s.pp, s.first, s.last, s.ep, s.etp, s.dispatcher, s.cp_comm, s.zero))
        if t is not None:
            assert bound <= t * (1 + 1e-9), s
            checked += 1
    assert checked == full.evaluated > 50


def test_forked_workers_find_what_one_process_finds() -> None:
    alone = _plan(MOE, MOE_SPACE, workers=1, keep=5)
    forked = _plan(MOE, MOE_SPACE, workers=2, keep=5)
    assert [(r.layout, r.step_time_s) for r in forked.top(5)] == [(r.layout, r.step_time_s) for r in alone.top(5)]
    small = PlanSpace(tp=(1, 2), micro_batch=(1,), interleave=(1,), zero=(1,))
    every = _plan(DENSE, small, workers=2)
    assert every.evaluated > 20
    assert [r.layout for r in every.ranked] == [r.layout for r in _plan(DENSE, small, workers=1).ranked]


def test_when_nothing_fits_the_error_names_the_leanest_layouts_peak() -> None:
    m, topo = load_model("llama3-70b"), cluster_for("dgx-h100", 1)
    space = PlanSpace(micro_batch=(1,), interleave=(1,), recompute=("full",), zero=(0, 3))
    with pytest.raises(InvalidArgument) as err:
        plan(m, topo, 8, 8, 8192, space=space, refine=None, keep=3)
    need = min(memory_per_gpu(m, to_layout(s, 8, 8192), 80e9).total_bytes for s in shapes(m, 8, 8, 8192, space))
    assert f"needs {need / 1e9:.0f} GB per GPU" in str(err.value) and "--gpus" in str(err.value)
    with pytest.raises(InvalidArgument, match="keep"):
        plan(m, topo, 8, 8, 8192, space=space, refine=None, keep=0)


@pytest.mark.long
@pytest.mark.parametrize("name", ["deepseek-v3", "llama3-405b"])
def test_a_16384_gpu_plan_ranks_fitting_layouts_of_the_whole_cluster(name: str) -> None:
    m = load_model(name)
    p = plan(m, cluster_for("dgx-h100", 2048), 16384, 1024, refine=None, keep=10)
    top = p.top(10)
    assert len(top) == 10 and p.pruned > 0.9 * p.searched
    assert [r.step_time_s for r in top] == sorted(r.step_time_s for r in top)
    for r in top:
        L = r.layout
        assert L.gpus == 16384 and r.memory.fits and L.tp == 8   # TP fills a server
        if m.is_moe:
            assert L.ep > 1 and m.experts % L.ep == 0 and (L.tp * L.cp * L.dp) % (L.expert_tp * L.ep) == 0
        else:
            assert L.pp > 1 and L.ep == 1
