"""Preset machines built from the hardware catalog (every bandwidth comes from ringflow.hardware).

NVSwitch modelling: the NVSwitch chips of one baseboard are ONE node (attrs `chips`, `generation`,
`ports_per_chip`) because NVLink traffic is striped over all planes; a GPU's edge to it carries all of
the GPU's NVLinks (nlinks = 12 on A100, 18 on H100), so any GPU pair gets the full per-GPU bandwidth
(450 GB/s per direction on H100), as the vendors state.

Presets: dgx1-p100, dgx1-v100, dgx2, dgx-a100, dgx-h100, gb200-nvl72, pcie-8gpu, host-cpu[:N].
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import TopologyError
from ..hardware import (
    HOST_LOOPBACK_GBPS_DEFAULT,
    HOST_SHM_GBPS_DEFAULT,
    LATENCY_US,
    NVLINK_C2C_GBPS_PER_DIR,
    NVSWITCH_GENERATIONS,
    nvlink_gen,
    pcie_GBps,
    socket_link,
)
from .graph import LinkType, NodeKind, Topology


class HostBuilder:
    """Adds the devices of one server (host index `host`) to a Topology, ids prefixed 'h<host>/'."""

    def __init__(self, topo: Topology, host: int) -> None:
        self.t = topo
        self.h = host

    def nid(self, short: str, i: int) -> str:
        """Node id for device `short`+`i` on this host."""
        return f"h{self.h}/{short}{i}"

    def gpu(self, i: int, model: str, numa: int, cpu_affinity: str = "", **kw: object) -> str:
        """Add GPU i (nvidia-smi numbering)."""
        return self.t.add_node(self.nid("gpu", i), NodeKind.GPU, self.h, i, model=model, numa=numa,
                               cpu_affinity=cpu_affinity, **kw)

    def cpu(self, i: int, model: str, cores: int, **kw: object) -> str:
        """Add CPU socket / NUMA node i."""
        return self.t.add_node(self.nid("cpu", i), NodeKind.CPU, self.h, i, model=model, numa=i, cores=cores, **kw)

    def pcisw(self, i: int, **kw: object) -> str:
        """Add PCIe switch i."""
        return self.t.add_node(self.nid("pcisw", i), NodeKind.PCIE_SWITCH, self.h, i, **kw)

    def nvsw(self, i: int, gen: int, chips: int) -> str:
        """Add the NVSwitch fabric node i: `chips` NVSwitch chips of generation `gen` acting as one."""
        g = NVSWITCH_GENERATIONS[gen]
        return self.t.add_node(self.nid("nvsw", i), NodeKind.NVSWITCH, self.h, i, generation=gen, chips=chips,
                               ports_per_chip=g.ports, label=f"NVSwitch gen{gen} x{chips}")

    def nic(self, i: int, speed_gbps: float, numa: int, fabric: str = "ib", rail: int | None = None) -> str:
        """Add NIC i (port speed in Gb/s); `rail` defaults to i."""
        return self.t.add_node(self.nid("nic", i), NodeKind.NIC, self.h, i, speed_gbps=float(speed_gbps),
                               numa=numa, fabric=fabric, rail=i if rail is None else rail,
                               name=f"mlx5_{i}" if fabric == "ib" else f"eth{i}")

    def pcie(self, a: str, b: str, gen: int, lanes: int = 16, root: int | None = None) -> None:
        """PCIe link, bandwidth computed from the generation and width."""
        extra: dict[str, Any] = {} if root is None else {"root": root}
        self.t.add_link(a, b, LinkType.PCIE, pcie_GBps(gen, lanes), LATENCY_US["pcie"], nlinks=1, tier="pcie",
                        gen=gen, lanes=lanes, **extra)

    def nvlink(self, a: str, b: str, gen: int, n: int) -> None:
        """n parallel NVLinks of generation `gen` merged into one edge per direction."""
        self.t.add_link(a, b, LinkType.NVLINK, n * nvlink_gen(gen).link_GBps, LATENCY_US["nvlink"], nlinks=n,
                        tier="nvlink", gen=gen)

    def socket(self, a: str, b: str, name: str, n: int) -> None:
        """n socket links (QPI/UPI/xGMI) between two CPUs."""
        self.t.add_link(a, b, LinkType.QPI, n * socket_link(name).link_GBps, LATENCY_US["qpi"], nlinks=n,
                        tier="qpi", tech=name)


# ---------------------------------------------------------------------------- DGX-1
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


def _dgx1(topo: Topology, host: int, model: str, nvl_gen: int, links: dict[tuple[int, int], int]) -> None:
    # DGX-1 (whitepaper): 2 x Xeon E5-2698 v4 (20 cores, 2 x QPI 9.6 GT/s), 4 PLX PCIe Gen3 switches, each with
    # 2 GPUs and 1 EDR InfiniBand NIC (4 x 100 Gb/s); CPU affinity as nvidia-smi prints it.
    b = HostBuilder(topo, host)
    cpus = [b.cpu(s, "Xeon E5-2698 v4", 20) for s in range(2)]
    b.socket(cpus[0], cpus[1], "QPI-9.6", 2)
    aff = ["0-19,40-59", "20-39,60-79"]
    for k in range(4):
        sw = b.pcisw(k)
        b.pcie(cpus[k // 2], sw, 3, 16, root=0)
        for g in (2 * k, 2 * k + 1):
            b.pcie(b.gpu(g, model, k // 2, aff[k // 2]), sw, 3, 16)
        b.pcie(b.nic(k, 100, k // 2), sw, 3, 16)
    for (x, y), n in links.items():
        b.nvlink(b.nid("gpu", x), b.nid("gpu", y), nvl_gen, n)


def build_dgx1_p100(topo: Topology, host: int = 0) -> None:
    """DGX-1 with 8 P100: hybrid cube-mesh of single NVLink1 links (20 GB/s per direction)."""
    _dgx1(topo, host, "P100", 1, DGX1P_NVLINKS)


def build_dgx1_v100(topo: Topology, host: int = 0) -> None:
    """DGX-1 with 8 V100: the hybrid cube-mesh as nvidia-smi shows it (NV1/NV2, at most 2 links per pair)."""
    _dgx1(topo, host, "V100", 2, DGX1V_NVLINKS)


# ---------------------------------------------------------------------------- DGX-2
def build_dgx2(topo: Topology, host: int = 0) -> None:
    """DGX-2: 16 V100 on two baseboards of 6 NVSwitches; every GPU pair NV6 (150 GB/s per direction)."""
    # NVIDIA DGX-2 datasheet / NVSwitch technical overview: 6 NVSwitches per baseboard, each GPU one NVLink2 to
    # each of them; 8 links between paired switches of the two baseboards (48 x 25 = 1,200 GB/s per direction,
    # "2.4 TB/s bisection"); 2 x Xeon Platinum 8168 (24 cores, 3 UPI 10.4 GT/s); 8 x 100 Gb/s EDR NICs;
    # PCIe Gen3 tree as nvidia-smi shows it (GPU pair + NIC PIX, neighbour pair PXB, other complex NODE).
    b = HostBuilder(topo, host)
    cpus = [b.cpu(s, "Xeon Platinum 8168", 24) for s in range(2)]
    b.socket(cpus[0], cpus[1], "UPI-10.4", 3)
    boards = [b.nvsw(i, 1, 6) for i in range(2)]
    b.nvlink(boards[0], boards[1], 2, 48)
    aff = ["0-23,48-71", "24-47,72-95"]
    leaf = 0
    for up in range(4):
        sock = up // 2
        top = b.pcisw(100 + up)
        b.pcie(cpus[sock], top, 3, 16, root=up)
        for _ in range(2):
            sw = b.pcisw(leaf)
            b.pcie(top, sw, 3, 16)
            for g in (2 * leaf, 2 * leaf + 1):
                gid = b.gpu(g, "V100", sock, aff[sock])
                b.pcie(gid, sw, 3, 16)
                b.nvlink(gid, boards[g // 8], 2, 6)
            b.pcie(b.nic(leaf, 100, sock), sw, 3, 16)
            leaf += 1


# ---------------------------------------------------------------------------- DGX A100 / H100
def _dgx_nvswitch(topo: Topology, host: int, *, model: str, nvl_gen: int, nvsw_gen: int, chips: int,
                  links: int, cpu_model: str, cores: int, socket: str, nsock_links: int, pcie_gen: int,
                  nic_gbps: float, two_level: bool) -> None:
    b = HostBuilder(topo, host)
    cpus = [b.cpu(s, cpu_model, cores) for s in range(2)]
    b.socket(cpus[0], cpus[1], socket, nsock_links)
    fabric = b.nvsw(0, nvsw_gen, chips)
    aff = [f"0-{cores - 1},{2 * cores}-{3 * cores - 1}", f"{cores}-{2 * cores - 1},{3 * cores}-{4 * cores - 1}"]
    for k in range(4):
        sock = k // 2
        top = b.pcisw(k)
        b.pcie(cpus[sock], top, pcie_gen, 16, root=k)
        gpu_parents = [top, top]
        nic_parent = top
        if two_level:   # DGX A100: GPU and NIC under different leaf switches of one complex (nvidia-smi: PXB)
            gpu_parents = [b.pcisw(10 + 3 * k), b.pcisw(11 + 3 * k)]
            nic_parent = b.pcisw(12 + 3 * k)
            for s in gpu_parents + [nic_parent]:
                b.pcie(top, s, pcie_gen, 16)
        for j, g in enumerate((2 * k, 2 * k + 1)):
            gid = b.gpu(g, model, sock, aff[sock])
            b.pcie(gid, gpu_parents[j], pcie_gen, 16)
            b.nvlink(gid, fabric, nvl_gen, links)
        for n in (2 * k, 2 * k + 1):
            b.pcie(b.nic(n, nic_gbps, sock), nic_parent, pcie_gen, 16)


def build_dgx_a100(topo: Topology, host: int = 0) -> None:
    """DGX A100: 8 A100, 6 NVSwitch gen2 (NV12, 300 GB/s per direction per GPU), 8 x 200G HDR NICs."""
    # NVIDIA DGX A100 user guide / datasheet: 2 x AMD EPYC 7742 (64 cores), 4 xGMI-2 links assumed between sockets,
    # 4 PCIe Gen4 switch complexes of 2 GPUs + 2 ConnectX-6 HDR 200 Gb/s; nvidia-smi: GPU-NIC PXB, other complex
    # on the same socket NODE, other socket SYS (NCCL issues #707, #1505 show this pattern).
    _dgx_nvswitch(topo, host, model="A100", nvl_gen=3, nvsw_gen=2, chips=6, links=12, cpu_model="EPYC 7742",
                  cores=64, socket="xGMI-2", nsock_links=4, pcie_gen=4, nic_gbps=200, two_level=True)


def build_dgx_h100(topo: Topology, host: int = 0) -> None:
    """DGX H100: 8 H100, 4 NVSwitch gen3 (NV18, 450 GB/s per direction between any two GPUs), 8 x 400G NICs."""
    # NVIDIA DGX H100 user guide / datasheet: 2 x Xeon Platinum 8480C (56 cores, 4 UPI 16 GT/s), 8 ConnectX-7
    # 400 Gb/s NDR; each PCIe Gen5 switch holds 2 GPUs and their 2 NICs (GPU i <-> NIC i, rail i).
    _dgx_nvswitch(topo, host, model="H100", nvl_gen=4, nvsw_gen=3, chips=4, links=18, cpu_model="Xeon Platinum 8480C",
                  cores=56, socket="UPI-16", nsock_links=4, pcie_gen=5, nic_gbps=400, two_level=False)
    # DGX H100 whitepaper: the 4 NVSwitches expose 72 NVLink4 ports (72 x 50 GB/s = 3.6 TB/s both
    # directions) to the external NVLink Switch of a SuperPOD; kept as attributes (no NVLink network modelled).
    fabric = topo.graph.nodes[f"h{host}/nvsw0"]
    fabric["external_nvlink_ports"] = 72
    fabric["external_GBps"] = 72 * nvlink_gen(4).link_GBps


# ---------------------------------------------------------------------------- GB200 NVL72
def build_gb200_nvl72(topo: Topology, host: int = 0) -> None:
    """GB200 NVL72: 72 Blackwell GPUs in ONE NVLink domain (18 NVLink5 switch chips), 900 GB/s per direction."""
    # NVIDIA GB200 NVL72 datasheet: 18 compute trays x (2 Grace + 4 B200), 9 switch trays x 2 NVLink switch chips,
    # 1.8 TB/s NVLink per GPU, NVLink-C2C 900 GB/s Grace<->GPU, 72 x ConnectX-7 400 Gb/s (one per GPU).
    # Modelled as one host (one NVLink domain); `tray` tells the physical compute tray. The NIC hangs off the
    # Grace of its GPU (PCIe Gen5 x16) — a simplification of the tray's PCIe layout.
    b = HostBuilder(topo, host)
    fabric = b.nvsw(0, 4, 18)
    for c in range(36):
        cpu = b.cpu(c, "Grace", 72, tray=c // 2)
        for g in (2 * c, 2 * c + 1):
            gid = b.gpu(g, "GB200", c, str(c), tray=g // 4)
            b.nvlink(gid, fabric, 5, 18)
            topo.add_link(gid, cpu, LinkType.NVLINK, NVLINK_C2C_GBPS_PER_DIR, LATENCY_US["nvlink"], nlinks=1,
                          tier="nvlink", c2c=True)
            b.pcie(b.nic(g, 400, c), cpu, 5, 16, root=g)


# ---------------------------------------------------------------------------- PCIe-only
def build_pcie_8gpu(topo: Topology, host: int = 0) -> None:
    """8 PCIe GPUs, no NVLink: 2 CPUs over QPI, 2 PCIe Gen3 switches per CPU, 2 GPUs per switch."""
    # A common 4U 8-GPU server layout ("8 GPUs under two CPUs", "4 GPUs under one PCIe switch" trees;
    # measured 10.59 GB/s same switch, 9.15 GB/s across QPI). 2 x Xeon E5-2698 v4 (2 x QPI 9.6 GT/s); one
    # 100 Gb/s EDR NIC on the first switch of each CPU.
    b = HostBuilder(topo, host)
    cpus = [b.cpu(s, "Xeon E5-2698 v4", 20) for s in range(2)]
    b.socket(cpus[0], cpus[1], "QPI-9.6", 2)
    aff = ["0-19,40-59", "20-39,60-79"]
    for k in range(4):
        sock = k // 2
        sw = b.pcisw(k)
        b.pcie(cpus[sock], sw, 3, 16, root=0)
        for g in (2 * k, 2 * k + 1):
            b.pcie(b.gpu(g, "V100-PCIe", sock, aff[sock]), sw, 3, 16)
        if k % 2 == 0:
            b.pcie(b.nic(sock, 100, sock), sw, 3, 16)


# ---------------------------------------------------------------------------- host-cpu
def build_host_cpu(topo: Topology, host: int = 0, nprocs: int = 4, shm_GBps: float = HOST_SHM_GBPS_DEFAULT,
                   loopback_GBps: float = HOST_LOOPBACK_GBPS_DEFAULT, shm_latency_us: float = LATENCY_US["shm"],
                   loopback_latency_us: float = LATENCY_US["loopback"], nic_gbps: float = 25.0) -> None:
    """One GPU-less host: `nprocs` PROC endpoints joined by SHM through a memory hub and by LOOPBACK pairwise.

    Default figures are UNCALIBRATED (hardware.latency); measured figures can be written
    into the edges (plain attributes) and saved with the topology (`ringflow calibrate` measures this machine).
    """
    b = HostBuilder(topo, host)
    hub = topo.add_node(b.nid("mem", 0), NodeKind.CPU, host, 0, model="host memory", numa=0, cores=nprocs,
                        label="shared memory hub")
    procs = [topo.add_node(b.nid("proc", i), NodeKind.PROC, host, i, numa=0) for i in range(nprocs)]
    for p in procs:
        topo.add_link(p, hub, LinkType.SHM, shm_GBps, shm_latency_us / 2, tier="shm")
    for i, p in enumerate(procs):
        for q in procs[i + 1:]:
            topo.add_link(p, q, LinkType.LOOPBACK, loopback_GBps, loopback_latency_us, tier="loopback")
    nic = topo.add_node(b.nid("nic", 0), NodeKind.NIC, host, 0, speed_gbps=float(nic_gbps), numa=0,
                        fabric="ethernet", rail=0, name="eth0")
    b.pcie(nic, hub, 3, 16, root=0)


@dataclass(frozen=True)
class Preset:
    """A named machine: its builder and a one-line description."""

    name: str
    build: Callable[..., None]
    description: str


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("dgx1-p100", build_dgx1_p100, "DGX-1 P100: 8 GPUs, hybrid cube-mesh NVLink1 (NV1), 4 PCIe switches, 2 CPUs"),
    Preset("dgx1-v100", build_dgx1_v100, "DGX-1 V100: 8 GPUs, hybrid cube-mesh NVLink2 (NV1/NV2), 4 EDR NICs"),
    Preset("dgx2", build_dgx2, "DGX-2: 16 V100, 12 NVSwitches on 2 baseboards, uniform NV6"),
    Preset("dgx-a100", build_dgx_a100, "DGX A100: 8 A100, 6 NVSwitches (NV12), 8 x 200G HDR"),
    Preset("dgx-h100", build_dgx_h100, "DGX H100: 8 H100, 4 NVSwitches (NV18, 450 GB/s/dir), 8 x 400G NDR"),
    Preset("gb200-nvl72", build_gb200_nvl72, "GB200 NVL72: 72 GPUs in one NVLink5 domain, 72 x 400G"),
    Preset("pcie-8gpu", build_pcie_8gpu, "8 PCIe GPUs, 2 CPUs, 2 PCIe switches per CPU, no NVLink"),
    Preset("host-cpu", build_host_cpu, "GPU-less host: N PROC ranks over SHM/loopback (uncalibrated: host-cpu:N)"),
]}


def preset_names() -> list[str]:
    """All preset names."""
    return list(PRESETS)


def build_preset(spec: str, host: int = 0, topo: Topology | None = None) -> Topology:
    """Build preset `spec` ('dgx-h100', 'host-cpu:8') as host `host` (into `topo` when given)."""
    name, _, arg = spec.partition(":")
    if name not in PRESETS:
        raise TopologyError(f"unknown topology preset {name!r}",
                            f"use one of {', '.join(PRESETS)}, a .yaml/.json file, or 'detect'")
    out = topo if topo is not None else Topology(name, meta={"preset": name})
    kwargs = {}
    if arg:
        if name != "host-cpu" or not arg.isdigit() or int(arg) < 1:
            raise TopologyError(f"bad preset argument in {spec!r}", "only host-cpu takes one: host-cpu:<nprocs >= 1>")
        kwargs["nprocs"] = int(arg)
    PRESETS[name].build(out, host, **kwargs)
    if name == "host-cpu" and topo is None:
        out.meta.setdefault("calibrated", False)
    return out

