"""Every preset's invariants against the seeds' and vendors' facts."""
from __future__ import annotations

import itertools

import pytest

from ringflow.hardware import nvlink_gen, pcie_GBps
from ringflow.topology import PRESETS, LinkType, NodeKind, load_topology
from ringflow.topology.presets import DGX1V_NVLINKS


def _gpu(t, i):
    return t.find(f"GPU{i}")


def test_all_presets_build_and_are_connected() -> None:
    for name in PRESETS:
        t = load_topology(name)
        eps = t.endpoints()
        assert eps, name
        for a, b in itertools.islice(itertools.permutations(eps, 2), 60):
            assert t.bottleneck_GBps(a, b) > 0
        for u, v, d in t.graph.edges(data=True):
            assert t.graph.has_edge(v, u), (name, u, v)
            assert d["bw_GBps"] > 0 and d["latency_us"] >= 0


def test_dgx_h100_every_pair_450_per_direction() -> None:
    t = load_topology("dgx-h100")
    gpus = t.gpus()
    assert len(gpus) == 8
    fabric = t.nodes(NodeKind.NVSWITCH)
    assert len(fabric) == 1 and t.graph.nodes[fabric[0]]["chips"] == 4
    assert 2 * t.graph.nodes[fabric[0]]["external_GBps"] == 3600.0          # seed: 72 NVLink4 ports, ~3.6 TB/s
    for a, b in itertools.permutations(gpus, 2):
        assert t.bottleneck_GBps(a, b) == pytest.approx(450.0)
        assert t.path_class_smi(a, b) == "NV18" and t.path_class_nccl(a, b) == "NVL"
    nics = t.nics()
    assert len(nics) == 8 and all(t.graph.nodes[n]["speed_gbps"] == 400 for n in nics)
    for g in gpus:   # every GPU has a NIC behind its own PCIe switch
        assert "PIX" in [t.path_class_smi(g, n) for n in nics]
        assert t.graph.nodes[g]["model"] == "H100"


def test_dgx1_v100_links_as_nvidia_smi_prints_them() -> None:
    t = load_topology("dgx1-v100")
    per_gpu = {i: 0 for i in range(8)}
    for (x, y), n in DGX1V_NVLINKS.items():
        assert t.path_class_smi(_gpu(t, x), _gpu(t, y)) == f"NV{n}"
        assert t.link(_gpu(t, x), _gpu(t, y))["bw_GBps"] == n * nvlink_gen(2).link_GBps
        per_gpu[x] += n
        per_gpu[y] += n
    assert set(per_gpu.values()) == {6}                  # 6 NVLinks per V100
    assert max(DGX1V_NVLINKS.values()) == 2              # at most 2 links between two GPUs
    no_nv = [(a, b) for a, b in itertools.combinations(range(8), 2) if (a, b) not in DGX1V_NVLINKS]
    assert len(no_nv) == 12
    for a, b in no_nv:                                   # e.g. GPU0-GPU5: no NVLink, across QPI
        assert t.path_class_smi(_gpu(t, a), _gpu(t, b)) == "SYS"
        assert any(t.graph.edges[e]["type"] == LinkType.QPI for e in t.path_edges(t.path(_gpu(t, a), _gpu(t, b))))
    # GPU pairs behind PCIe switches, each with one EDR NIC; two CPUs over QPI
    assert t.path_class_smi(_gpu(t, 0), t.find("NIC0")) == "PIX"
    assert t.path_class_smi(_gpu(t, 0), t.find("NIC1")) == "PHB"
    assert len(t.nodes(NodeKind.CPU)) == 2 and len(t.nodes(NodeKind.PCIE_SWITCH)) == 4
    assert t.bottleneck_GBps(_gpu(t, 0), _gpu(t, 5)) == pytest.approx(pcie_GBps(3, 16))
    assert t.path_class_nccl(_gpu(t, 0), _gpu(t, 5)) == "NVB"   # reachable over NVLink via GPU4


def test_dgx1_p100_cube_mesh() -> None:
    t = load_topology("dgx1-p100")
    for g in t.gpus():
        nv = [d for _, d in t.graph._succ[g].items() if d["type"] == LinkType.NVLINK]
        assert len(nv) == 4 and all(d["bw_GBps"] == 20.0 for d in nv)   # 4 x 40 GB/s bidir = 160


def test_dgx2_uniform_any_to_any() -> None:
    t = load_topology("dgx2")
    gpus = t.gpus()
    assert len(gpus) == 16
    assert sum(t.graph.nodes[s]["chips"] for s in t.nodes(NodeKind.NVSWITCH)) == 12
    bws = {t.bottleneck_GBps(a, b) for a, b in itertools.permutations(gpus, 2)}
    assert bws == {150.0}                                               # 6 x 25 GB/s, every pair
    assert {t.path_class_smi(a, b) for a, b in itertools.permutations(gpus, 2)} == {"NV6"}
    trunk = t.link(*t.nodes(NodeKind.NVSWITCH))
    assert trunk["nlinks"] == 48 and 2 * trunk["bw_GBps"] == 2400.0     # seed: 2400 GB/s in total


def test_dgx_a100_nv12() -> None:
    t = load_topology("dgx-a100")
    for a, b in itertools.permutations(t.gpus(), 2):
        assert t.bottleneck_GBps(a, b) == 300.0 and t.path_class_smi(a, b) == "NV12"
    assert t.path_class_smi(_gpu(t, 0), t.find("NIC0")) == "PXB"
    assert t.path_class_smi(_gpu(t, 0), t.find("NIC2")) == "NODE"


def test_gb200_nvl72_one_nvlink_domain() -> None:
    t = load_topology("gb200-nvl72")
    gpus = t.gpus()
    assert len(gpus) == 72 and t.hosts() == [0]
    g0 = gpus[0]
    for g in gpus[1:]:
        assert t.path_class_nccl(g0, g) == "NVL"
        assert t.bottleneck_GBps(g0, g) == 900.0
    assert {t.graph.nodes[g]["tray"] for g in gpus} == set(range(18))
    far_nic = t.find("NIC2")                        # behind another Grace: reached by relaying over a GPU (PXN)
    p = t.path(g0, far_nic)
    assert [t.kind(n) for n in p] == [NodeKind.GPU, NodeKind.NVSWITCH, NodeKind.GPU, NodeKind.CPU, NodeKind.NIC]
    assert t.path(g0, t.find("NIC0"))[1] == t.find("CPU0")  # its own Grace's NIC: over C2C


def test_pcie_8gpu_has_no_nvlink() -> None:
    t = load_topology("pcie-8gpu")
    assert not [e for e in t.graph.edges(data=True) if e[2]["type"] == LinkType.NVLINK]
    assert len(t.nodes(NodeKind.CPU)) == 2 and len(t.nodes(NodeKind.PCIE_SWITCH)) == 4
    g = t.gpus()
    assert [t.path_class_smi(g[0], x) for x in g] == ["X", "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"]


def test_host_cpu_is_uncalibrated_procs() -> None:
    t = load_topology("host-cpu:6")
    assert len(t.endpoints()) == 6 and all(t.kind(e) == NodeKind.PROC for e in t.endpoints())
    assert t.meta["calibrated"] is False
    types = {d["type"] for _, _, d in t.graph.edges(data=True)}
    assert {LinkType.SHM, LinkType.LOOPBACK} <= types
    e = t.endpoints()
    assert t.graph.edges[e[0], e[1]]["type"] == LinkType.LOOPBACK
    assert [t.graph.edges[x]["type"] for x in t.path_edges(t.path(e[0], e[1]))] == [LinkType.SHM, LinkType.SHM]
