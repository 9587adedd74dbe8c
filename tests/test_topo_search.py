"""Ring search (optimal bottleneck, channels, multi-node), double binary trees, RINGFLOW_RINGS."""
from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringflow import config
from ringflow.errors import TopologyError
from ringflow.topology import (
    LinkType,
    NodeKind,
    Ring,
    Topology,
    all_nvlink,
    build_cluster,
    double_binary_tree,
    find_rings,
    load_topology,
    parse_rings,
    tree_children,
)
from ringflow.topology.search import brute_force_best_ring, ring_hop_types


def _is_perm(ranks, n: int) -> bool:
    return sorted(ranks) == list(range(n))


def test_dgx1_v100_rings_are_all_nvlink_and_use_every_link() -> None:
    t = load_topology("dgx1-v100")
    rings = find_rings(t)
    assert len(rings) >= 2
    for r in rings:
        assert _is_perm(r.ranks, 8)
        assert all_nvlink(t, r)
        assert r.ranks != tuple(range(8))                        # not 1-2-...-8 (GPU1-GPU2... has no NVLink 3-4)
    assert rings[0].bottleneck_GBps == 50.0                      # an all-NV2 ring exists
    assert sum(r.bottleneck_GBps for r in rings) == pytest.approx(150.0)   # 6 links x 25 GB/s out of each GPU
    # channels never oversubscribe a link direction
    load: dict = {}
    eps = t.endpoints()
    for r in rings:
        for i, j in r.hops():
            for e in t.path_edges(t.path(eps[i], eps[j])):
                load[e] = load.get(e, 0.0) + r.bottleneck_GBps
    assert all(v <= t.graph.edges[e]["bw_GBps"] + 1e-9 for e, v in load.items())


def test_identity_ring_on_dgx1_v100_is_worse() -> None:
    t = load_topology("dgx1-v100")
    naive = ring_hop_types(t, Ring(tuple(range(8)), 0.0))
    assert naive[3] == "pcie+qpi"                                # GPU3 -> GPU4 has no NVLink: PCIe and QPI
    assert naive[7] == "pcie+qpi"


@pytest.mark.parametrize("preset,gpus", [("dgx1-v100", None), ("dgx1-p100", None), ("pcie-8gpu", None),
                                         ("dgx1-v100", [0, 1, 2, 5, 6]), ("dgx1-v100", [1, 3, 4, 6, 7])])
def test_first_ring_bottleneck_is_optimal_by_brute_force(preset: str, gpus) -> None:
    t = load_topology(preset)
    eps = None if gpus is None else [t.find(f"GPU{g}") for g in gpus]
    best = brute_force_best_ring(t, eps)
    rings = find_rings(t, eps)
    assert rings[0].bottleneck_GBps == pytest.approx(best)
    assert _is_perm(rings[0].ranks, len(eps or t.endpoints()))


def _random_topology(seed: int) -> Topology:
    rnd = random.Random(seed)
    t = Topology(f"random{seed}")
    n = rnd.randint(3, 6)
    cpu = t.add_node("cpu", NodeKind.CPU)
    gpus = [t.add_node(f"g{i}", NodeKind.GPU, index=i) for i in range(n)]
    for g in gpus:
        t.add_link(g, cpu, LinkType.PCIE, rnd.choice([8.0, 16.0, 32.0]), 0.25)
    for a, b in itertools.combinations(gpus, 2):
        if rnd.random() < 0.5:
            t.add_link(a, b, LinkType.NVLINK, 25.0 * rnd.randint(1, 3), 0.2, nlinks=1)
    return t


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_random_small_topologies_brute_force(seed: int) -> None:
    t = _random_topology(seed)
    rings = find_rings(t)
    assert rings[0].bottleneck_GBps == pytest.approx(brute_force_best_ring(t))
    for r in rings:
        assert _is_perm(r.ranks, len(t.endpoints()))


def test_channels_on_nvswitch_and_nchannels() -> None:
    t = load_topology("dgx-h100")
    rings = find_rings(t)
    assert rings[0].bottleneck_GBps == 450.0
    four = find_rings(t, nchannels=4)
    assert len(four) == 4 and sum(r.bottleneck_GBps for r in four) == pytest.approx(450.0)
    assert find_rings(load_topology("dgx2"))[0].bottleneck_GBps == 150.0


def test_multi_node_ring_crosses_network_once_per_host_via_near_nics() -> None:
    t = build_cluster("dgx-h100", 4, fabric="rail")
    eps = t.endpoints()
    rings = find_rings(t)
    assert len(rings) == 8 and all(r.bottleneck_GBps == pytest.approx(50.0) for r in rings)   # 8 x 400G
    rails = set()
    for r in rings:
        assert _is_perm(r.ranks, 32)
        crossings = [(i, j) for i, j in r.hops() if t.host_of(eps[i]) != t.host_of(eps[j])]
        assert len(crossings) == 4                                  # minimum: once per host
        for i, j in crossings:
            p = t.path(eps[i], eps[j])
            nics = [n for n in p if t.kind(n) == NodeKind.NIC]
            assert t.path_class_smi(eps[i], nics[0]) == "PIX"       # NIC on the GPU's PCIe switch
            assert t.path_class_smi(nics[1], eps[j]) == "PIX"
            assert sum(1 for n in p if t.kind(n) == NodeKind.NET_SWITCH) == 1   # stays on its rail's leaf
            rails.add(t.graph.nodes[nics[0]]["rail"])
    assert rails == set(range(8))                                   # the channels spread over all 8 rails


def test_multi_node_dgx1_crossings() -> None:
    t = build_cluster("dgx1-v100", 3, fabric="fat-tree")
    eps = t.endpoints()
    for r in find_rings(t):
        assert sum(1 for i, j in r.hops() if t.host_of(eps[i]) != t.host_of(eps[j])) == 3


def test_host_cpu_ring() -> None:
    t = load_topology("host-cpu:5")
    r = find_rings(t)[0]
    assert _is_perm(r.ranks, 5) and r.bottleneck_GBps > 0


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=1, max_value=200))
def test_double_binary_tree_properties(n: int) -> None:
    trees = double_binary_tree(n)
    for parent in trees:
        assert len(parent) == n and parent.count(-1) == 1
        kids = tree_children(parent)
        assert all(len(k) <= 2 for k in kids)
        root = parent.index(-1)
        seen, stack = set(), [root]                                  # spanning tree, no cycles
        while stack:
            u = stack.pop()
            assert u not in seen
            seen.add(u)
            stack.extend(kids[u])
        assert seen == set(range(n))
    if n >= 2:
        leaves = [{r for r in range(n) if not tree_children(p)[r]} for p in trees]
        assert not (leaves[0] & leaves[1])                            # no rank is a leaf in both trees
        if n % 2 == 0:
            inner = [set(range(n)) - lv for lv in leaves]
            assert inner[0] == leaves[1] and inner[1] == leaves[0]    # exact complement


def test_parse_rings_syntax_and_errors() -> None:
    assert parse_rings("0 1 2 3|3 2 1 0", 4) == [(0, 1, 2, 3), (3, 2, 1, 0)]
    assert parse_rings("0-3-2-1", 4) == [(0, 3, 2, 1)]
    for text, needle in [("0 1 2", "missing"), ("0 1 1 2 3", "repeated"), ("0 1 2 9", "rank 9 does not exist"),
                         ("0 1 x 3", "'x' is not a rank"), ("0 1 2 3||", "ring 1 is empty"), ("", "empty")]:
        with pytest.raises(TopologyError, match=needle):
            parse_rings(text, 4)


def test_rings_knob_overrides_search() -> None:
    t = load_topology("dgx1-v100")
    with config.override(RINGS="0 1 2 3 4 5 6 7|7 6 5 4 3 2 1 0"):
        rings = find_rings(t)
    assert [r.ranks for r in rings] == [tuple(range(8)), tuple(range(7, -1, -1))]
    assert rings[0].bottleneck_GBps < 25.0                          # the naive order crosses QPI
    with config.override(RINGS="0 1 2 3 4 5 6 6"):
        with pytest.raises(TopologyError, match="RINGFLOW_RINGS ring 0 is not a permutation"):
            find_rings(t)


def test_find_rings_argument_errors() -> None:
    t = load_topology("dgx-h100")
    with pytest.raises(TopologyError, match="twice"):
        find_rings(t, [t.find("GPU0"), t.find("GPU0")])
    with pytest.raises(TopologyError, match="not a GPU"):
        find_rings(t, [t.find("GPU0"), t.find("NIC0")])
    with pytest.raises(TopologyError, match="nchannels"):
        find_rings(t, nchannels=0)


def test_dgx1_p100_four_nvlink_channels() -> None:
    t = load_topology("dgx1-p100")
    rings = find_rings(t)
    assert all(all_nvlink(t, r) for r in rings)
    assert sum(r.bottleneck_GBps for r in rings) == pytest.approx(80.0)    # 4 NVLink1 x 20 GB/s out of each GPU


def test_hierarchical_trees_chain_inside_hosts() -> None:
    from ringflow.topology import hierarchical_trees
    t = build_cluster("dgx1-v100", 5, fabric="fat-tree")
    eps = t.endpoints()
    trees = hierarchical_trees(t, eps)
    leaders = []
    for parent in trees:
        assert parent.count(-1) == 1
        cross = [(r, p) for r, p in enumerate(parent) if p >= 0 and t.host_of(eps[r]) != t.host_of(eps[p])]
        assert len(cross) == 4                                   # 5 hosts joined by 4 network edges
        for r, p in enumerate(parent):                           # inside a host: NVLink chain
            if p >= 0 and t.host_of(eps[r]) == t.host_of(eps[p]):
                assert t.path_class_nccl(eps[p], eps[r]) == "NVL"
        leaders.append({r for r, _ in cross} | {parent.index(-1)})
    assert leaders[0] == leaders[1]


def test_multi_host_ring_with_gpus_on_different_rails_stays_rail_aligned():
    """DP group of a TP=4 layout (GPUs 0 and 4 of every server): hosts alternate their order so no hop crosses rails."""
    topo = build_cluster("dgx-h100", 128, fabric="rail")
    gpus = topo.gpus()
    eps = [gpus[h * 8 + i] for h in range(128) for i in (0, 4)]
    rings = find_rings(topo, eps)
    assert rings and all(r.bottleneck_GBps == pytest.approx(50.0) for r in rings)  # one 400G NIC per hop
    order = rings[0].ranks
    for a, b in zip(order, order[1:] + order[:1], strict=True):
        if topo.host_of(eps[a]) != topo.host_of(eps[b]):
            nics = [node.split("/")[1] for node in topo.path(eps[a], eps[b]) if "/nic" in node]
            assert len(nics) == 2 and nics[0] == nics[1], (eps[a], eps[b], nics)  # same rail at both ends
