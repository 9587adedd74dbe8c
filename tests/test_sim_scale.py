"""Large clusters: the shortcuts that make a 16,384-GPU prediction fast give the same answers as the long way."""
from __future__ import annotations

import pytest

from ringflow.algorithms import tuner
from ringflow.sim import simulate
from ringflow.sim.fabric import Fabric, fabric_for
from ringflow.sim.params import params_for
from ringflow.sim.subtopo import servers_view
from ringflow.topology import build_cluster, build_preset, find_rings
from ringflow.topology.graph import Topology, predecessors, successors


@pytest.mark.parametrize("preset", ["dgx-h100", "gb200-nvl72", "dgx1-v100", "dgx-a100"])
def test_cluster_servers_copied_from_the_first_equal_fresh_builds(preset: str) -> None:
    cluster = build_cluster(preset, 3)
    fresh = Topology("fresh")
    for h in range(3):
        build_preset(preset, host=h, topo=fresh)
    g = cluster.graph
    assert [(n, d) for n, d in g.nodes(data=True) if d["host"] >= 0] == list(fresh.graph.nodes(data=True))
    assert [(u, v, d) for u, v, d in g.edges(data=True) if g.nodes[u]["host"] >= 0 and g.nodes[v]["host"] >= 0] \
        == list(fresh.graph.edges(data=True))
    assert {k: v for k, v in cluster._counters.items() if k[0] >= 0} == fresh._counters


@pytest.mark.parametrize("fabric", ["rail", "fat-tree"])
def test_servers_view_keeps_routes_rings_and_link_order(fabric: str) -> None:
    cluster = build_cluster("dgx-h100", 32, fabric=fabric)
    eps = cluster.endpoints()
    for hosts, ranks in [({0}, eps[:8]), ({0, 1, 2}, eps[:20]), (set(range(0, 32, 4)), eps[3::32])]:
        view = servers_view(cluster, hosts)
        assert len(view.graph) < len(cluster.graph)
        assert servers_view(cluster, hosts) is view
        g, h = cluster.graph, view.graph
        for adj in (successors, predecessors):
            assert all(list(adj(h)[x]) == [u for u in adj(g)[x] if u in h] for x in h)
        for a in ranks[:4]:
            for b in ranks[-4:]:
                if a != b:
                    assert view.path(a, b) == cluster.path(a, b)
                    assert view.paths(a, b) == cluster.paths(a, b)
        assert [(r.ranks, r.bottleneck_GBps) for r in find_rings(view, ranks)] == \
            [(r.ranks, r.bottleneck_GBps) for r in find_rings(cluster, ranks)]


def test_servers_view_of_most_servers_is_the_cluster() -> None:
    cluster = build_cluster("dgx-h100", 4)
    assert servers_view(cluster, {0, 1, 2}) is cluster


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_tuner_choice_on_first_server_view_equals_cluster(coll: str) -> None:
    cluster = build_cluster("dgx-h100", 16)
    for n, hosts in ((8, {0}), (16, {0, 1})):
        view = servers_view(cluster, hosts)
        for nbytes in (1 << 12, 1 << 22, 1 << 30):
            a = tuner.choose(coll, nbytes, n, topo=cluster, dtype_size=2)
            b = tuner.choose(coll, nbytes, n, topo=view, dtype_size=2)
            assert (a.algorithm, a.nsegs, a.nchannels, a.time_s) == (b.algorithm, b.nsegs, b.nchannels, b.time_s)


def test_fabrics_of_one_cluster_share_its_links_and_route_alike() -> None:
    cluster = build_cluster("dgx-h100", 8)
    prm = params_for(cluster)
    eps = cluster.endpoints()
    a, b = fabric_for(cluster, prm, eps[:16]), fabric_for(cluster, prm, eps[::8])
    assert a is not b and a.edges is b.edges and a.cap_Bpus is b.cap_Bpus
    assert not a.cap_Bpus.flags.writeable
    fresh = Fabric(cluster, prm, eps[::8])
    assert fresh.edge_index == b.edge_index and (fresh.cap_Bpus == b.cap_Bpus).all()
    slow = params_for(cluster, {"link_efficiency": {"nvlink": 0.5}})
    c = fabric_for(cluster, slow, eps[:16])
    nv = [i for i, t in enumerate(c.link_type) if t == "nvlink"]
    assert c.cap_Bpus[nv[0]] == pytest.approx(0.5 / prm.link_efficiency["nvlink"] * a.cap_Bpus[nv[0]])
    res = simulate(cluster, "all_reduce", 1 << 24, nranks=8, endpoints=eps[::8], algorithm="ring")
    assert res.time_us > 0


def test_step_time_with_server_views_equals_step_time_on_the_whole_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from ringflow.sim import subtopo
    from ringflow.workload.commmodel import SimModel
    from ringflow.workload.layout import Layout
    from ringflow.workload.models import load_model
    from ringflow.workload.steptime import step_time
    model = load_model("llama3-70b")
    layout = Layout(tp=8, pp=4, dp=4, global_batch=64, seq_len=4096)
    fast = step_time(model, layout, build_cluster("dgx-h100", 16), comm=SimModel())
    monkeypatch.setattr(subtopo, "servers_view", lambda topo, hosts: topo)
    whole = step_time(model, layout, build_cluster("dgx-h100", 16), comm=SimModel())
    assert fast.step_time_s == whole.step_time_s
    assert fast.breakdown == whole.breakdown
