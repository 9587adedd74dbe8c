"""All-to-all across servers as NCCL runs it: grouped sends with PXN, every peer at once, the NVLink hop to the
rail's GPU overlapping that GPU's NIC send."""
from __future__ import annotations

import pytest

from ringflow.sim import simulate
from ringflow.sim.params import params_for
from ringflow.topology import build_cluster, load_topology


@pytest.mark.parametrize("nodes", [2, 4])
def test_default_all_to_all_across_servers_runs_at_the_nodes_share_of_the_nic_rate(nodes: int) -> None:
    topo = build_cluster("dgx-h100", nodes)
    res = simulate(topo, "all_to_all", 1 << 30)
    assert res.algorithm == "pxn"
    nic_GBps = 400 / 8 * params_for(topo).link_efficiency["ib"]
    # 1/N of a GPU's blocks stay on its server, the rest leave through its rail's NIC: algbw = N/(N-1) x the
    # NIC rate (S. Jeaugey, https://github.com/NVIDIA/nccl-tests/issues/130), busbw = algbw x (n-1)/n
    n = 8 * nodes
    assert res.busbw_GBps == pytest.approx(nodes / (nodes - 1) * nic_GBps * (n - 1) / n, rel=0.02)
    pairwise = simulate(topo, "all_to_all", 1 << 30, algorithm="pairwise")
    assert pairwise.busbw_GBps < 0.7 * res.busbw_GBps   # one peer per step: every step waits on a NIC


def test_pxn_traffic_stays_on_its_rail() -> None:
    topo = build_cluster("dgx-h100", 2)
    res = simulate(topo, "all_to_all", 1 << 28)
    tiers = {link["tier"] for link in res.top_links(10_000)}
    assert "spine" not in tiers and any(t == "nic" for t in tiers)


def test_all_to_all_inside_one_server_without_nvlink_or_on_cpu_ranks_keeps_the_flat_choice() -> None:
    assert simulate(load_topology("dgx-h100"), "all_to_all", 1 << 24).algorithm != "pxn"
    assert simulate(build_cluster("pcie-8gpu", 2), "all_to_all", 1 << 24).algorithm != "pxn"   # relays need NVLink
    cpu = build_cluster("host-cpu:4", 2)
    assert simulate(cpu, "all_to_all", 1 << 20).algorithm != "pxn"


def test_pxn_counts_as_nccls_own_all_to_all() -> None:
    from ringflow.sim.nccl_tuner import nccl_has
    assert nccl_has("all_to_all", "pxn") and nccl_has("all_to_all", "pairwise")
    assert not nccl_has("all_to_all", "bruck") and not nccl_has("all_reduce", "pxn")
