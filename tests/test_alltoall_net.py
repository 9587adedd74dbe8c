"""NCCL's all-to-all across servers: PXN relays inside the OS host (an NVL72 tray), shared connections."""
from __future__ import annotations

import pytest

from ringflow.algorithms.nccl_pxn import build_pxn
from ringflow.algorithms.schedule import Collective
from ringflow.algorithms.verifier import verify
from ringflow.errors import InvalidArgument
from ringflow.sim import simulate
from ringflow.sim.alltoall_net import (
    channels_per_net_peer,
    net_channels_per_peer,
    os_host_groups,
    p2p_protocol,
    pxn_relay_groups,
    pxn_table,
)
from ringflow.sim.references import build_topology
from ringflow.sim.transfers import from_schedule, pipelined
from ringflow.topology import build_cluster, load_topology


def _racks(partition: int = 8, nodes: int = 2):
    topo, _ = build_topology({"preset": "gb200-nvl72", "nvl_partition": partition, "nodes": nodes})
    return topo, list(topo.endpoints())


def test_os_hosts_of_nvl72_partitions_are_their_trays() -> None:
    topo, eps = _racks()
    hosts = os_host_groups(topo, eps)
    assert hosts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert all(len({topo.graph.nodes[eps[r]]["tray"] for r in h}) == 1 for h in hosts)
    assert pxn_relay_groups(topo, eps) == hosts
    cluster = build_cluster("dgx-h100", 2)
    assert pxn_relay_groups(cluster, list(cluster.endpoints())) is None   # an HGX server is one OS host


def test_network_rows_leave_through_a_gpu_of_the_senders_tray_on_the_peers_device_index() -> None:
    topo, eps = _racks()
    tray = [topo.graph.nodes[e]["tray"] for e in eps]
    server = [topo.host_of(e) for e in eps]
    index = {r: i for h in os_host_groups(topo, eps) for i, r in enumerate(h)}
    tab = pxn_table(topo, eps)
    rows = list(zip(tab.src.tolist(), tab.dst.tolist(), tab.frac.tolist(), strict=True))
    network = [(s, d, f) for s, d, f in rows if server[s] != server[d]]
    assert network and all(index[s] == index[d] for s, d, _ in network)   # the relay has the peer's device index
    block = sum(f for *_, f in network) / (16 * 8)   # each rank's 8 remote blocks cross once
    same_tray = sum(f for s, d, f in rows if server[s] == server[d] and tray[s] == tray[d]) / block
    other_tray = sum(f for s, d, f in rows if server[s] == server[d] and tray[s] != tray[d]) / block
    # per rank: 3 blocks straight to its tray, 4 to the domain's other tray, 6 of its 8 remote blocks to a relay on
    # its own tray (2 leave from itself); relays anywhere in the NVLink domain would give 6 and 8
    assert same_tray == pytest.approx(16 * (3 + 6))
    assert other_tray == pytest.approx(16 * 4)


def test_the_simulator_runs_pxn_with_tray_relays_on_either_engine() -> None:
    from ringflow.sim.api import table_for
    topo, eps = _racks()
    assert table_for(topo, "all_to_all", 16, "pxn") is pxn_table(topo, eps)
    fast, timed = (simulate(topo, "all_to_all", 1 << 28, engine=e) for e in ("analytic", "flow"))
    assert fast.algorithm == timed.algorithm == "pxn"
    # 8 of each rank's 16 blocks leave its NVLink domain through one 400 Gb/s NIC per GPU
    assert 0 < fast.busbw_GBps <= 2 * 50.0 * 15 / 16 and timed.busbw_GBps == pytest.approx(fast.busbw_GBps, rel=0.05)


def test_pxn_with_tray_relays_is_a_correct_all_to_all() -> None:
    groups = [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]
    relays = [list(range(i, i + 4)) for i in range(0, 24, 4)]
    for channels in (1, 2, 4):
        verify(build_pxn(Collective.ALL_TO_ALL, 24, host_groups=groups, relay_groups=relays, net_channels=channels))
    with pytest.raises(InvalidArgument, match="straddle"):
        build_pxn(Collective.ALL_TO_ALL, 8, host_groups=[[0, 1, 2, 3], [4, 5, 6, 7]],
                  relay_groups=[[0, 1], [2, 4], [3, 5], [6, 7]])
    with pytest.raises(InvalidArgument, match="net_channels"):
        build_pxn(Collective.ALL_TO_ALL, 8, host_groups=[[0, 1, 2, 3], [4, 5, 6, 7]], net_channels=0)


def test_channels_per_network_peer_follow_nccls_rule() -> None:
    assert channels_per_net_peer(50.0, 16, 16) == 4     # ceil(50 / 14) = 4; 4 x ceil(16 / 8) = 8 <= 16
    assert channels_per_net_peer(50.0, 64, 16) == 2     # 4 x 8 > 16: halved
    assert channels_per_net_peer(100.0, 16, 16) == 8    # an 800 Gb/s NIC: ceil(100 / 14) = 8
    assert channels_per_net_peer(50.0, 128, 8) == 1
    assert channels_per_net_peer(10.0, 4, 32, local_nics=2) == 2   # at least one per local NIC
    with pytest.raises(InvalidArgument, match="NIC"):
        channels_per_net_peer(0.0, 16, 16)
    h100 = build_cluster("dgx-h100", 2)
    assert net_channels_per_peer(h100, list(h100.endpoints())) == 4
    racks, eps = _racks(64, 2)
    assert net_channels_per_peer(racks, eps) == 1   # 128 ranks, a tray's 4 NICs: 8 p2p channels


def test_shared_connections_are_the_only_ecmp_entropy() -> None:
    topo, eps = _racks()
    tab = pxn_table(topo, eps)
    server = [topo.host_of(e) for e in eps]
    channels: dict[tuple[int, int], set[int]] = {}
    for s, d, c in zip(tab.src.tolist(), tab.dst.tolist(), tab.chan.tolist(), strict=True):
        if server[s] != server[d]:
            channels.setdefault((s, d), set()).add(c)
    want = net_channels_per_peer(topo, eps)
    assert want == 4 and all(len(cs) == want for cs in channels.values())   # 4 local sources over 4 channels


def test_hgx_servers_keep_the_server_wide_relays() -> None:
    cluster = build_cluster("dgx-h100", 2)
    eps = list(cluster.endpoints())
    ours = pxn_table(cluster, eps)
    server_wide = pipelined(from_schedule(build_pxn(Collective.ALL_TO_ALL, 16, host_groups=cluster.host_groups(eps),
                                                    net_channels=4)))
    assert sorted(zip(ours.src.tolist(), ours.dst.tolist(), strict=True)) == \
        sorted(zip(server_wide.src.tolist(), server_wide.dst.tolist(), strict=True))
    res = simulate(cluster, "all_to_all", 1 << 26)
    assert res.algorithm == "pxn"
    assert 0 < res.busbw_GBps <= 2 * 50.0 * 15 / 16   # a NIC's 50 GB/s per GPU carries half of each rank's data


def test_single_server_all_to_all_does_not_take_pxn() -> None:
    assert simulate(load_topology("dgx-h100"), "all_to_all", 1 << 24).algorithm != "pxn"


def test_all_to_all_runs_nccls_p2p_protocols_never_ll128() -> None:
    cluster = build_cluster("dgx-h100", 2)
    for size in (1 << 12, 1 << 20, 1 << 23, 1 << 28):   # network peers have no LL buffers by default: Simple
        assert simulate(cluster, "all_to_all", size).protocol == "simple"
    server = load_topology("dgx-h100")
    small, large = (simulate(server, "all_to_all", size, algorithm="pairwise") for size in (8 * 16384, 8 * 16385))
    assert (small.protocol, large.protocol) == ("ll", "simple")   # LL up to 16 KiB per peer (NCCL_P2P_LL_THRESHOLD)
    sweep = {simulate(server, "all_to_all", 1 << k, algorithm="pairwise").protocol for k in range(10, 30, 3)}
    assert "ll128" not in sweep
    cpu = load_topology("host-cpu:4")
    assert p2p_protocol(cpu, "pairwise", 4, 1 << 20, list(cpu.endpoints())) is None   # the CPU runtime's own choice
    assert p2p_protocol(server, "bruck", 8, 1 << 20, list(server.endpoints())) is None


def test_shared_connections_leave_ecmp_too_few_flows_to_spread_over_the_spine() -> None:
    from ringflow.sim.api import simulate_table
    from ringflow.topology.presets_rack import nvl_partition
    racks = build_cluster(nvl_partition(load_topology("gb200-nvl72"), 16), 4, radix=16)   # rails cross the spine
    eps = list(racks.endpoints())
    assert net_channels_per_peer(racks, eps) == 1   # 64 ranks on trays of 4 NICs: one connection per peer
    spread = pipelined(from_schedule(build_pxn(Collective.ALL_TO_ALL, 64, host_groups=racks.host_groups(eps),
                                               relay_groups=pxn_relay_groups(racks, eps), net_channels=4)))
    shared = simulate(racks, "all_to_all", 1 << 28)
    assert shared.algorithm == "pxn"
    assert shared.busbw_GBps < 0.9 * simulate_table(racks, spread, 1 << 28, protocol="simple").busbw_GBps


def test_network_rows_wait_on_their_channels_earlier_work_batches() -> None:
    from ringflow.sim.alltoall_net import p2p_batches
    assert [p2p_batches(n, 16) for n in (16, 129, 130, 256, 1024)] == [1, 1, 2, 2, 8]
    with pytest.raises(InvalidArgument, match="p2p channels"):
        p2p_batches(16, 0)
    racks, eps = _racks(64, 2)   # 128 ranks on a tray's 8 p2p channels: 2 batches, one earlier batch to wait on
    tab = pxn_table(racks, eps)
    plain = pipelined(from_schedule(build_pxn(Collective.ALL_TO_ALL, 128, host_groups=racks.host_groups(eps),
                                              relay_groups=pxn_relay_groups(racks, eps), net_channels=1)))
    server = [racks.host_of(e) for e in eps]
    extra = {(server[s] != server[d], m - m0) for s, d, m, m0 in
             zip(tab.src.tolist(), tab.dst.tolist(), tab.nmsg.tolist(), plain.nmsg.tolist(), strict=True)}
    assert extra == {(True, 1), (False, 0)}
