"""NVL72 racks: 18 compute trays of 2 Grace + 4 Blackwell GPUs in ONE NVLink domain (18 NVLink5 switch chips).

The rack is one host of the topology (one NVLink domain: every GPU pair 900 GB/s per direction); every node
carries `tray` (0..17), the physical compute tray. Each GPU reaches its Grace over NVLink-C2C and has one
scale-out NIC: GB200 trays hang the ConnectX-7 off the Grace's PCIe Gen5 x16 (the GPU reaches it over C2C);
GB300 trays put a ConnectX-8 SuperNIC per GPU whose integrated PCIe Gen6 switch joins the GPU (Gen6 x16)
and the Grace (Gen5 x16). Each tray's BlueField-3 (storage) is an attribute of its first Grace.
Figures and their sources: ringflow.hardware.systems ("gb200-nvl72", "gb300-nvl72").
"""
from __future__ import annotations

from ..hardware import LATENCY_US, NVLINK_C2C_GBPS_PER_DIR, system_spec
from .graph import LinkType, Topology
from .presets_base import HostBuilder


def build_nvl72(topo: Topology, host: int, spec: str) -> None:
    """An NVL72 rack of preset `spec` as host `host`: trays of 2 Grace + 4 GPUs, their NICs, the NVLink switches."""
    s = system_spec(spec)
    b = HostBuilder(topo, host)
    fabric = b.nvsw(0, s.nvswitch_gen or 4, s.nvswitch_chips)
    per_tray = s.sockets // s.trays
    for c in range(s.sockets):
        tray = c // per_tray
        cpu = b.cpu(c, s.cpu, s.cores_per_socket, tray=tray)
        if c % per_tray == 0:
            b.storage(cpu, s, count=s.storage_nics // s.trays)
        for g in (2 * c, 2 * c + 1):
            gid = b.gpu(g, s.gpu, c, str(c), tray=tray)
            b.nvlink(gid, fabric, s.nvlink_gen, s.nvlinks_per_gpu)
            topo.add_link(gid, cpu, LinkType.NVLINK, NVLINK_C2C_GBPS_PER_DIR, LATENCY_US["nvlink"], nlinks=1,
                          tier="nvlink", c2c=True)
            nic = b.nic(g, s.nic_gbps, c, model=s.nic_model, tray=tray)
            if s.pcie_gen >= 6:      # ConnectX-8: its PCIe switch joins GPU, NIC and Grace
                sw = b.pcisw(g, tray=tray, label=f"ConnectX-8 PCIe switch {g}")
                b.pcie(gid, sw, s.pcie_gen, 16)
                b.pcie(nic, sw, s.pcie_gen, 16)
                b.pcie(cpu, sw, 5, 16, root=g)
            else:
                b.pcie(nic, cpu, s.pcie_gen, 16, root=g)


def build_gb200_nvl72(topo: Topology, host: int = 0) -> None:
    """GB200 NVL72: 18 trays x (2 Grace + 4 B200), one NVLink5 domain of 72 GPUs, 72 x ConnectX-7 400G."""
    build_nvl72(topo, host, "gb200-nvl72")


def build_gb300_nvl72(topo: Topology, host: int = 0) -> None:
    """GB300 NVL72: 18 trays x (2 Grace + 4 B300), one NVLink5 domain, 72 x ConnectX-8 800G (one per GPU)."""
    build_nvl72(topo, host, "gb300-nvl72")
