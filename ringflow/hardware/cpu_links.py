"""CPU socket-to-socket links (QPI, UPI, AMD xGMI) and host memory/loopback defaults.

QPI/UPI move 2 bytes per transfer per direction per link (Intel Xeon datasheets), so per-direction
GB/s = GT/s x 2. The 25.6 GB/s often quoted for the DGX-1's QPI is a 6.4 GT/s link counted in
both directions (6.4 x 2 B x 2 directions). The DGX-1's Xeon E5-2698 v4 actually has two 9.6 GT/s
QPI links (Intel ARK), i.e. 2 x 19.2 = 38.4 GB/s per direction; presets use the vendor figure.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SocketLink:
    """One CPU interconnect link type."""

    name: str
    rate_GTps: float
    link_GBps: float             # per link, per direction
    source: str

    @property
    def bidir_GBps(self) -> float:
        """Both directions."""
        return 2 * self.link_GBps


SOCKET_LINKS: dict[str, SocketLink] = {s.name: s for s in [
    SocketLink("QPI-6.4", 6.4, 6.4 * 2, "Intel QPI 1.0 (Xeon 5500); 25.6 GB/s = both directions"),
    SocketLink("QPI-8.0", 8.0, 8.0 * 2, "Intel Xeon E5-2600 v1/v2 datasheet (QPI 1.1, 8 GT/s)"),
    SocketLink("QPI-9.6", 9.6, 9.6 * 2, "Intel Xeon E5-2698 v4 (DGX-1) ARK: 2 x QPI 9.6 GT/s"),
    SocketLink("UPI-10.4", 10.4, 10.4 * 2, "Intel Xeon Scalable (Skylake/Cascade Lake) datasheet: UPI 10.4 GT/s"),
    SocketLink("UPI-16", 16.0, 16.0 * 2, "Intel Xeon 4th gen (Sapphire Rapids, DGX H100) datasheet: UPI 2.0 16 GT/s"),
    SocketLink("UPI-20", 20.0, 20.0 * 2,
               "Intel ARK, Xeon Platinum 8570 (5th gen Xeon, DGX B200): 4 UPI 2.0 links at 20 GT/s, https://ark.intel.com"),
    SocketLink("UPI-24", 24.0, 24.0 * 2,
               "Intel ARK, Xeon 6776P (Xeon 6, DGX B300): UPI 2.0 links at 24 GT/s, https://ark.intel.com"),
    # AMD EPYC 7002 (DGX A100): 4 xGMI-2 links between sockets at 16 GT/s x16 = 32 GB/s per link per direction
    # (AMD EPYC 7002 architecture overview, "Rome" xGMI-2).
    SocketLink("xGMI-2", 16.0, 32.0, "AMD EPYC 7002 (Rome) architecture overview: xGMI-2 16 GT/s x16"),
]}


def socket_link(name: str) -> SocketLink:
    """A socket link by name (see SOCKET_LINKS)."""
    from ..errors import InvalidArgument
    if name not in SOCKET_LINKS:
        raise InvalidArgument(f"socket link {name!r} is not known", f"use one of {', '.join(SOCKET_LINKS)}")
    return SOCKET_LINKS[name]
