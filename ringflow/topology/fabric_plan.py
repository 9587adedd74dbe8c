"""Scale-out fabric options and sizing: tiers, switch radix, oversubscription per tier, parallel planes.

Sizing (switch radix R ports; oversubscription o = down:up ports of a switch):
  leaf:   down = round(R * o_leaf / (1 + o_leaf)) NIC ports, up = R - down
  2 tiers: spines = ceil(leaves * up / R), every leaf to every spine; fits while spines <= up, i.e. at most
           R leaves = R * down endpoints per plane (radix 64, 1:1: 2,048)
  3 tiers: pods of d2 = round(R * o_spine / (1 + o_spine)) leaves with their own spines (d2 down, R - d2 up
           ports); spine j of every pod joins core group j; fits while pods <= R, i.e. at most R * d2 * down
           endpoints per plane (radix 64, 1:1: 65,536)
Planes: P parallel, independent fabrics of the same shape; NIC i of every server joins plane i % P (a
multi-plane fat-tree as in DeepSeek's, arXiv:2505.09343 Sec. 5, https://arxiv.org/abs/2505.09343). Traffic
between NICs of different planes crosses a server (NCCL's PXN); inside a plane it never leaves it.
Default radix 64 = NVIDIA Quantum-2 QM9700 (64 x 400 Gb/s NDR ports, datasheet,
https://www.nvidia.com/en-us/networking/infiniband/qm9700/).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import TopologyError

FABRICS = ("rail", "fat-tree")
DEFAULT_RADIX = 64


def ports(radix: int, oversub: float) -> tuple[int, int]:
    """(down, up) ports of a switch of `radix` ports at down:up oversubscription `oversub`."""
    down = max(1, min(radix - 1, round(radix * oversub / (1 + oversub))))
    return down, radix - down


def rail_plan(per_host: int, nodes: int, down: int) -> tuple[int, int]:
    """(rails sharing one leaf, leaves per rail group): one rail per leaf once a rail fills a leaf."""
    if nodes >= down:
        return 1, math.ceil(nodes / down)
    return max(1, min(per_host, down // nodes)), 1


@dataclass(frozen=True)
class FabricSpec:
    """The shape of a cluster's scale-out fabric."""

    kind: str = "rail"                       # "rail" (rail-optimised) or "fat-tree"
    tiers: int = 2                           # 2: leaf-spine; 3: leaf-spine-core
    radix: int = DEFAULT_RADIX               # ports per switch
    oversub: tuple[float, ...] = (1.0,)      # down:up per tier below the top: (leaf,) or (leaf, spine)
    planes: int = 1                          # parallel independent fabrics

    @classmethod
    def make(cls, kind: str = "rail", tiers: int = 2, radix: int = DEFAULT_RADIX,
             oversub: float | Sequence[float] = 1.0, planes: int = 1) -> FabricSpec:
        """Validated spec; TopologyError names the bad option and the fix."""
        over = (float(oversub),) if isinstance(oversub, int | float) else tuple(float(x) for x in oversub)
        if kind not in FABRICS:
            raise TopologyError(f"fabric {kind!r} is not known", f"use one of {', '.join(FABRICS)}")
        if tiers not in (2, 3):
            raise TopologyError(f"tiers={tiers} is not supported", "use 2 (leaf-spine) or 3 (leaf-spine-core)")
        if not isinstance(radix, int) or radix < 4:
            raise TopologyError(f"radix={radix} is too small", "switches have at least 4 ports, e.g. --radix 64")
        if not over or len(over) > tiers - 1:
            names = "leaf" if tiers == 2 else "leaf,spine"
            raise TopologyError(f"{len(over)} oversubscription values for {tiers} tiers",
                                f"give one per tier below the top ({names}), e.g. --oversub "
                                f"{'2' if tiers == 2 else '1,2'}; or use --tiers 3 for a spine value")
        for o in over:
            if not o >= 1.0:
                raise TopologyError(f"oversubscription={o:g} must be >= 1", "1 = non-blocking, 2 = 2:1, ...")
        if not isinstance(planes, int) or planes < 1:
            raise TopologyError(f"planes={planes!r} must be an integer >= 1", "1 = one fabric, N = N parallel fabrics")
        return cls(kind, tiers, radix, over, planes)

    @property
    def leaf_oversub(self) -> float:
        """down:up at the leaves."""
        return self.oversub[0]

    @property
    def spine_oversub(self) -> float:
        """down:up at the spines of a 3-tier fabric (1 when not given)."""
        return self.oversub[1] if len(self.oversub) > 1 else 1.0

    def leaf_ports(self) -> tuple[int, int]:
        """(down, up) ports of a leaf."""
        return ports(self.radix, self.leaf_oversub)

    def spine_ports(self) -> tuple[int, int]:
        """(down, up) ports of a spine in a 3-tier fabric."""
        return ports(self.radix, self.spine_oversub)

    def max_endpoints(self) -> int:
        """The most NIC ports one plane of this shape holds."""
        down = self.leaf_ports()[0]
        if self.tiers == 2:
            return self.radix * down
        return self.radix * self.spine_ports()[0] * down

    def leaves_needed(self, per_host: int, nodes: int) -> int:
        """Leaves one plane needs for `nodes` servers with `per_host` NICs in that plane."""
        down = self.leaf_ports()[0]
        if self.kind == "rail":
            rpl, lpg = rail_plan(per_host, nodes, down)
            return math.ceil(per_host / rpl) * lpg
        return math.ceil(per_host * nodes / down)

    def check_fits(self, nics_per_host: int, nodes: int) -> None:
        """TopologyError explaining what does not fit (ports, leaves, endpoints) and how to fix it."""
        if self.planes > nics_per_host:
            raise TopologyError(f"{self.planes} planes but each server has {nics_per_host} NICs",
                                f"use --planes {nics_per_host} or fewer (every plane needs a NIC of every server)")
        per = math.ceil(nics_per_host / self.planes)
        nleaf = self.leaves_needed(per, nodes)
        down, up = self.leaf_ports()
        if self.tiers == 2:
            fits, limit = math.ceil(nleaf * up / self.radix) <= up, f"{self.radix} leaves"
        else:
            fits, limit = math.ceil(nleaf / self.spine_ports()[0]) <= self.radix, f"{self.radix} pods"
        if fits:
            return
        plane = f" per plane ({self.planes} planes)" if self.planes > 1 else ""
        over = ",".join(f"{o:g}" for o in self.oversub)
        raise TopologyError(
            f"{nodes} nodes x {nics_per_host} NICs need {nodes * nics_per_host:,} leaf ports: {nleaf} {self.kind} "
            f"leaves of {down} down ports{plane}; radix {self.radix} with {self.tiers} tiers at oversubscription "
            f"{over} holds at most {limit} = {self.max_endpoints():,} endpoints per plane",
            "use tiers=3 (--tiers 3), a larger radix (--radix), more planes (--planes), or fewer nodes")
