"""The builder every preset uses: adds one server's devices and links to a Topology (ids 'h<host>/...').

Every bandwidth comes from ringflow.hardware (PCIe arithmetic, NVLink generations, socket links).
"""
from __future__ import annotations

from typing import Any

from ..hardware import LATENCY_US, NVSWITCH_GENERATIONS, SystemSpec, nvlink_gen, pcie_GBps, socket_link
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

    def nic(self, i: int, speed_gbps: float, numa: int, fabric: str = "ib", rail: int | None = None,
            **kw: object) -> str:
        """Add compute NIC i (port speed in Gb/s); `rail` defaults to i."""
        return self.t.add_node(self.nid("nic", i), NodeKind.NIC, self.h, i, speed_gbps=float(speed_gbps),
                               numa=numa, fabric=fabric, rail=i if rail is None else rail,
                               name=f"mlx5_{i}" if fabric == "ib" else f"eth{i}", **kw)

    def pcie(self, a: str, b: str, gen: int, lanes: int = 16, root: int | None = None) -> None:
        """PCIe link, bandwidth computed from the generation and width."""
        extra: dict[str, Any] = {} if root is None else {"root": root}
        self.t.add_link(a, b, LinkType.PCIE, pcie_GBps(gen, lanes), LATENCY_US["pcie"], nlinks=1, tier="pcie",
                        gen=gen, lanes=lanes, **extra)

    def nvlink(self, a: str, b: str, gen: int, n: int) -> None:
        """n parallel NVLinks of generation `gen` merged into one edge per direction."""
        self.t.add_link(a, b, LinkType.NVLINK, n * nvlink_gen(gen).link_GBps, LATENCY_US["nvlink"], nlinks=n,
                        tier="nvlink", gen=gen)

    def storage(self, cpu: str, spec: SystemSpec, count: int | None = None) -> None:
        """Record the storage / in-band NICs on CPU node `cpu`: they are not part of the compute fabric, so they
        are attributes (count, Gb/s, model), not NIC nodes the cluster builder would wire to its leaves."""
        n = spec.storage_nics if count is None else count
        if n:
            self.t.graph.nodes[cpu].update(storage_nics=n, storage_nic_gbps=float(spec.storage_nic_gbps),
                                           storage_nic_model=spec.storage_nic_model)

    def socket(self, a: str, b: str, name: str, n: int) -> None:
        """n socket links (QPI/UPI/xGMI) between two CPUs."""
        self.t.add_link(a, b, LinkType.QPI, n * socket_link(name).link_GBps, LATENCY_US["qpi"], nlinks=n,
                        tier="qpi", tech=name)
