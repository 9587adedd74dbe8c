"""PCIe generations and the throughput arithmetic (computed, never typed in).

throughput per lane and direction = transfer rate (GT/s) x encoding efficiency / 8 bits per byte.
Sources: PCI-SIG base specifications 1.0a-6.0 (rates and encodings). Worked examples the tests check:
Gen2 x1 = 500 MB/s, Gen2 x8 = 4 GB/s, Gen3 x1 = 984.6 MB/s, Gen3 x16 = 15.754 GB/s.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..errors import InvalidArgument

LANE_WIDTHS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class PcieGen:
    """One PCIe generation: signalling rate and line encoding."""

    gen: int
    rate_GTps: Fraction          # giga-transfers per second per lane (1 transfer = 1 bit on the wire)
    encoding: str                # human name of the line code
    efficiency: Fraction         # payload bits / wire bits of the encoding
    source: str

    def lane_gbps(self) -> float:
        """Payload gigabits per second per lane, one direction."""
        return float(self.rate_GTps * self.efficiency)

    def throughput_GBps(self, lanes: int = 1) -> float:
        """Payload gigabytes per second (1e9 B/s) for `lanes` lanes, one direction."""
        if lanes not in LANE_WIDTHS:
            raise InvalidArgument(f"PCIe link width x{lanes} does not exist",
                                  f"use one of {', '.join(f'x{w}' for w in LANE_WIDTHS)}")
        return float(self.rate_GTps * self.efficiency * lanes / 8)

    def bidirectional_GBps(self, lanes: int = 1) -> float:
        """Both directions together (PCIe is full duplex): 2 x throughput_GBps."""
        return 2 * self.throughput_GBps(lanes)


# 8b/10b: 8 payload bits per 10 line bits (PCIe 1.x/2.x). 128b/130b: PCIe 3.0-5.0.
# PCIe 6.0 FLIT mode (PAM4, 64 GT/s): 256-byte flits = 236 B TLP + 6 B DLP + 8 B CRC + 6 B FEC;
# counting TLP+DLP bytes as payload gives 242/256 (PCI-SIG PCIe 6.0 specification, FLIT mode).
PCIE_GENERATIONS: dict[int, PcieGen] = {g.gen: g for g in [
    PcieGen(1, Fraction(5, 2), "8b/10b", Fraction(8, 10), "PCI-SIG PCIe 1.0a base spec (2.5 GT/s)"),
    PcieGen(2, Fraction(5), "8b/10b", Fraction(8, 10), "PCI-SIG PCIe 2.0 base spec (5 GT/s)"),
    PcieGen(3, Fraction(8), "128b/130b", Fraction(128, 130), "PCI-SIG PCIe 3.0 base spec (8 GT/s)"),
    PcieGen(4, Fraction(16), "128b/130b", Fraction(128, 130), "PCI-SIG PCIe 4.0 base spec (16 GT/s)"),
    PcieGen(5, Fraction(32), "128b/130b", Fraction(128, 130), "PCI-SIG PCIe 5.0 base spec (32 GT/s)"),
    PcieGen(6, Fraction(64), "FLIT 242/256 (PAM4, FEC+CRC)", Fraction(242, 256),
            "PCI-SIG PCIe 6.0 base spec (64 GT/s PAM4, 256 B FLIT)"),
]}


def pcie_gen(gen: int) -> PcieGen:
    """The PcieGen for generation `gen` (1..6)."""
    if gen not in PCIE_GENERATIONS:
        raise InvalidArgument(f"PCIe generation {gen} is not known", "use --gen 1, 2, 3, 4, 5 or 6")
    return PCIE_GENERATIONS[gen]


def pcie_GBps(gen: int, lanes: int) -> float:
    """Per-direction payload throughput of a PCIe Gen`gen` x`lanes` link in GB/s."""
    return pcie_gen(gen).throughput_GBps(lanes)


def pcie_arithmetic(gen: int, lanes: int) -> dict[str, Any]:
    """The worked computation for `ringflow hw pcie`: every intermediate value."""
    g = pcie_gen(gen)
    lane_gbps = g.lane_gbps()
    total_gbps = lane_gbps * lanes
    per_dir = g.throughput_GBps(lanes)
    eff = g.efficiency
    eff_text = {"8b/10b": "8/10", "128b/130b": "128/130"}.get(g.encoding, "242/256")
    return {
        "gen": gen, "lanes": lanes, "rate_GTps": float(g.rate_GTps), "encoding": g.encoding,
        "efficiency": eff_text, "efficiency_value": float(eff),
        "lane_gbps": lane_gbps, "total_gbps": total_gbps,
        "per_direction_GBps": per_dir, "per_direction_MBps": per_dir * 1000.0,
        "bidirectional_GBps": 2 * per_dir,
        "formula": (f"{float(g.rate_GTps):g} GT/s x {eff_text} = {lane_gbps:.4f} Gb/s per lane; "
                    f"x{lanes} = {total_gbps:.3f} Gb/s; / 8 = {per_dir:.4f} GB/s per direction "
                    f"({2 * per_dir:.3f} GB/s both directions)"),
        "source": g.source,
    }
