"""nvidia-smi topo -m fixtures rebuild the right graph; detection works without GPUs."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ringflow.errors import TopologyError
from ringflow.topology import LinkType, NodeKind, load_topology
from ringflow.topology.detect import detect_topology
from ringflow.topology.smi_parser import parse_smi_text, render_smi, topology_from_smi

FIX = Path(__file__).parent / "fixtures" / "nvidia_smi"
FIXTURES = {"dgx1_v100": (8, 4), "dgx_a100": (8, 10), "dgx_h100": (8, 12), "pcie_8gpu": (8, 2)}


def _node(t, col: str) -> str:
    if col.startswith("GPU"):
        return t.find(col)
    return t.find("NIC" + col.rsplit("_", 1)[-1].replace("NIC", ""))


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_round_trip(name: str) -> None:
    text = (FIX / f"{name}.txt").read_text()
    m = parse_smi_text(text)
    t = topology_from_smi(text)
    ngpu, nnic = FIXTURES[name]
    assert len(t.gpus()) == ngpu and len(t.nics()) == nnic
    for a, b in itertools.product(m.devices, m.devices):     # every printed class is reproduced
        assert t.path_class_smi(_node(t, a), _node(t, b)) == m.rel(a, b), (a, b)
    again = topology_from_smi(render_smi(t))                 # render -> parse is stable
    assert render_smi(again) == render_smi(t)


def test_link_counts_become_bandwidths() -> None:
    v = topology_from_smi((FIX / "dgx1_v100.txt").read_text())
    assert v.link(v.find("GPU0"), v.find("GPU3"))["bw_GBps"] == 50.0      # NV2 x 25 GB/s (NVLink2)
    assert v.link(v.find("GPU0"), v.find("GPU1"))["bw_GBps"] == 25.0      # NV1
    a = topology_from_smi((FIX / "dgx_a100.txt").read_text())
    assert a.bottleneck_GBps(a.find("GPU0"), a.find("GPU7")) == 300.0     # NV12 x 25
    h = topology_from_smi((FIX / "dgx_h100.txt").read_text())
    assert h.bottleneck_GBps(h.find("GPU0"), h.find("GPU7")) == 450.0     # NV18 x 25
    assert len(h.nodes(NodeKind.NVSWITCH)) == 1
    b = topology_from_smi((FIX / "dgx_h100.txt").read_text(), gpu_model="B200")
    assert b.bottleneck_GBps(b.find("GPU0"), b.find("GPU7")) == 900.0     # NVLink5 x 18
    p = topology_from_smi((FIX / "pcie_8gpu.txt").read_text())
    assert not [1 for *_, d in p.graph.edges(data=True) if d["type"] == LinkType.NVLINK]


def test_fixture_matches_the_dgx1_v100_preset() -> None:
    fx = topology_from_smi((FIX / "dgx1_v100.txt").read_text())
    pr = load_topology("dgx1-v100")
    devs = [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(4)]
    for a, b in itertools.product(devs, devs):
        assert fx.path_class_smi(fx.find(a), fx.find(b)) == pr.path_class_smi(pr.find(a), pr.find(b))


@pytest.mark.parametrize("text,needle", [
    ("hello world", "header"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV1\t0-3\n", "rows missing"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV1\t0-3\nGPU1\tNV2\t X \t0-3\n", "not symmetric"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tFAST\t0-3\nGPU1\tFAST\t X \t0-3\n", "not an nvidia-smi class"),
])
def test_bad_smi_text_is_typed(text: str, needle: str) -> None:
    with pytest.raises(TopologyError, match=needle):
        topology_from_smi(text)


def test_detect_without_gpus_succeeds(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    (root / "devices/system/node/node0").mkdir(parents=True)
    (root / "devices/system/node/node0/cpulist").write_text("0-7\n")
    (root / "devices/system/node/node1").mkdir(parents=True)
    (root / "devices/system/node/node1/cpulist").write_text("8-15\n")
    eth = root / "class/net/eth0"
    (eth / "device").mkdir(parents=True)
    (eth / "speed").write_text("100000\n")
    (eth / "device/numa_node").write_text("1\n")
    (eth / "device/current_link_speed").write_text("16.0 GT/s PCIe\n")
    (eth / "device/current_link_width").write_text("16\n")
    (root / "class/net/lo").mkdir(parents=True)
    for cpu, pkg in ((0, 0), (8, 1)):
        d = root / f"devices/system/cpu/cpu{cpu}/topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{pkg}\n")
    t = detect_topology(sys_root=str(root), use_nvidia_smi=False)
    assert t.gpus() == [] and "no GPUs" in t.meta["detected"]["note"]
    assert [t.graph.nodes[c]["cores"] for c in t.nodes(NodeKind.CPU)] == [8, 8]
    assert [t.graph.nodes[c]["socket"] for c in t.nodes(NodeKind.CPU)] == [0, 1] and t.meta["detected"]["sockets"] == 2
    nic = t.nics()[0]
    assert t.graph.nodes[nic]["speed_gbps"] == 100.0 and t.graph.nodes[nic]["numa"] == 1
    assert t.link(nic, t.find("CPU1"))["gen"] == 4


def test_detect_on_this_machine_and_from_text(tmp_path: Path) -> None:
    t = detect_topology()           # real sysfs; nvidia-smi may or may not exist here
    assert t.nodes(NodeKind.CPU) and "note" in t.meta["detected"]
    t2 = detect_topology((FIX / "dgx_h100.txt").read_text())
    assert len(t2.gpus()) == 8 and t2.meta["detected"]["nvidia_smi"] is True


def test_sockets_from_cpu_affinity_without_nic_columns() -> None:
    lines = []
    for ln in (FIX / "dgx1_v100.txt").read_text().splitlines():
        if ln.startswith("#") or ln.startswith("mlx5"):
            continue
        cols = ln.split("\t")
        lines.append("\t".join(cols[:9] + cols[13:]) if len(cols) > 12 else ln)
    t = topology_from_smi("\n".join(lines))
    cpus = t.nodes(NodeKind.CPU)
    assert len(cpus) == 2 and [t.graph.nodes[c]["cores"] for c in cpus] == [40, 40]
    assert t.path_class_smi(t.find("GPU0"), t.find("GPU5")) == "SYS"
    assert t.path_class_smi(t.find("GPU0"), t.find("GPU3")) == "NV2"


def test_direct_nvlink_mesh_versus_nvswitch() -> None:
    # 4 x H100 joined pairwise by 6 NVLinks (NVIDIA/nccl issue #1617): 18 links per GPU, no switch
    names = ["GPU0", "GPU1", "GPU2", "GPU3"]
    rows = ["\t" + "\t".join(names) + "\tCPU Affinity\tNUMA Affinity"]
    for i, a in enumerate(names):
        rows.append(a + "\t" + "\t".join(" X " if a == b else "NV6" for b in names) + f"\t{i}\t{i}")
    t = topology_from_smi("\n".join(rows))
    assert not t.nodes(NodeKind.NVSWITCH)
    assert t.link(t.find("GPU0"), t.find("GPU1"))["bw_GBps"] == 150.0          # 6 x 25 GB/s
    pair = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV12\t0-7\nGPU1\tNV12\t X \t0-7\n"   # NVLink bridge pair
    p = topology_from_smi(pair)
    assert p.link(p.find("GPU0"), p.find("GPU1"))["bw_GBps"] == 300.0
    dgx2 = "\t" + "\t".join(f"GPU{i}" for i in range(16)) + "\tCPU Affinity\n" + "\n".join(
        f"GPU{i}\t" + "\t".join(" X " if i == j else "NV6" for j in range(16)) + "\t0-3" for i in range(16))
    d = topology_from_smi(dgx2)
    assert len(d.nodes(NodeKind.NVSWITCH)) == 1 and d.bottleneck_GBps(d.find("GPU0"), d.find("GPU15")) == 150.0
