"""The cluster builder's batched paths make exactly the graph the one-by-one calls make."""
from __future__ import annotations

import gc

import pytest

from ringflow.errors import TopologyError
from ringflow.topology import LinkType, NodeKind, Topology, build_cluster, build_preset
from ringflow.topology.gcpause import gc_paused


def _graph_rows(topo: Topology) -> tuple:
    g = topo.graph
    return (list(g.nodes(data=True)), list(g.edges(data=True)), [(x, list(g.pred[x].items())) for x in g])


@pytest.mark.parametrize("preset", ["dgx-h100", "gb200-nvl72", "dgx1-v100"])
def test_copied_servers_equal_fresh_builds_in_order_with_predecessors(preset: str) -> None:
    cluster = build_cluster(preset, 3)
    fresh = Topology("fresh")
    for h in range(3):
        build_preset(preset, host=h, topo=fresh)
    g, f = cluster.graph, fresh.graph
    servers = [x for x in g if g.nodes[x]["host"] >= 0]
    assert servers == list(f)
    for x in servers:   # the same in-links (a copied server lists them in its nodes' order), one dict per link
        assert sorted((u, str(d)) for u, d in g.pred[x].items() if g.nodes[u]["host"] >= 0) == \
            sorted((u, str(d)) for u, d in f.pred[x].items())
        assert all(g.pred[v][x] is d for v, d in g.succ[x].items())
    assert {k: v for k, v in cluster._counters.items() if k[0] >= 0} == fresh._counters


def _two_nodes() -> Topology:
    t = Topology("t")
    for i in range(3):
        t.add_node(f"s{i}", NodeKind.NET_SWITCH, -1, i)
    return t


def test_add_links_equals_add_link_one_by_one() -> None:
    rows = [("s0", "s1", LinkType.IB, 50.0, 0.5, 2, "leaf-spine"), ("s1", "s2", LinkType.IB, 25.0, 0.25, 1, None),
            ("s0", "s1", LinkType.IB, 75.0, 0.5, 3, "leaf-spine")]   # a repeated link updates its attributes
    a, b = _two_nodes(), _two_nodes()
    a.add_links(rows)
    for u, v, typ, bw, lat, n, tier in rows:
        b.add_link(u, v, typ, bw, lat, nlinks=n, tier=tier)
    assert _graph_rows(a) == _graph_rows(b)
    assert a.graph.edges["s0", "s1"] is not a.graph.edges["s1", "s0"]


@pytest.mark.parametrize("bad, words", [(("s0", "s9", LinkType.IB, 1.0, 0.0, 1, None), "does not exist"),
                                        (("s0", "s0", LinkType.IB, 1.0, 0.0, 1, None), "self-loop"),
                                        (("s0", "s1", LinkType.IB, 0.0, 0.0, 1, None), "bw_GBps"),
                                        (("s0", "s1", LinkType.IB, 1.0, -1.0, 1, None), "latency_us"),
                                        (("s0", "s1", LinkType.IB, 1.0, 0.0, 1, "moon"), "tier")])
def test_add_links_rejects_a_bad_link_naming_it(bad: tuple, words: str) -> None:
    with pytest.raises(TopologyError, match=words):
        _two_nodes().add_links([bad])


def test_gc_paused_restores_the_collector_and_nests() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


class _Node:
    def __init__(self) -> None:
        self.peer: _Node | None = None


def test_what_a_pause_built_is_old_at_once_and_its_dropped_cycles_still_collected() -> None:
    import weakref
    gc.collect()
    with gc_paused():
        kept = _Node()
        kept.peer = kept
        dropped = _Node()
        dropped.peer = dropped
        gone = weakref.ref(dropped)
        del dropped
    assert any(o is kept for o in gc.get_objects(generation=2))   # not examined by young collections
    assert not any(o is kept for o in gc.get_objects(generation=0))
    assert gone() is not None
    gc.collect()
    assert gone() is None and kept.peer is kept


def test_a_pause_leaves_objects_frozen_by_others_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with gc_paused():
            built = [_Node() for _ in range(10)]
        assert gc.get_freeze_count() == frozen and len(built) == 10
    finally:
        gc.unfreeze()
