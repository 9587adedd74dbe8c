"""Simulator engines: flow == analytic without contention; contention cases with hand-computed answers."""
from __future__ import annotations

import numpy as np
import pytest

from ringflow.algorithms.schedule import Buffer, BufferLayout, ChunkRef, ScheduleBuilder
from ringflow.errors import InvalidArgument
from ringflow.sim.api import simulate_schedule
from ringflow.sim.params import Protocol, SimParams
from ringflow.topology.graph import LinkType, NodeKind, Topology

MB = 10**6
# exact physics for hand computation: full line rate, no software overheads
EXACT = SimParams(link_efficiency={t: 1.0 for t in ("nvlink", "pcie", "ib", "ethernet", "qpi", "shm", "loopback")},
                  protocols=(Protocol("simple", 1.0, 0.0, {}),))
IN0 = ChunkRef(Buffer.IN, 0)


def pairs_schedule(n: int, steps: list[list[tuple[int, int]]]):
    """Each listed (src, dst) moves the whole buffer (count * itemsize bytes) in its step."""
    b = ScheduleBuilder("all_reduce", n, "pairs", layouts={Buffer.IN: BufferLayout(1)})
    for s, pairs in enumerate(steps):
        for a, c in pairs:
            b.transfer(s, a, c, IN0, IN0)
    return b.build()


def ring_allreduce(n: int, nchunks_per_rank: int = 1):
    b = ScheduleBuilder("all_reduce", n, "ring", layouts={Buffer.IN: BufferLayout(n)})
    s = 0
    for phase in range(2):
        for i in range(n - 1):
            for r in range(n):
                c = ChunkRef(Buffer.IN, (r - i + phase) % n)
                b.transfer(s, r, (r + 1) % n, c, c, reduce=(phase == 0))
            s += 1
    return b.build()


def both(topo, sched, size, params=EXACT, endpoints=None):
    a = simulate_schedule(topo, sched, size, engine="analytic", params=params, endpoints=endpoints)
    f = simulate_schedule(topo, sched, size, engine="flow", params=params, endpoints=endpoints)
    return a, f


# ---------------------------------------------------------------------------------- topologies
def ring_topo(n: int, bw: float = 10.0, lat: float = 1.0) -> Topology:
    t = Topology("ring")
    for i in range(n):
        t.add_node(f"g{i}", NodeKind.GPU, host=0, index=i)
    for i in range(n):
        t.add_link(f"g{i}", f"g{(i + 1) % n}", LinkType.NVLINK, bw, lat)
    return t


def switch_topo(n: int, bw: float = 10.0, lat: float = 0.5) -> Topology:
    t = Topology("star")
    t.add_node("sw", NodeKind.NVSWITCH, host=0)
    for i in range(n):
        t.add_node(f"g{i}", NodeKind.GPU, host=0, index=i)
        t.add_link(f"g{i}", "sw", LinkType.NVLINK, bw, lat)
    return t


def dumbbell() -> Topology:
    """a0, b0 -> X -> Y -> a1, b1; every link 10 GB/s, 0.5 us."""
    t = Topology("dumbbell")
    for i, g in enumerate(("a0", "b0", "a1", "b1")):
        t.add_node(g, NodeKind.GPU, host=0, index=i)
    t.add_node("X", NodeKind.PCIE_SWITCH, host=0)
    t.add_node("Y", NodeKind.PCIE_SWITCH, host=0)
    for g in ("a0", "b0"):
        t.add_link(g, "X", LinkType.PCIE, 10.0, 0.5)
    for g in ("a1", "b1"):
        t.add_link("Y", g, LinkType.PCIE, 10.0, 0.5)
    t.add_link("X", "Y", LinkType.PCIE, 10.0, 0.5)
    return t


def pcie_box(per_switch: int = 4) -> Topology:
    """Two PCIe switches of `per_switch` GPUs under one CPU; every link 16 GB/s, 0.5 us."""
    t = Topology("pcie-box")
    t.add_node("cpu", NodeKind.CPU, host=0)
    for s in range(2):
        t.add_node(f"p{s}", NodeKind.PCIE_SWITCH, host=0)
        t.add_link(f"p{s}", "cpu", LinkType.PCIE, 16.0, 0.5)
        for i in range(per_switch):
            g = t.add_node(f"g{s * per_switch + i}", NodeKind.GPU, host=0, index=s * per_switch + i)
            t.add_link(g, f"p{s}", LinkType.PCIE, 16.0, 0.5)
    return t


def fat_tree(uplink_GBps: float) -> Topology:
    """2 leaves x 4 single-GPU hosts; NIC links 10 GB/s; one leaf-spine link of `uplink_GBps` per leaf."""
    t = Topology("fat-tree")
    t.add_node("spine", NodeKind.NET_SWITCH, host=-1, tier=1)
    for leaf in range(2):
        t.add_node(f"leaf{leaf}", NodeKind.NET_SWITCH, host=-1, tier=0)
        t.add_link(f"leaf{leaf}", "spine", LinkType.IB, uplink_GBps, 0.5, tier="leaf-spine")
        for i in range(4):
            h = leaf * 4 + i
            t.add_node(f"g{h}", NodeKind.GPU, host=h, index=0)
            t.add_node(f"n{h}", NodeKind.NIC, host=h, index=0)
            t.add_link(f"g{h}", f"n{h}", LinkType.PCIE, 64.0, 0.5)
            t.add_link(f"n{h}", f"leaf{leaf}", LinkType.IB, 10.0, 0.5, tier="nic")
    return t


def rail_fabric() -> Topology:
    """2 hosts x 2 GPUs; GPU i -> NIC i -> rail switch i; rail switches joined by one spine (10 GB/s)."""
    t = Topology("rail")
    t.add_node("spine", NodeKind.NET_SWITCH, host=-1, tier=1)
    for r in range(2):
        t.add_node(f"rail{r}", NodeKind.NET_SWITCH, host=-1, tier=0)
        t.add_link(f"rail{r}", "spine", LinkType.IB, 10.0, 0.5, tier="leaf-spine")
    for h in range(2):
        for i in range(2):
            g = t.add_node(f"h{h}g{i}", NodeKind.GPU, host=h, index=i)
            n = t.add_node(f"h{h}n{i}", NodeKind.NIC, host=h, index=i, rail=i)
            t.add_link(g, n, LinkType.PCIE, 64.0, 0.5)
            t.add_link(n, f"rail{i}", LinkType.IB, 10.0, 0.5, tier="nic")
    return t


# ---------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("n", [2, 4, 7])
@pytest.mark.parametrize("size", [4096, MB, 64 * MB])
def test_flow_equals_analytic_without_contention(n: int, size: int) -> None:
    for topo in (ring_topo(n), switch_topo(n)):
        sched = ring_allreduce(n)
        for params in (EXACT, SimParams()):
            a, f = both(topo, sched, size, params)
            assert f.time_us == pytest.approx(a.time_us, rel=1e-9)
            assert f.protocol == a.protocol
            np.testing.assert_allclose(f.link_bytes, a.link_bytes, rtol=1e-12)


def test_ring_allreduce_closed_form() -> None:
    # 2(n-1) steps of (latency + (B/n) / bw): B = 8 MB, n = 4, bw 10 GB/s = 1e4 B/us, lat 1 us
    a, f = both(ring_topo(4), ring_allreduce(4), 8 * MB)
    expect = 6 * (1.0 + 2 * MB / 1e4)
    assert a.time_us == pytest.approx(expect)
    assert f.time_us == pytest.approx(expect)
    assert a.busbw_GBps == pytest.approx(8 * MB * 1.5 / (expect * 1e3))


def test_two_rings_over_one_link_share_it() -> None:
    topo = dumbbell()
    both_rings = pairs_schedule(4, [[(0, 2), (2, 0), (1, 3), (3, 1)]] * 2)   # a0<->a1 and b0<->b1
    one_ring = pairs_schedule(4, [[(0, 2), (2, 0)]] * 2)
    lat = 1.5   # three 0.5 us hops
    alone_a, alone_f = both(topo, one_ring, MB)
    shared_a, shared_f = both(topo, both_rings, MB)
    assert alone_f.time_us == pytest.approx(2 * (lat + 100.0))        # 1 MB at 10 GB/s = 100 us
    assert shared_f.time_us == pytest.approx(2 * (lat + 200.0))       # X->Y carries 2 MB per step
    assert shared_a.time_us == pytest.approx(shared_f.time_us)
    xy = topo.graph
    fab = shared_f.fabric
    assert shared_f.link_bytes[fab.edge_index[("X", "Y")]] == pytest.approx(4 * MB)
    assert xy is not None


def test_unequal_flows_on_one_link_finish_at_max_min_times() -> None:
    # a0->a1 moves 1 MB and b0->b1 moves 3 MB over X->Y (10 GB/s): max-min gives 5+5 GB/s until
    # a finishes at 200 us, then b alone at 10 GB/s: b finishes at 400 us (+1.5 us latency each)
    b = ScheduleBuilder("all_reduce", 4, "uneven", layouts={Buffer.IN: BufferLayout(4)})
    b.transfer(0, 0, 2, ChunkRef(Buffer.IN, 0), ChunkRef(Buffer.IN, 0))
    b.transfer(0, 1, 3, ChunkRef(Buffer.IN, 1, 3), ChunkRef(Buffer.IN, 1, 3))
    a, f = both(dumbbell(), b.build(), 4 * MB)
    assert f.rank_finish_us[0] == pytest.approx(201.5)
    assert f.rank_finish_us[1] == pytest.approx(401.5)
    assert f.time_us == pytest.approx(401.5)
    # the bulk-synchronous analytic engine charges every transfer of the step the link's busy time
    assert a.rank_finish_us[0] == pytest.approx(401.5)


def test_pcie_switch_uplink_is_shared() -> None:
    topo = pcie_box()
    cross = pairs_schedule(8, [[(i, i + 4) for i in range(4)]])
    single = pairs_schedule(8, [[(0, 4)]])
    lat = 4 * 0.5   # g -> p0 -> cpu -> p1 -> g
    a1, f1 = both(topo, single, MB)
    a4, f4 = both(topo, cross, MB)
    assert f1.time_us == pytest.approx(lat + MB / 16e3)            # 62.5 us
    assert f4.time_us == pytest.approx(lat + 4 * MB / 16e3)        # 250 us: 4 MB through one uplink
    assert a4.time_us == pytest.approx(f4.time_us)
    # GPUs under the same switch do not touch the uplink
    local = pairs_schedule(8, [[(0, 1), (2, 3)]])
    _, fl = both(topo, local, MB)
    assert fl.time_us == pytest.approx(2 * 0.5 + MB / 16e3)


def test_oversubscribed_fat_tree_halves_cross_leaf_bandwidth() -> None:
    cross = pairs_schedule(8, [[(i, i + 4) for i in range(4)]])
    lat = 0.5 * 6   # g -> nic -> leaf -> spine -> leaf -> nic -> g
    _, full = both(fat_tree(40.0), cross, MB)        # 1:1: the NICs (10 GB/s) limit
    a, over = both(fat_tree(20.0), cross, MB)        # 2:1: 4 MB through a 20 GB/s uplink
    assert full.time_us == pytest.approx(lat + 100.0)
    assert over.time_us == pytest.approx(lat + 200.0)
    assert a.time_us == pytest.approx(over.time_us)
    tiers = {r["tier"]: r for r in over.tiers()}
    assert tiers["leaf-spine"]["bytes"] == pytest.approx(2 * 4 * MB)   # up at leaf0, down at leaf1


def test_rail_fabric_cross_rail_traffic_contends_at_the_spine() -> None:
    topo = rail_fabric()
    # ranks: 0 = h0g0, 1 = h0g1, 2 = h1g0, 3 = h1g1
    same_rail = pairs_schedule(4, [[(0, 2), (2, 0), (1, 3), (3, 1)]])
    cross_rail = pairs_schedule(4, [[(0, 3), (3, 0), (1, 2), (2, 1)]])
    _, fs = both(topo, same_rail, MB)
    a, fc = both(topo, cross_rail, MB)
    assert fs.time_us == pytest.approx(4 * 0.5 + 100.0)      # g -> nic -> rail -> nic -> g, no sharing
    # h0g0 -> h1g1 and h1g0 -> h0g1 both climb rail0 -> spine: 2 MB on a 10 GB/s link
    assert fc.time_us == pytest.approx(6 * 0.5 + 200.0)
    assert a.time_us == pytest.approx(fc.time_us)
    tiers = {r["tier"]: r for r in fs.tiers()}
    assert tiers["leaf-spine"]["bytes"] == 0.0


def test_flow_engine_tracks_dependencies_per_rank_not_per_step() -> None:
    # ranks 0->1 move 3 MB in step 0; ranks 2->3 move 1 MB in steps 0 and 1 over disjoint links
    topo = switch_topo(4)
    b = ScheduleBuilder("all_reduce", 4, "chains", layouts={Buffer.IN: BufferLayout(4)})
    b.transfer(0, 0, 1, ChunkRef(Buffer.IN, 0, 3), ChunkRef(Buffer.IN, 0, 3))
    b.transfer(0, 2, 3, ChunkRef(Buffer.IN, 3), ChunkRef(Buffer.IN, 3))
    b.transfer(1, 2, 3, ChunkRef(Buffer.IN, 3), ChunkRef(Buffer.IN, 3))
    a, f = both(topo, b.build(), 4 * MB)
    assert f.rank_finish_us[3] == pytest.approx(2 * (1.0 + 100.0))   # two 1 MB hops, never waiting for 0->1
    assert f.time_us == pytest.approx(1.0 + 300.0)
    assert a.time_us == pytest.approx((1.0 + 300.0) + (1.0 + 100.0))  # bulk-synchronous upper bound


def test_coarsened_flow_engine_matches_exact_ring() -> None:
    topo = ring_topo(6)
    sched = ring_allreduce(6)
    exact = simulate_schedule(topo, sched, 6 * MB, engine="flow", params=SimParams())
    coarse_p = SimParams(max_transfers=12)
    coarse = simulate_schedule(topo, sched, 6 * MB, engine="flow", params=coarse_p)
    assert coarse.coarsened > 1 and coarse.notes
    assert coarse.time_us == pytest.approx(exact.time_us, rel=1e-6)


def test_bad_inputs_raise_typed_errors() -> None:
    with pytest.raises(InvalidArgument):
        simulate_schedule(ring_topo(2), ring_allreduce(4), MB)      # more ranks than endpoints
    with pytest.raises(InvalidArgument):
        simulate_schedule(ring_topo(4), ring_allreduce(4), MB, engine="packet")
    with pytest.raises(InvalidArgument):
        simulate_schedule(ring_topo(4), ring_allreduce(4), MB, dtype="complex512")


def test_cpu_host_overrides_map_to_params_cpu() -> None:
    from ringflow.errors import ConfigError
    from ringflow.sim.params import merge_params
    p = merge_params(SimParams(), {"reduce_GBps": 5, "host_transport": "shm", "link_efficiency": {"shm": 0.5}})
    assert (p.cpu.reduce_GBps, p.cpu.host_transport, p.link_efficiency["shm"]) == (5, "shm", 0.5)
    assert merge_params(SimParams(), {"cpu": {"check_us": 4.0}}).cpu.check_us == 4.0
    assert merge_params(SimParams(), p.to_dict()) == p   # to_dict is the flat meta['sim'] form
    for bad in ({"relay_step_slowdown": 1.2}, {"cpu": {"link_efficiency": {}}}, {"host_transport": "udp"}):
        with pytest.raises(ConfigError):
            merge_params(SimParams(), bad)
