"""NVLS-Tree from its table written directly, and that table's model from a few-step template, against the
registry's schedule flattened and simulated in full."""
from __future__ import annotations

import numpy as np
import pytest

from ringflow.algorithms import registry
from ringflow.algorithms.schedule import Collective
from ringflow.errors import InvalidArgument
from ringflow.sim import analytic
from ringflow.sim.api import endpoints_of
from ringflow.sim.fabric import fabric_for
from ringflow.sim.nvls import (
    NVLS_CHUNKS,
    server_switches,
    simulate_switch_algorithm,
    simulate_switch_schedule,
    simulate_switch_table,
    switch_schedule_table,
    template,
)
from ringflow.sim.nvls_tree import template_segments, tree_table
from ringflow.sim.params import params_for
from ringflow.topology import build_cluster

AR = Collective.ALL_REDUCE
SIZES = (8, 4096, 1 << 20, 64 << 20, 1 << 30, 16 << 30)


def _schedule_table(groups: list[list[int]], nsegs: int):
    """What `simulate_switch_schedule` simulates for the registry's NVLS-Tree schedule."""
    n = sum(len(g) for g in groups)
    s = registry.get_schedule(AR, "nvls_tree", n, nsegs=nsegs, host_groups=groups)
    return s, switch_schedule_table(s)


@pytest.mark.parametrize("groups", [
    [[0, 1, 2, 3], [4, 5, 6, 7]],
    [[0, 3], [1, 4], [2, 5]],                                    # servers' ranks interleaved
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]],   # chunks of 1 / 3: uneven reference splits
    [[0], [1], [2], [3]],                                        # one GPU per server
    [[0, 1, 2, 3]],                                              # one server: no tree
])
@pytest.mark.parametrize("nsegs", [1, 3, 4, 16])
def test_the_direct_table_has_the_schedule_s_rows(groups, nsegs) -> None:
    """Same steps, pairs, messages and reductions; bytes equal up to the reference count's rounding."""
    _, full = _schedule_table(groups, nsegs)
    got = tree_table(groups, nsegs)
    assert got.mismatch(full) is None
    assert not got.lcopy.any() and not full.lcopy.any()


def test_the_table_refuses_a_single_rank_and_no_segments() -> None:
    with pytest.raises(InvalidArgument, match="2 or more ranks"):
        tree_table([[0]], 4)
    with pytest.raises(InvalidArgument, match="1 or more segments"):
        tree_table([[0, 1], [2, 3]], 0)
    with pytest.raises(InvalidArgument, match="partition"):
        tree_table([[0, 1], [1, 2]], 4)


@pytest.mark.parametrize("nodes", [2, pytest.param(5, marks=pytest.mark.long)])
def test_simulated_times_equal_the_full_schedule_s_at_every_segment_count(nodes) -> None:
    """dgx-h100 servers (8 GPUs: chunks of 1 / 2**k, no rounding): bit-identical per rank, every segment count
    and size; the template serves the counts above its own (5 servers: 16, so 32)."""
    topo = build_cluster("dgx-h100", nodes)
    eps = endpoints_of(topo)
    n = len(eps)
    groups = [list(g) for g in topo.host_groups(eps)]
    sw = server_switches(topo, groups, eps)
    for c in NVLS_CHUNKS if nodes > 2 else (1, 4, 32):
        if c > 32:
            continue
        s, _ = _schedule_table(groups, c)
        for size in SIZES if nodes > 2 else (8, 1 << 30):
            want = simulate_switch_schedule(topo, s, size, endpoints=eps)
            got = simulate_switch_table(topo, tree_table(groups, c), n, sw, size, endpoints=eps)
            assert got.time_us == want.time_us, (c, size)
            assert np.array_equal(got.rank_finish_us, want.rank_finish_us)
            assert np.array_equal(got.link_bytes, want.link_bytes)
            assert got.switches == want.switches and got.nranks == n
    assert template_segments(5) == 16


def test_uneven_chunks_simulate_within_the_reference_rounding() -> None:
    """Three GPUs of each of three servers (chunks of 1 / (3 C)): the schedule's bytes are rounded at its
    reference count, the table's exact; times agree to 1e-6 and the choice of segments is the same."""
    topo = build_cluster("dgx-h100", 3)
    eps = [g for h in topo.hosts() for g in topo.gpus(h)[:3]]
    groups = [list(g) for g in topo.host_groups(eps)]
    assert [len(g) for g in groups] == [3, 3, 3]
    sw = server_switches(topo, groups, eps)
    for c in (1, 4, 32):
        s, _ = _schedule_table(groups, c)
        for size in SIZES:
            want = simulate_switch_schedule(topo, s, size, endpoints=eps).time_us
            got = simulate_switch_table(topo, tree_table(groups, c), 9, sw, size, endpoints=eps).time_us
            assert got == pytest.approx(want, rel=1e-6), (c, size)


def test_the_model_from_the_template_equals_the_model_built_in_full() -> None:
    """Above the template's segment count (a power of two), every step's cost lines, the ranks' last steps and
    the link bytes are the template's scaled; nothing else gets a template."""
    topo = build_cluster("dgx-h100", 3)
    eps = endpoints_of(topo)
    groups = [list(g) for g in topo.host_groups(eps)]
    prm = params_for(topo)
    fab = fabric_for(topo, prm, eps + server_switches(topo, groups, eps))
    Ct = template_segments(3)
    sizes = np.array([8.0, 1 << 16, 1 << 24, 1 << 33])
    for c in (2 * Ct,):
        tab = tree_table(groups, c)
        tpl = template(tab)
        assert tpl is not None and tpl[0] is tree_table(groups, Ct) and tpl[2] == Ct / c
        fast = analytic.model_for(tab, fab, prm)
        full = analytic.build_model(tab, fab, prm)
        assert fast.routed is None                         # built without routing the full table
        for p in range(len(prm.protocols)):
            for b in sizes:
                assert fast.step_times_us(b, p) == pytest.approx(full.step_times_us(b, p), rel=1e-12, abs=0)
        assert np.array_equal(fast.times_us(sizes)[0], full.times_us(sizes)[0])
        assert np.array_equal(fast.rank_last_step, full.rank_last_step)
        assert fast.link_frac == pytest.approx(full.link_frac, rel=1e-12)
        assert np.array_equal(fast.local_c, full.local_c)
    assert template(tree_table(groups, Ct)) is None        # the template itself, and counts at or below it
    assert template(tree_table(groups, 3 * Ct)) is None    # not a power of two
    assert template(_schedule_table(groups, 2 * Ct)[1]) is None   # a table this module did not write


def test_the_flow_engine_and_the_timeline_run_on_the_direct_table() -> None:
    topo = build_cluster("dgx-h100", 2)
    eps = endpoints_of(topo)
    groups = [list(g) for g in topo.host_groups(eps)]
    s, _ = _schedule_table(groups, 4)
    for engine in ("analytic", "flow"):
        want = simulate_switch_schedule(topo, s, 64 << 20, endpoints=eps, engine=engine, timeline=True)
        got = simulate_switch_table(topo, tree_table(groups, 4), 16, server_switches(topo, groups, eps), 64 << 20,
                                    endpoints=eps, engine=engine, timeline=True)
        assert got.time_us == pytest.approx(want.time_us, rel=1e-12)
        assert np.asarray(sorted(got.timeline)) == pytest.approx(np.asarray(sorted(want.timeline)), rel=1e-12)
    best = simulate_switch_algorithm(topo, "nvls_tree", 16, 64 << 20, timeline=True)
    assert best.timeline and any("pipeline segments" in x for x in best.notes)
