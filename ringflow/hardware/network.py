"""Scale-out network link speeds: InfiniBand generations and Ethernet/RoCE.

Speeds are data rates of a 4x port (IB) or a port (Ethernet) per direction in Gb/s; GB/s = Gb/s / 8.
Sources: InfiniBand Trade Association roadmap (EDR/HDR/NDR/XDR), NVIDIA ConnectX-5/6/7/8 and
Quantum/Quantum-2/Quantum-X800 datasheets, IEEE 802.3by/cd/bs/ck/df (25-800 GbE).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from ..units import gbps_to_GBps


@dataclass(frozen=True)
class NetLink:
    """One network port speed."""

    name: str
    family: str                  # "ib" or "ethernet"
    gbps: float                  # data rate per direction
    lanes: int
    source: str

    @property
    def GBps(self) -> float:
        """Per direction, GB/s."""
        return gbps_to_GBps(self.gbps)

    @property
    def bidir_GBps(self) -> float:
        """Both directions, GB/s."""
        return 2 * self.GBps


NET_LINKS: dict[str, NetLink] = {n.name: n for n in [
    NetLink("IB-EDR", "ib", 100.0, 4, "IBTA roadmap; NVIDIA ConnectX-5 datasheet (EDR 100 Gb/s, 4x25G)"),
    NetLink("IB-HDR", "ib", 200.0, 4, "IBTA roadmap; NVIDIA ConnectX-6 / Quantum datasheets (HDR 200 Gb/s, 4x50G)"),
    NetLink("IB-NDR", "ib", 400.0, 4, "IBTA roadmap; NVIDIA ConnectX-7 / Quantum-2 datasheets (NDR 400 Gb/s, 4x100G)"),
    NetLink("IB-XDR", "ib", 800.0, 4,
            "IBTA roadmap; NVIDIA ConnectX-8 / Quantum-X800 datasheets (XDR 800 Gb/s, 4x200G)"),
    NetLink("25GbE", "ethernet", 25.0, 1, "IEEE 802.3by (25GBASE-R); RoCE v2 over it"),
    NetLink("50GbE", "ethernet", 50.0, 1, "IEEE 802.3cd (50GBASE-R, PAM4)"),
    NetLink("100GbE", "ethernet", 100.0, 4, "IEEE 802.3bj/cd (100GBASE-R4)"),
    NetLink("200GbE", "ethernet", 200.0, 4, "IEEE 802.3bs/cd (200GBASE-R4)"),
    NetLink("400GbE", "ethernet", 400.0, 8, "IEEE 802.3bs/ck (400GBASE-R8/R4); ConnectX-7, Spectrum-4"),
    NetLink("800GbE", "ethernet", 800.0, 8, "IEEE 802.3df (800GBASE-R8); ConnectX-8, Spectrum-X800"),
]}


def net_link(name: str) -> NetLink:
    """A network port speed by name (see NET_LINKS)."""
    if name not in NET_LINKS:
        raise InvalidArgument(f"network link {name!r} is not known", f"use one of {', '.join(NET_LINKS)}")
    return NET_LINKS[name]


def ib_for_gbps(gbps: float) -> NetLink:
    """The InfiniBand generation with this port speed (100/200/400/800 Gb/s)."""
    for n in NET_LINKS.values():
        if n.family == "ib" and n.gbps == gbps:
            return n
    raise InvalidArgument(f"no InfiniBand generation runs at {gbps:g} Gb/s",
                          "use 100 (EDR), 200 (HDR), 400 (NDR) or 800 (XDR)")
