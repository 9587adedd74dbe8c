"""The simulator's quicker builds give exactly what the plain builds give: the link arrays read in one pass, and
ring tables written from their step pattern in the schedule's row order."""
from __future__ import annotations

import random

import numpy as np
import pytest

from ringflow.hardware.nvlink import edge_efficiency_scale
from ringflow.sim.fabric import _read_links
from ringflow.topology import build_cluster, build_preset


def _val(x: object) -> str:
    return str(getattr(x, "value", x))


@pytest.mark.parametrize("make", [lambda: build_cluster("dgx-h100", 4), lambda: build_cluster("gb200-nvl72", 2),
                                  lambda: build_preset("dgx1-v100"), lambda: build_preset("host-cpu:4"),
                                  lambda: build_cluster("dgx-a100", 3, fabric="fat-tree", planes=2)])
def test_links_read_in_one_pass_equal_the_edge_by_edge_reading(make: object) -> None:
    g = make().graph  # type: ignore[operator]
    links, scale, types, code = _read_links(g)
    edges = list(g.edges(data=True))
    assert links.edges == [(u, v) for u, v, _ in edges]
    assert links.edge_index == {(u, v): i for i, (u, v, _) in enumerate(edges)}
    assert links.link_type == [_val(d.get("type", "")) for _, _, d in edges]
    assert links.link_tier == [_val(d.get("tier") or d.get("type", "")) for _, _, d in edges]
    assert np.array_equal(links.line_Bpus, [float(d["bw_GBps"]) * 1e3 for _, _, d in edges])
    assert np.array_equal(links.lat_us, [float(d["latency_us"]) for _, _, d in edges])
    assert np.array_equal(scale, [edge_efficiency_scale(d) for _, _, d in edges])
    assert types == sorted(set(links.link_type))
    assert [types[c] for c in code] == links.link_type


_FIELDS = ("step", "src", "dst", "chan", "frac", "nmsg", "lrank", "lstep", "lcopy", "lreduce")


def test_ring_tables_written_from_the_pattern_equal_the_schedules_array_for_array() -> None:
    from ringflow.algorithms import registry
    from ringflow.algorithms.schedule import Collective
    from ringflow.sim.fastpath import schedule_equal_table
    from ringflow.sim.transfers import from_schedule
    rng = random.Random(7)
    taken = 0
    for _ in range(120):
        n = rng.choice([2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 33])
        nch = rng.choice([1, 2, 3, 4, 8])
        nsegs = rng.choice([1, 1, 1, 2])
        coll = rng.choice([Collective.ALL_REDUCE, Collective.REDUCE_SCATTER, Collective.ALL_GATHER,
                           Collective.BROADCAST])
        rings = [tuple(rng.sample(range(n), n)) for _ in range(nch)]
        fast = schedule_equal_table(coll, "ring", n, rings=rings, nsegs=nsegs)
        if fast is None:
            continue
        taken += 1
        ref = from_schedule(registry.get_schedule(coll, "ring", n, rings=rings, nchannels=nch, nsegs=nsegs))
        assert (fast.nranks, fast.nsteps, fast.coarsened, fast.collective) == \
            (ref.nranks, ref.nsteps, ref.coarsened, ref.collective)
        assert fast.nserial is None and ref.nserial is None and fast.in_switch is None
        for f in _FIELDS:
            a, b = getattr(fast, f), getattr(ref, f)
            assert a.dtype == b.dtype and np.array_equal(a, b), (n, nch, coll, f)
    assert taken > 30


def test_hierarchical_tables_written_from_the_pattern_equal_the_schedules_array_for_array() -> None:
    from ringflow.algorithms import registry
    from ringflow.algorithms.schedule import Collective
    from ringflow.sim.fastpath import schedule_equal_table
    from ringflow.sim.transfers import from_schedule
    rng = random.Random(3)
    taken = 0
    for _ in range(60):
        hosts, per = rng.choice([(1, 4), (2, 2), (2, 3), (4, 2), (4, 8), (8, 4), (3, 4), (8, 1), (16, 2)])
        n = hosts * per
        ranks = rng.sample(range(n), n)
        groups = [ranks[h * per:(h + 1) * per] for h in range(hosts)]
        if rng.random() < 0.5:
            groups = [sorted(g) for g in groups]
        fast = schedule_equal_table(Collective.ALL_REDUCE, "hierarchical", n, groups=groups)
        if fast is None:
            continue
        taken += 1
        ref = from_schedule(registry.get_schedule(Collective.ALL_REDUCE, "hierarchical", n, host_groups=groups))
        assert (fast.nranks, fast.nsteps, fast.coarsened) == (ref.nranks, ref.nsteps, ref.coarsened)
        for f in _FIELDS:
            a, b = getattr(fast, f), getattr(ref, f)
            assert a.dtype == b.dtype and np.array_equal(a, b), (hosts, per, f)
    assert taken > 20


def test_ring_tables_not_written_where_the_schedules_bytes_are_rounded_or_segmented() -> None:
    from ringflow.algorithms.schedule import Collective
    from ringflow.sim.fastpath import schedule_equal_table
    ring = [tuple(range(6))]
    AR, AG = Collective.ALL_REDUCE, Collective.ALL_GATHER
    assert schedule_equal_table(AR, "ring", 6, rings=ring) is None          # 1/6 blocks are rounded
    assert schedule_equal_table(AG, "ring", 6, rings=ring * 3) is None      # thirds of a block per channel
    assert schedule_equal_table(AG, "ring", 6, rings=ring, nsegs=2) is None
    assert schedule_equal_table(AG, "ring", 6, rings=[(0, 1, 2, 3, 4, 4)]) is None   # not an order of ranks
    assert schedule_equal_table(Collective.BROADCAST, "ring", 8, rings=[tuple(range(8))]) is None
    assert schedule_equal_table(AR, "hierarchical", 6, groups=[[0, 1, 2], [3, 4, 5]]) is None
    assert schedule_equal_table(AR, "hierarchical", 8, groups=[[0, 1, 2], [3, 4, 5, 6, 7]]) is None
    assert schedule_equal_table(AR, "hierarchical", 8, groups=[[0, 1, 2, 3], [3, 4, 5, 6]]) is None
    assert schedule_equal_table(AR, "tree", 8) is None
    assert schedule_equal_table(AG, "ring", 6, rings=ring) is not None
    assert schedule_equal_table(AR, "hierarchical", 8, groups=[[0, 1, 2, 3], [4, 5, 6, 7]]) is not None


def test_simulated_ring_and_hierarchical_times_equal_those_of_the_schedules_tables() -> None:
    from ringflow.algorithms.schedule import Collective
    from ringflow.sim import simulate, simulate_schedule
    from ringflow.sim.api import schedule_for
    topo = build_cluster("dgx-h100", 4)
    for coll, algo in ((Collective.ALL_REDUCE, "ring"), (Collective.REDUCE_SCATTER, "ring"),
                       (Collective.ALL_GATHER, "ring"), (Collective.ALL_REDUCE, "hierarchical")):
        for size in (4096, 1 << 24):
            got = simulate(topo, coll, size, algorithm=algo, nranks=32)
            want = simulate_schedule(topo, schedule_for(topo, coll, 32, algo), size)
            assert got.time_us == want.time_us and got.protocol == want.protocol
            assert np.array_equal(got.rank_finish_us, want.rank_finish_us)


def test_models_built_from_repeated_steps_equal_the_row_by_row_build_bit_for_bit() -> None:
    from ringflow.algorithms.schedule import Collective
    from ringflow.sim import analytic
    from ringflow.sim.fabric import fabric_for
    from ringflow.sim.fastpath import fast_table
    from ringflow.sim.params import params_for
    from ringflow.topology import find_rings
    topo = build_cluster("dgx-h100", 4)
    prm = params_for(topo)
    eps = topo.endpoints()
    fab = fabric_for(topo, prm, eps)
    rings = [r.ranks for r in find_rings(topo, eps)]
    sizes = np.array([8.0, 1e4, 1e6, 1e9])
    built = 0
    for coll, algo in ((Collective.ALL_REDUCE, "ring"), (Collective.REDUCE_SCATTER, "ring"),
                       (Collective.ALL_GATHER, "ring"), (Collective.ALL_REDUCE, "hierarchical")):
        for max_transfers in (None, 9000):
            tab = fast_table(coll, algo, 32, rings=rings, groups=topo.host_groups(eps), max_transfers=max_transfers)
            assert tab is not None
            if analytic.repeated_steps(tab) is None:
                continue
            built += 1
            fast, full = analytic.build_model(tab, fab, prm), analytic._build_full(tab, fab, prm)
            assert fast.routed is None
            for f in ("base_us", "line_step", "line_a", "line_c", "step_starts", "steps_present", "local_c",
                      "link_frac", "rank_last_step"):
                assert np.array_equal(getattr(fast, f), getattr(full, f)), (coll, algo, max_transfers, f)
            for got, want in zip(fast.times_us(sizes), full.times_us(sizes), strict=True):
                assert np.array_equal(got, want)
            assert np.array_equal(fast.flows.p_link, full.flows.p_link)   # the whole table, routed on first use
    assert built >= 6


def test_repeated_steps_found_only_in_step_order_and_equal_row_for_row() -> None:
    from dataclasses import replace

    from ringflow.algorithms.schedule import Collective
    from ringflow.sim.analytic import repeated_steps
    from ringflow.sim.fastpath import fast_table
    tab = fast_table(Collective.ALL_GATHER, "ring", 64, rings=[tuple(range(64))] * 2)
    assert tab is not None
    present, pattern = repeated_steps(tab)
    assert np.array_equal(present, np.arange(tab.nsteps)) and not pattern.any()   # every step the same rows
    frac = tab.frac.copy()
    frac[tab.step == 5] *= 1.0 + 2 ** -52   # one step's bytes one ulp larger: a pattern of its own
    _, pattern = repeated_steps(replace(tab, frac=frac))
    assert list(pattern[4:7]) == [0, 1, 2] and pattern.max() == 2
    order = np.argsort(tab.src, kind="stable")
    assert repeated_steps(replace(tab, step=tab.step[order], src=tab.src[order], dst=tab.dst[order])) is None
