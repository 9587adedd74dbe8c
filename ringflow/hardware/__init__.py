"""The hardware catalog: link technologies and devices with their figures and bandwidth arithmetic.

Every bandwidth is stored per direction (GB/s = 1e9 B/s); bidirectional figures are derived. Every
figure cites its source next to it. The names below load on first use (the runtime needs one figure).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes

if TYPE_CHECKING:
    from .catalog import catalog_rows
    from .cpu_links import SOCKET_LINKS, SocketLink, socket_link
    from .gpus import GPU_MODELS, GpuModel, gpu_model
    from .latency import HOST_LOOPBACK_GBPS_DEFAULT, HOST_SHM_GBPS_DEFAULT, LATENCY_US
    from .network import NET_LINKS, NetLink, ib_for_gbps, net_link
    from .nvlink import (
        NVLINK_C2C_GBPS_PER_DIR,
        NVLINK_GENERATIONS,
        NVSWITCH_GENERATIONS,
        NvlinkGen,
        NvswitchGen,
        nvlink_gen,
    )
    from .pcie import LANE_WIDTHS, PCIE_GENERATIONS, PcieGen, pcie_arithmetic, pcie_GBps, pcie_gen
    from .systems import SYSTEMS, SystemSpec, system_spec

#: module (of this package) that defines each public name
_WHERE = {
    "catalog_rows": "catalog",
    **dict.fromkeys(("SOCKET_LINKS", "SocketLink", "socket_link"), "cpu_links"),
    **dict.fromkeys(("GPU_MODELS", "GpuModel", "gpu_model"), "gpus"),
    **dict.fromkeys(("HOST_LOOPBACK_GBPS_DEFAULT", "HOST_SHM_GBPS_DEFAULT", "LATENCY_US"), "latency"),
    **dict.fromkeys(("NET_LINKS", "NetLink", "ib_for_gbps", "net_link"), "network"),
    **dict.fromkeys(("NVLINK_C2C_GBPS_PER_DIR", "NVLINK_GENERATIONS", "NVSWITCH_GENERATIONS", "NvlinkGen",
                     "NvswitchGen", "nvlink_gen"), "nvlink"),
    **dict.fromkeys(("LANE_WIDTHS", "PCIE_GENERATIONS", "PcieGen", "pcie_arithmetic", "pcie_GBps", "pcie_gen"),
                    "pcie"),
    **dict.fromkeys(("SYSTEMS", "SystemSpec", "system_spec"), "systems"),
}

__all__ = [
    "catalog_rows", "SOCKET_LINKS", "SocketLink", "socket_link", "GPU_MODELS", "GpuModel", "gpu_model",
    "LATENCY_US", "HOST_SHM_GBPS_DEFAULT", "HOST_LOOPBACK_GBPS_DEFAULT", "NET_LINKS", "NetLink", "net_link",
    "ib_for_gbps", "NVLINK_C2C_GBPS_PER_DIR", "NVLINK_GENERATIONS", "NVSWITCH_GENERATIONS", "NvlinkGen",
    "NvswitchGen", "nvlink_gen", "LANE_WIDTHS", "PCIE_GENERATIONS", "PcieGen", "pcie_arithmetic", "pcie_gen",
    "pcie_GBps", "SYSTEMS", "SystemSpec", "system_spec",
]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, __all__)
