"""The router's ECMP sets between network switches are every shortest switch-only path, whichever pairs it
was asked for before (its breadth-first searches are kept per source switch)."""
from __future__ import annotations

import random

import networkx as nx
import pytest

from ringflow.topology import NodeKind, build_cluster
from ringflow.topology.routing import Router


@pytest.mark.parametrize("kw", [dict(preset="dgx-h100", nodes=80, tiers=3),
                                dict(preset="dgx-a100", nodes=12, fabric="fat-tree", planes=2)])
def test_switch_paths_are_all_shortest_switch_paths_in_any_query_order(kw: dict) -> None:
    topo = build_cluster(**kw)
    g = topo.graph
    switches = [n for n, d in g.nodes(data=True) if d["kind"] == NodeKind.NET_SWITCH]
    sub = g.subgraph(switches)
    leaves = [n for n in switches if g.nodes[n]["tier"] == 0]
    rng = random.Random(5)
    pairs = [(rng.choice(leaves), rng.choice(leaves)) for _ in range(40)]
    router = Router(topo)
    checked = 0
    for x, y in pairs:
        got = router._switch_paths(x, y)
        fresh_each = Router(topo)._switch_paths(x, y)   # a router that answers only this pair
        assert got == fresh_each
        if x == y:
            want = [[x]]
        else:   # leaves of two planes have no path between them
            want = sorted(nx.all_shortest_paths(sub, x, y)) if nx.has_path(sub, x, y) else []
        if len(want) <= 64:
            assert got == want
            checked += 1
    assert checked >= 20


def test_routes_agree_between_a_router_warmed_by_other_pairs_and_a_fresh_one() -> None:
    topo = build_cluster("dgx-h100", 70, tiers=3)
    eps = topo.endpoints()
    rng = random.Random(9)
    pairs = [(rng.choice(eps), rng.choice(eps)) for _ in range(60)]
    warm = Router(topo)
    for a, b in pairs:
        warm.paths(a, b)
    for a, b in reversed(pairs):
        fresh = Router(topo)
        assert warm.path(a, b) == fresh.path(a, b) and warm.paths(a, b) == fresh.paths(a, b)
