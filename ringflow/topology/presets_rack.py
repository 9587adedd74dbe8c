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


def nvl_partition(rack: Topology, gpus: int) -> Topology:
    """An NVLink partition of one NVL72 rack: the trays of its first `gpus` GPUs, the rest of the rack removed.

    The NVLink fabric manager can cut an NVL72 rack into NVLink partitions; GPUs of one partition keep all their
    NVLinks to every switch chip (full NVLink rate among themselves) and reach other partitions only through
    their trays' scale-out NICs (NVIDIA, NVLink partitioning in the Fabric Manager user guide,
    https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/). `build_cluster(partition, n)` joins n
    such partitions by the NICs' fabric, e.g. the three NVL8 partitions of https://github.com/NVIDIA/nccl/issues/1801.
    """
    from ..errors import TopologyError
    g = rack.graph
    hosts = rack.hosts()
    trays = {int(d["tray"]) for _, d in g.nodes(data=True) if d.get("tray") is not None}
    per_tray = {t: sum(1 for x in rack.gpus() if g.nodes[x].get("tray") == t) for t in trays}
    if len(hosts) != 1 or not trays:
        raise TopologyError(f"topology {rack.name!r} is not one NVL72 rack with compute trays",
                            "partition a one-rack preset such as gb200-nvl72 or gb300-nvl72")
    tray_gpus = per_tray[min(trays)]
    if not isinstance(gpus, int) or gpus < tray_gpus or gpus % tray_gpus or gpus > len(rack.gpus()):
        raise TopologyError(f"NVLink partition of {gpus!r} GPUs on {rack.name!r}",
                            f"give a multiple of the tray's {tray_gpus} GPUs up to {len(rack.gpus())}")
    keep = set(sorted(trays)[:gpus // tray_gpus])
    part = rack.copy()
    part.graph.remove_nodes_from([n for n, d in g.nodes(data=True)
                                  if d.get("tray") is not None and int(d["tray"]) not in keep])
    part.name = f"{rack.name}-nvl{gpus}"
    part.meta = {**(part.meta or {}), "nvl_partition": {"rack": rack.name, "gpus": gpus, "trays": sorted(keep)}}
    part.invalidate()
    return part
