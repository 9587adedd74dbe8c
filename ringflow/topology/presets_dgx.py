"""8- and 16-GPU servers: DGX-1 (cube-mesh), DGX-2, and the 8-GPU NVSwitch baseboards (A100 ... B300).

Figures (GPU model, links, NVSwitch chips, CPUs, NICs) come from ringflow.hardware.systems, where each
one cites its vendor document; this module only lays them out as PCIe / NVLink graphs.

NVSwitch modelling: the NVSwitch chips of one baseboard are ONE node (attrs `chips`, `generation`,
`ports_per_chip`) because NVLink traffic is striped over all planes; a GPU's edge to it carries all of
the GPU's NVLinks (nlinks = 12 on A100, 18 on H100, 8 on H800), so any GPU pair gets the full per-GPU
bandwidth (450 GB/s per direction on H100), as the vendors state.
"""
from __future__ import annotations

from ..hardware import SystemSpec, nvlink_gen, system_spec
from .graph import Topology
from .presets_base import HostBuilder

# DGX-1 V100 NVLink counts exactly as `nvidia-smi topo -m` prints them on a DGX-1V (also NCCL issue #671's
# topology dump: GPU0 -> GPU1 x1, GPU2 x1, GPU3 x2, GPU4 x2; GPU1 -> GPU2 x2, GPU3 x1, GPU5 x2; ...).
DGX1V_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}
# DGX-1 P100 hybrid cube-mesh (NVIDIA DGX-1 system architecture whitepaper, 2017): two fully connected
# quads (0-3, 4-7) plus the links i <-> i+4; 4 single NVLinks per P100.
DGX1P_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 1, (1, 2): 1, (1, 3): 1, (2, 3): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 1, (5, 6): 1, (5, 7): 1, (6, 7): 1,
    (0, 4): 1, (1, 5): 1, (2, 6): 1, (3, 7): 1,
}


def _affinity(cores: int) -> list[str]:
    """nvidia-smi CPU affinity strings of the two sockets (SMT siblings numbered after all cores)."""
    return [f"0-{cores - 1},{2 * cores}-{3 * cores - 1}", f"{cores}-{2 * cores - 1},{3 * cores}-{4 * cores - 1}"]


def _cpus(b: HostBuilder, s: SystemSpec) -> list[str]:
    cpus = [b.cpu(i, s.cpu, s.cores_per_socket) for i in range(s.sockets)]
    if s.socket_link:
        b.socket(cpus[0], cpus[1], s.socket_link, s.socket_links)
    b.storage(cpus[0], s)
    return cpus


# ---------------------------------------------------------------------------- DGX-1
def _dgx1(topo: Topology, host: int, s: SystemSpec, links: dict[tuple[int, int], int]) -> None:
    # 4 PLX PCIe Gen3 switches, each with 2 GPUs and 1 EDR InfiniBand NIC; CPU affinity as nvidia-smi prints it.
    b = HostBuilder(topo, host)
    cpus = _cpus(b, s)
    aff = _affinity(s.cores_per_socket)
    for k in range(4):
        sw = b.pcisw(k)
        b.pcie(cpus[k // 2], sw, s.pcie_gen, 16, root=0)
        for g in (2 * k, 2 * k + 1):
            b.pcie(b.gpu(g, s.gpu, k // 2, aff[k // 2]), sw, s.pcie_gen, 16)
        b.pcie(b.nic(k, s.nic_gbps, k // 2, model=s.nic_model), sw, s.pcie_gen, 16)
    for (x, y), n in links.items():
        b.nvlink(b.nid("gpu", x), b.nid("gpu", y), s.nvlink_gen, n)


def build_dgx1_p100(topo: Topology, host: int = 0) -> None:
    """DGX-1 with 8 P100: hybrid cube-mesh of single NVLink1 links (20 GB/s per direction)."""
    _dgx1(topo, host, system_spec("dgx1-p100"), DGX1P_NVLINKS)


def build_dgx1_v100(topo: Topology, host: int = 0) -> None:
    """DGX-1 with 8 V100: the hybrid cube-mesh as nvidia-smi shows it (NV1/NV2, at most 2 links per pair)."""
    _dgx1(topo, host, system_spec("dgx1-v100"), DGX1V_NVLINKS)


# ---------------------------------------------------------------------------- DGX-2
def build_dgx2(topo: Topology, host: int = 0) -> None:
    """DGX-2: 16 V100 on two baseboards of 6 NVSwitches; every GPU pair NV6 (150 GB/s per direction)."""
    # NVSwitch technical overview: each GPU one NVLink2 to each of its baseboard's 6 NVSwitches; 8 links between
    # paired switches of the two baseboards (48 x 25 = 1,200 GB/s per direction, "2.4 TB/s bisection"); PCIe Gen3
    # tree as nvidia-smi shows it (GPU pair + NIC PIX, neighbour pair PXB, other complex NODE).
    s = system_spec("dgx2")
    b = HostBuilder(topo, host)
    cpus = _cpus(b, s)
    boards = [b.nvsw(i, s.nvswitch_gen or 1, s.nvswitch_chips // 2) for i in range(2)]
    b.nvlink(boards[0], boards[1], s.nvlink_gen, 48)
    aff = _affinity(s.cores_per_socket)
    leaf = 0
    for up in range(4):
        sock = up // 2
        top = b.pcisw(100 + up)
        b.pcie(cpus[sock], top, s.pcie_gen, 16, root=up)
        for _ in range(2):
            sw = b.pcisw(leaf)
            b.pcie(top, sw, s.pcie_gen, 16)
            for g in (2 * leaf, 2 * leaf + 1):
                gid = b.gpu(g, s.gpu, sock, aff[sock])
                b.pcie(gid, sw, s.pcie_gen, 16)
                b.nvlink(gid, boards[g // 8], s.nvlink_gen, s.nvlinks_per_gpu)
            b.pcie(b.nic(leaf, s.nic_gbps, sock, model=s.nic_model), sw, s.pcie_gen, 16)
            leaf += 1


# ---------------------------------------------------------------------------- 8-GPU NVSwitch baseboards
def build_hgx8(topo: Topology, host: int, spec: str, layout: str) -> None:
    """8 GPUs on one NVSwitch baseboard, 8 compute NICs, 2 sockets; `layout` is the PCIe tree:

    - "complex" (DGX A100): 4 PCIe Gen4 switch complexes, 2 per socket; every GPU and every compute NIC has
      its own x16 port into its complex (nvidia-smi: GPU-NIC PXB), so all 8 NICs run at line rate at once;
    - "pix" (DGX H100/H200/B200, HGX H800/H20): 4 PCIe switches, each with 2 GPUs and 2 NICs on x16 ports
      (GPU i <-> NIC i, rail i, PIX);
    - "cx8" (HGX B300): each ConnectX-8 SuperNIC's integrated PCIe Gen6 switch joins one GPU (Gen6 x16) and the
      NIC, with a Gen5 x16 uplink to the host CPU.
    """
    s = system_spec(spec)
    b = HostBuilder(topo, host)
    cpus = _cpus(b, s)
    fabric = b.nvsw(0, s.nvswitch_gen or 1, s.nvswitch_chips)
    aff = _affinity(s.cores_per_socket)
    gen = s.pcie_gen
    gpus = []
    for g in range(8):
        gid = b.gpu(g, s.gpu, g // 4, aff[g // 4])
        b.nvlink(gid, fabric, s.nvlink_gen, s.nvlinks_per_gpu)
        gpus.append(gid)
    nics = [b.nic(n, s.nic_gbps, n // 4, model=s.nic_model) for n in range(8)]
    if layout == "cx8":
        for g in range(8):
            sw = b.pcisw(g, label=f"ConnectX-8 PCIe switch {g}")
            b.pcie(cpus[g // 4], sw, 5, 16, root=g)
            b.pcie(gpus[g], sw, gen, 16)
            b.pcie(nics[g], sw, gen, 16)
        return
    for k in range(4):
        top = b.pcisw(k)
        b.pcie(cpus[k // 2], top, gen, 16, root=k)
        for j in (2 * k, 2 * k + 1):
            if layout == "complex":   # own x16 port per device: GPU and NIC each behind their own bridge
                for dev, idx in ((gpus[j], 10 + 4 * k + j % 2), (nics[j], 12 + 4 * k + j % 2)):
                    br = b.pcisw(idx)
                    b.pcie(top, br, gen, 16)
                    b.pcie(dev, br, gen, 16)
            else:
                b.pcie(gpus[j], top, gen, 16)
                b.pcie(nics[j], top, gen, 16)


def build_dgx_a100(topo: Topology, host: int = 0) -> None:
    """DGX A100 640GB: 8 A100 80GB, 6 NVSwitch gen2 (NV12, 300 GB/s per direction per GPU), 8 x 200G HDR."""
    build_hgx8(topo, host, "dgx-a100", "complex")


def build_a100_40gb(topo: Topology, host: int = 0) -> None:
    """DGX A100 320GB: the dgx-a100 wiring with A100 40GB (HBM2) and one storage NIC."""
    build_hgx8(topo, host, "a100-40gb", "complex")


def _external_nvlink(topo: Topology, host: int) -> None:
    # DGX H100 whitepaper: the 4 NVSwitches expose 72 NVLink4 ports (72 x 50 GB/s = 3.6 TB/s both
    # directions) to the external NVLink Switch of a SuperPOD; kept as attributes (no NVLink network modelled).
    fabric = topo.graph.nodes[f"h{host}/nvsw0"]
    fabric["external_nvlink_ports"] = 72
    fabric["external_GBps"] = 72 * nvlink_gen(4).link_GBps


def build_dgx_h100(topo: Topology, host: int = 0) -> None:
    """DGX H100: 8 H100, 4 NVSwitch gen3 (NV18, 450 GB/s per direction between any two GPUs), 8 x 400G NICs."""
    build_hgx8(topo, host, "dgx-h100", "pix")
    _external_nvlink(topo, host)


def build_dgx_h200(topo: Topology, host: int = 0) -> None:
    """DGX H200: the DGX H100 system with H200 (141 GB HBM3e) GPUs."""
    build_hgx8(topo, host, "dgx-h200", "pix")
    _external_nvlink(topo, host)


def build_h800(topo: Topology, host: int = 0) -> None:
    """HGX H800: 8 H800 on 8 NVLink4 links each (200 GB/s per direction), 8 x 400G ConnectX-7."""
    build_hgx8(topo, host, "h800", "pix")


def build_h20(topo: Topology, host: int = 0) -> None:
    """HGX H20: 8 H20 (NV18, 450 GB/s per direction), PCIe Gen5, 8 x 400G NICs."""
    build_hgx8(topo, host, "h20", "pix")


def build_dgx_b200(topo: Topology, host: int = 0) -> None:
    """DGX B200: 8 B200, 2 NVLink5 switch chips (NV18, 900 GB/s per direction), 8 x 400G ConnectX-7."""
    build_hgx8(topo, host, "dgx-b200", "pix")


def build_hgx_b300(topo: Topology, host: int = 0) -> None:
    """HGX B300: 8 B300, 2 NVLink5 switch chips, one ConnectX-8 800G per GPU on its PCIe Gen6 switch."""
    build_hgx8(topo, host, "hgx-b300", "cx8")
