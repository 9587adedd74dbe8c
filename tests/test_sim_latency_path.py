"""The analytic engine's latency follows the data's path (per rank and channel), its bandwidth stays per step."""
from __future__ import annotations

import numpy as np
import pytest

from ringflow.algorithms.schedule import Buffer, BufferLayout, ChunkRef, Collective, ScheduleBuilder
from ringflow.sim import analytic, nccl_tuner
from ringflow.sim.api import simulate, simulate_schedule, simulate_table, table_for
from ringflow.sim.params import Protocol, SimParams
from ringflow.topology import build_cluster, load_topology
from ringflow.topology.graph import LinkType, NodeKind, Topology

MB = 10**6
# overheads only on the network class, so a hand count of network hops gives the latency
NET_ONLY = SimParams(link_efficiency={t: 1.0 for t in ("nvlink", "pcie", "ib", "ethernet", "qpi", "shm", "loopback")},
                     protocols=(Protocol("simple", 1.0, 0.0, {"net": 10.0, "nvlink": 1.0}),))


def two_hosts(per_host: int) -> Topology:
    """Two hosts of `per_host` GPUs on one NVLink switch each, every GPU with a NIC on one IB switch."""
    t = Topology("two-hosts")
    t.add_node("ib", NodeKind.NET_SWITCH, host=-1)
    for h in range(2):
        t.add_node(f"h{h}/sw", NodeKind.NVSWITCH, host=h)
        for i in range(per_host):
            g, nic = f"h{h}/g{i}", f"h{h}/nic{i}"
            t.add_node(g, NodeKind.GPU, host=h, index=i)
            t.add_node(nic, NodeKind.NIC, host=h)
            t.add_link(g, f"h{h}/sw", LinkType.NVLINK, 100.0, 0.0)
            t.add_link(g, nic, LinkType.PCIE, 1000.0, 0.0)
            t.add_link(nic, "ib", LinkType.IB, 10.0, 0.0)
    return t


def ring_rows(b: ScheduleBuilder, order: list[int], channel: int, block0: int) -> None:
    """One ring all-reduce over `order` on `channel`, on blocks block0 .. block0 + n - 1."""
    n = len(order)
    for phase in range(2):
        for i in range(n - 1):
            for k, r in enumerate(order):
                c = ChunkRef(Buffer.IN, block0 + (k - i + phase) % n)
                b.transfer(phase * (n - 1) + i, r, order[(k + 1) % n], c, c, reduce=phase == 0, channel=channel)


def test_a_chunk_pays_the_network_message_cost_only_where_its_ring_crosses_servers() -> None:
    """Two rings of 4 ranks over 2 hosts, each crossing the network at different positions: in every one of
    the 6 steps some channel crosses it, but along each channel's ring a chunk crosses it in 3 of 6 steps
    at most (2 network edges of 4, 6 consecutive edges)."""
    topo = two_hosts(2)
    b = ScheduleBuilder("all_reduce", 4, "two-rings", layouts={Buffer.IN: BufferLayout(8)}, nchannels=2)
    ring_rows(b, [0, 1, 2, 3], 0, 0)
    ring_rows(b, [0, 2, 1, 3], 1, 4)   # every edge crosses servers
    sched = b.build()
    res = simulate_schedule(topo, sched, 8, params=NET_ONLY)
    # channel 1 crosses in all 6 steps: 6 x 10; channel 0 at most 3 x 10 + 3 x 1; the critical path is channel 1
    assert res.time_us == pytest.approx(6 * 10.0, rel=1e-3)
    one = ScheduleBuilder("all_reduce", 4, "ring", layouts={Buffer.IN: BufferLayout(4)})
    ring_rows(one, [0, 1, 2, 3], 0, 0)
    alone = simulate_schedule(topo, one.build(), 8, params=NET_ONLY)
    # steps 0..5: edges 3->0 and 1->2 cross; the worst start crosses in 3 of the 6 steps (was 6 x 10 per step)
    assert alone.time_us == pytest.approx(3 * 10.0 + 3 * 1.0, rel=1e-3)


def test_a_rank_whose_sends_depend_on_nothing_it_receives_does_not_wait_for_them_to_land() -> None:
    topo = two_hosts(1)
    b = ScheduleBuilder("all_reduce", 2, "burst", layouts={Buffer.IN: BufferLayout(3)})
    for s in range(3):
        b.transfer(s, 0, 1, ChunkRef(Buffer.IN, s), ChunkRef(Buffer.IN, s))
    res = simulate_schedule(topo, b.build(), 8, params=NET_ONLY)
    # each send costs its sender the NVLink figure (1 us), the network's rest is in flight: 2 x 1 + 10
    assert res.time_us == pytest.approx(2 * 1.0 + 10.0, rel=1e-3)


@pytest.mark.parametrize("nodes", [2, 4])
def test_small_multi_server_rings_come_near_nccls_ring_latency(nodes: int) -> None:
    """NCCL's model counts the network's hop latency 2 (nodes - 1) times for a ring all-reduce; every other
    step pays the NVLink figure. The simulation of its ring (NCCL's run-time channels) stays within 30 %."""
    topo = build_cluster("dgx-h100", nodes)
    n = 8 * nodes
    sys_ = nccl_tuner.system_for(topo, n)
    tab = table_for(topo, Collective.ALL_REDUCE, n, "ring", nchannels=sys_.run_channels())
    for proto in ("ll", "simple"):
        want = nccl_tuner.algo_time_us(sys_, Collective.ALL_REDUCE, "ring", proto, 8)
        assert want is not None
        got = simulate_table(topo, tab, 8, protocol=proto).time_us
        assert want * 0.9 < got < want * 1.3, (proto, got, want)


@pytest.mark.parametrize("algorithm", ["ring", "nvls"])
def test_one_server_large_calls_equal_the_flow_engine(algorithm: str) -> None:
    """Inside one server every step of these schedules is on the data's path and nothing contends unevenly,
    so the analytic engine still equals the flow engine (the bulk-synchronous per-step result) at 256 MiB+."""
    topo = load_topology("dgx-h100")
    for size in (256 << 20, 1 << 30):
        a = simulate(topo, "all_reduce", size, algorithm=algorithm, nranks=8, nchannels=8 if algorithm == "ring"
                     else None, nsegs=None if algorithm == "ring" else 4)
        f = simulate(topo, "all_reduce", size, algorithm=algorithm, nranks=8, nchannels=8 if algorithm == "ring"
                     else None, nsegs=None if algorithm == "ring" else 4, engine="flow")
        assert a.time_us == pytest.approx(f.time_us, rel=5e-3)


def test_the_call_is_the_tighter_of_the_path_and_the_lock_step_bounds() -> None:
    """Per protocol: min(critical path + B x slope, every step at its slowest row); the path bound wins for a
    ring across servers at every size, and the lock-step one never loses by more than its own value."""
    topo = build_cluster("dgx-h100", 2)
    tab = table_for(topo, Collective.ALL_REDUCE, 16, "ring", nchannels=16)
    from ringflow.sim.fabric import fabric_for
    from ringflow.sim.params import params_for
    prm = params_for(topo)
    model = analytic.model_for(tab, fabric_for(topo, prm, topo.endpoints()[:16]), prm)
    sizes = np.array([8.0, 1 << 20, 1 << 28, 1 << 30])
    for p in range(len(prm.protocols)):
        path = model.base_us[p] + model.latency_us[p] + model.slope_us_per_byte(p) * sizes
        lock = np.array([model.base_us[p] + model.lockstep_times_us(b, p).sum() for b in sizes])
        got = np.array([model.base_us[p] + model.step_times_us(b, p).sum() for b in sizes])
        assert got == pytest.approx(path, rel=1e-12)
        assert np.all(path < lock)
        assert np.all(model.step_lat[p] >= 0)
    best, _ = model.times_us(sizes)
    assert np.all(np.diff(best) > 0)
