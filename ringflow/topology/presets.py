"""Preset machines: the registry of named servers and racks, and `build_preset`.

The vendor systems' figures (with their sources) live in ringflow.hardware.systems; the builders are in
presets_dgx (DGX-1, DGX-2, 8-GPU NVSwitch baseboards) and presets_rack (NVL72 racks). This module adds the
two generic machines (pcie-8gpu, host-cpu) and the registry.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import TopologyError
from ..hardware import HOST_LOOPBACK_GBPS_DEFAULT, HOST_SHM_GBPS_DEFAULT, LATENCY_US
from .graph import LinkType, NodeKind, Topology
from .presets_base import HostBuilder
from .presets_dgx import (
    DGX1P_NVLINKS,
    DGX1V_NVLINKS,
    build_a100_40gb,
    build_dgx1_p100,
    build_dgx1_v100,
    build_dgx2,
    build_dgx_a100,
    build_dgx_b200,
    build_dgx_h100,
    build_dgx_h200,
    build_h20,
    build_h800,
    build_hgx_b300,
)
from .presets_rack import build_gb200_nvl72, build_gb300_nvl72

__all__ = ["HostBuilder", "DGX1P_NVLINKS", "DGX1V_NVLINKS", "PRESETS", "Preset", "build_preset", "preset_names"]


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
    Preset("dgx-a100", build_dgx_a100, "DGX A100 640GB: 8 A100 80GB, 6 NVSwitches (NV12), 8 x 200G HDR, own x16 each"),
    Preset("a100-40gb", build_a100_40gb, "DGX A100 320GB: dgx-a100 wiring with A100 40GB (HBM2)"),
    Preset("dgx-h100", build_dgx_h100, "DGX H100: 8 H100, 4 NVSwitches (NV18, 450 GB/s/dir), 8 x 400G NDR"),
    Preset("dgx-h200", build_dgx_h200, "DGX H200: 8 H200 141GB, 4 NVSwitches (NV18), 8 x 400G NDR"),
    Preset("h800", build_h800, "HGX H800: 8 H800, NV8 (200 GB/s/dir through 4 NVSwitches), 8 x 400G"),
    Preset("h20", build_h20, "HGX H20: 8 H20 96GB, 4 NVSwitches (NV18), PCIe Gen5, 8 x 400G"),
    Preset("dgx-b200", build_dgx_b200, "DGX B200: 8 B200, 2 NVLink5 switches (NV18, 900 GB/s/dir), 8 x 400G"),
    Preset("hgx-b300", build_hgx_b300, "HGX B300: 8 B300 288GB, 2 NVLink5 switches, 8 x ConnectX-8 800G"),
    Preset("gb200-nvl72", build_gb200_nvl72, "GB200 NVL72: 18 trays x (2 Grace + 4 B200), one NVLink5 domain, 72x400G"),
    Preset("gb300-nvl72", build_gb300_nvl72, "GB300 NVL72: 18 trays x (2 Grace + 4 B300), one NVLink5 domain, 72x800G"),
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

