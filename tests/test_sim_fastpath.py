"""The fast-path tables reproduce the registry schedules' traffic exactly."""
from __future__ import annotations

import numpy as np
import pytest

from ringflow.algorithms import hierarchical, ring
from ringflow.algorithms.schedule import Collective
from ringflow.sim.fastpath import fast_table
from ringflow.sim.transfers import from_schedule


def _canon(tab):
    rows = np.stack([tab.step, tab.src, tab.dst, tab.chan]).T
    order = np.lexsort(rows.T[::-1])
    loc = {(int(r), int(s), kind): float(v) for kind, col in (("red", tab.lreduce), ("copy", tab.lcopy))
           for r, s, v in zip(tab.lrank, tab.lstep, col, strict=True) if v}
    return rows[order], tab.frac[order], tab.nmsg[order], loc


def _same(a, b):
    ra, fa, ma, la = _canon(a)
    rb, fb, mb, lb = _canon(b)
    np.testing.assert_array_equal(ra, rb)
    np.testing.assert_allclose(fa, fb, rtol=1e-5)
    np.testing.assert_array_equal(ma, mb)
    assert la.keys() == lb.keys()
    for k in la:
        assert la[k] == pytest.approx(lb[k], rel=1e-5)
    assert a.nsteps == b.nsteps


@pytest.mark.parametrize("n,rings", [(5, None), (6, [(0, 2, 4, 1, 3, 5), (5, 4, 3, 2, 1, 0)])])
@pytest.mark.parametrize("nsegs", [1, 3])
def test_ring_fast_table_matches_schedule(n, rings, nsegs):
    sched = ring.build("all_reduce", n, rings=rings, nsegs=nsegs, nchannels=len(rings or [0]))
    fast = fast_table(Collective.ALL_REDUCE, "ring", n, rings=rings or [tuple(range(n))], nsegs=nsegs)
    _same(fast, from_schedule(sched))


@pytest.mark.parametrize("coll", [Collective.REDUCE_SCATTER, Collective.ALL_GATHER])
@pytest.mark.parametrize("n,rings", [(5, None), (6, [(0, 2, 4, 1, 3, 5), (5, 4, 3, 2, 1, 0)])])
def test_ring_reduce_scatter_and_all_gather_fast_tables_match_the_schedules(coll, n, rings):
    """The ZeRO-3 planner prices these on 1,024 GPUs: the real schedule has 16.8 M transfers there."""
    sched = ring.build(coll.value, n, rings=rings, nchannels=len(rings or [0]))
    _same(fast_table(coll, "ring", n, rings=rings or [tuple(range(n))]), from_schedule(sched))


@pytest.mark.parametrize("H,m", [(3, 4), (4, 2), (1, 4), (4, 1)])
@pytest.mark.parametrize("nsegs", [1, 2])
def test_hierarchical_fast_table_matches_schedule(H, m, nsegs):
    groups = [list(range(h * m, (h + 1) * m)) for h in range(H)]
    sched = hierarchical.build("all_reduce", H * m, host_groups=groups, nsegs=nsegs)
    fast = fast_table(Collective.ALL_REDUCE, "hierarchical", H * m, groups=groups, nsegs=nsegs)
    _same(fast, from_schedule(sched))


def test_the_scaling_benchmark_writes_its_rows_as_json(tmp_path, capsys) -> None:
    """`python -m ringflow.sim.scaling 64 --json F`: one row per (algorithm, engine), both engines agree
    (no contention that the analytic engine misses on a rail fabric at 64 GPUs)."""
    import json

    from ringflow.sim.scaling import main
    out = tmp_path / "scaling.json"
    main(["64", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert {(r["algorithm"], r["engine"]) for r in rows} == {(a, e) for a in ("ring", "hierarchical")
                                                             for e in ("analytic", "flow")}
    by = {(r["algorithm"], r["engine"]): r for r in rows}
    for a in ("ring", "hierarchical"):
        assert by[(a, "flow")]["time_us"] == pytest.approx(by[(a, "analytic")]["time_us"], rel=1e-6)
    assert "wrote 4 rows" in capsys.readouterr().out
