"""find_rings keeps its results per topology only while what they were searched on is unchanged: a property
test edits bandwidths (with and without `invalidate()`), endpoints, channel counts and the knobs between calls
and compares every answer with a fresh search."""
from __future__ import annotations

import random

import pytest

from ringflow.topology import build_cluster, build_preset, find_rings
from ringflow.topology import search as search_mod


def _fresh(topo, eps, nch):  # type: ignore[no-untyped-def]
    return search_mod._search_rings(topo, list(eps), nch, search_mod._capacities(topo))


def test_a_repeated_search_is_answered_from_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    topo = build_cluster("dgx-h100", 3)
    eps = topo.endpoints()[:24]
    calls = []
    real = search_mod._search_rings
    monkeypatch.setattr(search_mod, "_search_rings", lambda *a: calls.append(1) or real(*a))
    first = find_rings(topo, eps)
    assert find_rings(topo, eps) == first and len(calls) == 1
    first.clear()   # the caller's list is its own
    assert find_rings(topo, eps) and len(calls) == 1
    topo.invalidate()
    find_rings(topo, eps)
    assert len(calls) == 2


def test_rings_equal_a_fresh_search_after_random_edits(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(11)
    topos = [build_preset("dgx1-v100"), build_cluster("dgx-h100", 2), build_preset("pcie-8gpu")]
    for step in range(80):
        topo = rng.choice(topos)
        all_eps = topo.endpoints()
        action = rng.random()
        if action < 0.35:   # a link's bandwidth, sometimes without telling the topology
            u, v = rng.choice(list(topo.graph.edges))
            topo.graph.edges[u, v]["bw_GBps"] = rng.choice([5.0, 12.5, 25.0, 50.0, 100.0])
            if rng.random() < 0.5:
                topo.invalidate()
        elif action < 0.45:
            monkeypatch.setenv("RINGFLOW_NCHANNELS", str(rng.choice([1, 2, 4])))
        elif action < 0.5:
            monkeypatch.delenv("RINGFLOW_NCHANNELS", raising=False)
        # a few endpoint lists and channel counts, so that most questions were asked before
        eps = rng.choice([all_eps, all_eps[:4], all_eps[::-1][:6]])
        nch = rng.choice([None, 2])
        assert find_rings(topo, eps, nch) == _fresh(topo, eps, nch), step


def test_rings_follow_the_rings_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    topo = build_preset("dgx-h100")
    searched = find_rings(topo)
    monkeypatch.setenv("RINGFLOW_RINGS", "0 1 2 3 4 5 6 7")
    assert [r.ranks for r in find_rings(topo)] == [(0, 1, 2, 3, 4, 5, 6, 7)]
    monkeypatch.delenv("RINGFLOW_RINGS")
    assert find_rings(topo) == searched
