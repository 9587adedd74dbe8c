"""Simulation results: times, nccl-tests bandwidth figures, per-link and per-tier traffic."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..errors import InvalidArgument


def busbw_factor(collective: Collective | str, nranks: int) -> float:
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md of NVIDIA/nccl-tests)."""
    c = Collective.parse(collective)
    n = max(1, nranks)
    if c == Collective.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if c.per_rank_sized:
        return (n - 1) / n
    return 1.0


def count_for_size(collective: Collective | str, nranks: int, size_bytes: int, itemsize: int) -> int:
    """The call's `count` for an nccl-tests "size" (all-gather & co: size = nranks * count * itemsize)."""
    c = Collective.parse(collective)
    if size_bytes < 0 or itemsize <= 0:
        raise InvalidArgument(f"size {size_bytes} / itemsize {itemsize}", "sizes must be >= 0")
    elems = size_bytes // itemsize
    return elems // max(1, nranks) if c.per_rank_sized else elems


def size_for_count(collective: Collective | str, nranks: int, count: int, itemsize: int) -> int:
    """The nccl-tests "size" in bytes of a call of `count` elements."""
    c = Collective.parse(collective)
    return count * itemsize * (nranks if c.per_rank_sized else 1)


@dataclass
class SimResult:
    """One simulated collective call."""

    collective: Collective
    algorithm: str
    nranks: int
    size_bytes: int
    count: int
    dtype: str
    engine: str
    protocol: str
    time_us: float
    rank_finish_us: np.ndarray
    link_bytes: np.ndarray
    fabric: Any = None
    coarsened: int = 1
    timeline: list[tuple[int, int, int, int, float, float]] = field(default_factory=list)  # (step,src,dst,ch,t0,t1)
    notes: list[str] = field(default_factory=list)
    bound: str = ""   # what paced the call where the links did not: "nvls_reduce" (the NVSwitch adders)
    switches: list[str] = field(default_factory=list)   # timeline ranks nranks.. are these switch nodes

    @property
    def algbw_GBps(self) -> float:
        """size / time (GB/s = 1e9 B/s), as nccl-tests prints it."""
        return self.size_bytes / (self.time_us * 1e3) if self.time_us > 0 else 0.0

    @property
    def busbw_GBps(self) -> float:
        """algbw times the nccl-tests bus factor of the collective."""
        return self.algbw_GBps * busbw_factor(self.collective, self.nranks)

    def row(self) -> dict[str, Any]:
        """A row with the keys of `ringflow bench --json`, plus algorithm / engine / protocol."""
        return {"collective": self.collective.value, "nranks": self.nranks, "size_bytes": int(self.size_bytes),
                "count": int(self.count), "dtype": self.dtype, "time_us": round(float(self.time_us), 4),
                "algbw_GBps": round(self.algbw_GBps, 4), "busbw_GBps": round(self.busbw_GBps, 4),
                "wrong": None, "algorithm": self.algorithm, "engine": self.engine, "protocol": self.protocol}

    def link_util(self) -> np.ndarray:
        """Per link: bytes / (line rate x time)."""
        if self.fabric is None or self.time_us <= 0:
            return np.zeros_like(self.link_bytes)
        return self.link_bytes / (self.fabric.line_Bpus * self.time_us)

    def tiers(self) -> list[dict[str, Any]]:
        """Bytes and utilisation per link tier (nvlink, pcie, nic, leaf-spine, ...)."""
        if self.fabric is None:
            return []
        out: dict[str, dict[str, float]] = {}
        for i, tier in enumerate(self.fabric.link_tier):
            d = out.setdefault(tier, {"links": 0, "bytes": 0.0, "cap": 0.0, "busy_links": 0})
            d["links"] += 1
            d["bytes"] += float(self.link_bytes[i])
            d["cap"] += float(self.fabric.line_Bpus[i])
            d["busy_links"] += int(self.link_bytes[i] > 0)
        rows = []
        for tier, d in sorted(out.items()):
            util = d["bytes"] / (d["cap"] * self.time_us) if self.time_us > 0 and d["cap"] > 0 else 0.0
            rows.append({"tier": tier, "links": d["links"], "busy_links": d["busy_links"],
                         "bytes": d["bytes"], "util": util})
        return rows

    def top_links(self, k: int = 10) -> list[dict[str, Any]]:
        """The k busiest links: name, bytes, utilisation."""
        if self.fabric is None:
            return []
        util = self.link_util()
        order = np.argsort(-self.link_bytes)[:k]
        topo = self.fabric.topo
        name = getattr(topo, "label", lambda n: n)
        return [{"link": f"{name(self.fabric.edges[i][0])}->{name(self.fabric.edges[i][1])}",
                 "tier": self.fabric.link_tier[i], "bytes": float(self.link_bytes[i]), "util": float(util[i])}
                for i in order if self.link_bytes[i] > 0]

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary (row, rank finish spread, tiers, top links)."""
        rf = self.rank_finish_us
        return {**self.row(), "coarsened": self.coarsened, "notes": self.notes,
                "rank_finish_us": {"min": float(rf.min(initial=0)), "max": float(rf.max(initial=0))},
                "tiers": self.tiers(), "top_links": self.top_links()}
