"""NVLink partitions of NVL72 racks joined by their trays' NICs, and NCCL's tree across servers."""
from __future__ import annotations

import pytest

from ringflow.algorithms.verifier import verify
from ringflow.errors import InvalidArgument, TopologyError
from ringflow.sim.api import simulate
from ringflow.sim.nccl_tree import build_nccl_tree, simulate_nccl_tree, tree_parents
from ringflow.topology import build_cluster, double_binary_tree, load_topology
from ringflow.topology.presets_rack import nvl_partition
from ringflow.workload import published

GiB = 2**30


@pytest.fixture(scope="module")
def rack():
    return load_topology("gb200-nvl72")


@pytest.fixture(scope="module")
def three_partitions(rack):
    return build_cluster(nvl_partition(rack, 8), 3)


def _root(parent: list[int], r: int) -> int:
    seen = set()
    while parent[r] >= 0:
        assert r not in seen, "cycle in a tree"
        seen.add(r)
        r = parent[r]
    return r


def test_partition_keeps_whole_trays_and_their_links(rack) -> None:
    part = nvl_partition(rack, 8)
    g = part.graph
    assert len(part.gpus()) == 8 and len(part.nics()) == 8
    assert {g.nodes[x]["tray"] for x in part.gpus()} == {0, 1}
    for gpu in part.gpus():   # every kept GPU keeps its NVLink rate to the switch chips
        sw = [v for _, v in g.out_edges(gpu) if g.nodes[v]["kind"].value == "nvswitch"]
        assert len(sw) == 1
        assert g.edges[gpu, sw[0]]["bw_GBps"] == rack.graph.edges[gpu, sw[0]]["bw_GBps"]
    assert part.meta["nvl_partition"]["gpus"] == 8
    assert len(rack.gpus()) == 72   # the rack itself is untouched


@pytest.mark.parametrize("gpus", [6, 0, 76])
def test_partition_sizes_other_than_whole_trays_are_refused(rack, gpus) -> None:
    with pytest.raises(TopologyError, match="multiple of the tray"):
        nvl_partition(rack, gpus)


def test_partition_of_a_server_is_refused() -> None:
    with pytest.raises(TopologyError, match="NVL72 rack"):
        nvl_partition(load_topology("dgx-h100"), 8)


def test_partitions_reach_each_other_only_through_their_nics(three_partitions) -> None:
    topo = three_partitions
    assert topo.hosts() == [0, 1, 2] and len(topo.endpoints()) == 24
    path = topo.path("h0/gpu3", "h1/gpu3")
    kinds = [topo.graph.nodes[n]["kind"].value for n in path]
    assert "nic" in kinds and "nvswitch" not in kinds


def test_nccl_trees_chain_each_server_and_join_the_chain_heads() -> None:
    groups = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    trees = tree_parents(groups, channels=4)
    assert len(trees) == 8
    for t, parent in enumerate(trees):
        head = t // 2   # channel c's chains start at local GPU c
        roots = {_root(parent, r) for r in range(12)}
        assert len(roots) == 1
        for r, p in enumerate(parent):
            if p >= 0 and p // 4 != r // 4:   # an edge between servers joins two chain heads
                assert r % 4 == head and p % 4 == head
    # between servers each tree is the double binary tree over the servers, on the chain heads
    host_trees = double_binary_tree(3)
    for t, parent in enumerate(trees):
        c, ht = t // 2, host_trees[t % 2]
        for h in range(3):
            up = parent[4 * h + c]
            assert (up < 0 and ht[h] < 0) or up == 4 * ht[h] + c


def test_nccl_tree_schedule_is_a_correct_all_reduce() -> None:
    s = build_nccl_tree([[0, 1], [2, 3], [4, 5]], channels=2, nsegs=2)
    report = verify(s)
    assert report.nranks == 6


def test_nccl_tree_needs_several_servers() -> None:
    with pytest.raises(InvalidArgument, match="2 or more servers"):
        build_nccl_tree([[0, 1, 2]], channels=1)


def test_nccl_tree_is_bounded_by_the_nics_and_beats_the_flat_tree(three_partitions) -> None:
    topo = three_partitions
    size = GiB
    res = simulate_nccl_tree(topo, 24, size)
    # the registry's flat double binary tree over all 24 ranks (2 channels), at its fastest segment count
    flat = simulate(topo, "all_reduce", size, algorithm="tree", nchannels=2)
    assert res.busbw_GBps > flat.busbw_GBps
    # over 3 servers the busiest chain head moves 3 tree shares (S / 16 each) per direction on its NIC (a parent
    # and a child in one tree, a parent in the other; double_binary_tree(3)), so algbw <= 2 / 3 x the NICs' rate
    nic_GBps = sum(topo.graph.nodes[n]["speed_gbps"] / 8 for n in topo.nics(0))
    assert size / res.time_us / 1e3 <= nic_GBps * 2 / 3 * 1.0001
    assert any("nccl tree" in n for n in res.notes)


def test_published_partition_cases_are_expressible() -> None:
    cases = {c["id"]: c for c in published.load_cases()}
    consts = published.Constants.defaults()
    for cid in ("gb200-3xnvl8-allreduce-ring", "gb200-3xnvl8-allreduce-tree"):
        pr = published.predict(cases[cid], consts)
        assert pr.status == "ok" and pr.value and pr.value > 0, (cid, pr.status)
        assert pr.info["link_class"] == "net"


def test_deepseek_v3_stage_split_from_the_recipe_is_expressible() -> None:
    case = next(c for c in published.load_cases() if c["id"] == "bridge-25.11-gb200-deepseek-v3-bf16")
    assert sum(case["layout"]["stage_layers"]) == 61
    pr = published.predict(case, published.Constants.defaults())
    assert pr.status.startswith("ok") and pr.value and pr.value > 0


def test_nccl_choice_of_tree_across_servers_is_simulated_as_nccl_tree() -> None:
    from ringflow.sim.nccl_tuner import nccl_rows
    topo = build_cluster("dgx-a100", 3)
    row = nccl_rows(topo, "all_reduce", [2**20], 24)[0]
    assert row["algorithm"] == "tree"   # NCCL's own tuning picks its tree at 1 MiB on 3 servers
    want = simulate_nccl_tree(topo, 24, 2**20, protocol=row["protocol"]).time_us
    assert row["sim_time_us"] == pytest.approx(want, rel=1e-4)


def test_the_tree_across_servers_is_nccls_tree(three_partitions) -> None:
    res = simulate(three_partitions, "all_reduce", GiB, algorithm="tree")
    assert res.time_us == simulate_nccl_tree(three_partitions, 24, GiB).time_us
    assert any("nccl tree" in n for n in res.notes)
