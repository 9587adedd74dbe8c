"""Named non-physics parameters of the simulator, each with its source.

Physics (link bandwidth per direction, link latency, who is wired to whom) lives in the
topology.  What is *not* physics lives here: how much of a link's bandwidth software
actually gets, what each message costs on top of the wire, which protocols exist and how
traffic is routed across equal-cost paths (`SimParams`), and what ringflow's CPU runtime
spends on a GPU-less host beyond its links (`SimParams.cpu`, `cpu_params.CpuHostParams`).

Every default below cites where it comes from.  A topology overrides any of them with a
``meta["sim"]`` dict using the same (flat) field names, e.g.::

    meta:
      sim:
        link_efficiency: {shm: 1.0}
        msg_overhead_us: {shm: 18.5}
        reduce_GBps: 3.2

`params_for(topo)` merges defaults, the topology's ``meta["sim"]`` and explicit overrides.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .cpu_params import CPU_FIELDS, CpuHostParams, merge_cpu

# --- link classes -------------------------------------------------------------------------
# The per-message overhead depends on the kind of path a message takes (NCCL's "hw" axis:
# NVLink, PCI, network) plus, for ringflow's own CPU runtime, "shm" and "tcp" (loopback TCP).
LINK_CLASSES = ("nvlink", "pci", "net", "shm", "tcp")

# Achievable fraction of a link's per-direction line rate, by LinkType value.
# - nvlink 0.822: NCCL's effective NVLink4 bandwidth is ~370 GB/s of the 450 GB/s line rate
#   ("with the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of 370GB/s"),
#   S. Jeaugey (NVIDIA), https://github.com/NVIDIA/nccl-tests/issues/212 ; 370/450 = 0.822.
# - ib / ethernet 0.94: "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NVIDIA),
#   https://github.com/NVIDIA/nccl-tests/issues/290 ; 47/50 = 0.94 (RoCE assumed alike).
# - pcie 0.837: H100 device-to-host over PCIe Gen5 x16 measured with NVIDIA's nvbandwidth at
#   52.77 GB/s (https://github.com/NVIDIA/nvbandwidth/issues/24) of 63.015 GB/s payload rate
#   (ringflow.hardware.pcie_GBps(5, 16)): 52.77 / 63.015 = 0.837.  (Older figures are lower:
#   seed 002's Gen3 GPU-to-GPU copy, 10.59 of 15.754 GB/s = 0.672; A100 Gen4 ~25 of 31.5 = 0.79,
#   https://github.com/ZaidQureshi/bam/issues/54.)
# - qpi 1.0: the socket link is never the bottleneck of the seed's cross-socket figure
#   (9.15 GB/s < the PCIe legs); the PCIe efficiency applies on those paths.
# - shm / loopback 1.0: host-cpu topologies carry effective rates in their edges (topology.presets).
DEFAULT_LINK_EFFICIENCY: dict[str, float] = {
    "nvlink": 0.822, "ib": 0.94, "ethernet": 0.94, "pcie": 0.837, "qpi": 1.0,
    "shm": 1.0, "loopback": 1.0,
}


@dataclass(frozen=True)
class Protocol:
    """A wire protocol: the share of bandwidth it delivers and its fixed costs (microseconds)."""

    name: str
    bw_fraction: float
    base_us: float                      # once per collective call
    msg_overhead_us: dict[str, float]   # per message (one schedule transfer), by link class


# NCCL's ring protocols, from NVIDIA/nccl src/graph/tuning.cc (commit 01afd20a, NCCL 2.8):
#   baseLat Ring {LL 3.6, LL128 10.0, Simple 8.4} us; hwLat Ring NVLink {.47, 1.9, 3.4},
#   PCI {1.0, 2.5, 5.7}, NET {2.7, 4.0, 9.6} us per step; bus bandwidth x 1/4 for LL
#   (ring all-reduce) and x 0.92 for LL128 ("120.0/128.0").  Simple gets the full
#   achievable bandwidth (the link efficiencies above were measured with Simple).
#   "shm" / "tcp" (ringflow's CPU runtime) have no NCCL figure: 0 unless meta["sim"] gives one.
NCCL_PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("simple", 1.0, 8.4, {"nvlink": 3.4, "pci": 5.7, "net": 9.6, "shm": 0.0, "tcp": 0.0}),
    Protocol("ll128", 0.92, 10.0, {"nvlink": 1.9, "pci": 2.5, "net": 4.0, "shm": 0.0, "tcp": 0.0}),
    Protocol("ll", 0.25, 3.6, {"nvlink": 0.47, "pci": 1.0, "net": 2.7, "shm": 0.0, "tcp": 0.0}),
)

ROUTING_MODES = ("fixed", "ecmp", "spray")


@dataclass(frozen=True)
class SimParams:
    """All tunable, non-physics simulator parameters (see module docstring for sources)."""

    link_efficiency: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LINK_EFFICIENCY))
    protocols: tuple[Protocol, ...] = NCCL_PROTOCOLS
    # Routing across equal-cost paths: "spray" splits a message evenly over all of them (NVLink
    # striping over NVSwitch planes; IB adaptive routing), "ecmp" hashes (src, dst, channel) to
    # one path, "fixed" always takes topo.path().  Intra-host and inter-host separately.
    routing_intra: str = "spray"
    routing_inter: str = "ecmp"
    # NVLS switch operations (`sim.nvls`) move their bytes at this fraction of the NVLink rate the other
    # algorithms get; None: NCCL's own figure for the NVSwitch generation (`nvls.NVLS_EFFICIENCY`).
    nvls_efficiency: float | None = None
    # NVLS in-switch reduction rate per NVSwitch chip in 32-bit adds per second x 1e9; None: the hardware
    # catalog's figure for the generation (`hardware.nvlink.NVSWITCH_REDUCE_GFLOPS`).
    nvls_reduce_gflops: float | None = None
    # Flow engine: above this many transfers, consecutive steps with the same (sender, receiver,
    # channel) pattern are merged into one (bytes added, per-message costs multiplied): exact
    # without contention, an approximation of the timeline with it (docs/simulator.md).
    max_transfers: int = 400_000
    # ringflow's CPU runtime on GPU-less hosts (`cpu_params`); every default is "no such cost".
    cpu: CpuHostParams = field(default_factory=CpuHostParams)

    def __post_init__(self) -> None:
        for k, v in self.link_efficiency.items():
            if not 0 < float(v) <= 1.0:
                raise ConfigError(f"sim link_efficiency[{k!r}]={v} is outside (0, 1]",
                                  "give the achievable fraction of the line rate, e.g. 0.82")
        for mode in (self.routing_intra, self.routing_inter):
            if mode not in ROUTING_MODES:
                raise ConfigError(f"sim routing {mode!r} is unknown", f"use one of {ROUTING_MODES}")
        if not self.protocols:
            raise ConfigError("sim protocols list is empty", "give at least one protocol")

    def protocol(self, name: str) -> Protocol:
        """The protocol called `name`."""
        for p in self.protocols:
            if p.name == name:
                return p
        raise ConfigError(f"unknown protocol {name!r}", f"known: {[p.name for p in self.protocols]}")

    def to_dict(self) -> dict[str, Any]:
        """A YAML/JSON-ready dict (the flat form `meta['sim']` takes)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "cpu"}
        d["link_efficiency"] = dict(self.link_efficiency)
        d["protocols"] = [dataclasses.asdict(p) for p in self.protocols]
        return {**d, **dataclasses.asdict(self.cpu)}


_GPU_FIELDS = frozenset(f.name for f in dataclasses.fields(SimParams)) - {"cpu"}


def _protocol_from(d: Mapping[str, Any]) -> Protocol:
    try:
        return Protocol(str(d["name"]), float(d["bw_fraction"]), float(d.get("base_us", 0.0)),
                        {str(k): float(v) for k, v in dict(d.get("msg_overhead_us", {})).items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad sim protocol entry {dict(d)!r}: {exc}",
                          "each protocol needs name, bw_fraction, base_us, msg_overhead_us") from None


def merge_params(base: SimParams, overrides: Mapping[str, Any] | None) -> SimParams:
    """`base` with fields replaced from a meta['sim']-style dict (link_efficiency merged key by key;
    the CPU-host names go to `SimParams.cpu`).

    Shorthands: ``msg_overhead_us: {class: us}`` and ``base_us: us`` apply to every protocol.
    """
    if not overrides:
        return base
    shorthands = {"msg_overhead_us", "base_us"}
    info = {"calibration", "source", "notes"}   # informational entries a topology file may carry
    known = _GPU_FIELDS | CPU_FIELDS | shorthands | info | {"cpu"}
    nested = dict(overrides.get("cpu") or {})   # the CPU-host fields may also come as one "cpu" mapping
    for key in [*overrides, *(f"cpu.{k}" for k in nested if k not in CPU_FIELDS)]:
        if key not in known:
            raise ConfigError(f"unknown simulator parameter {key!r} in meta['sim']",
                              f"known parameters: {', '.join(sorted(known - info))}")
    kwargs: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in _GPU_FIELDS:
            continue
        if key == "link_efficiency":
            kwargs[key] = {**base.link_efficiency, **{str(k): float(v) for k, v in dict(value).items()}}
        elif key == "protocols":
            kwargs[key] = tuple(_protocol_from(p) for p in value)
        else:
            kwargs[key] = value
    protos = kwargs.get("protocols", base.protocols)
    if "msg_overhead_us" in overrides:
        extra = {str(k): float(v) for k, v in dict(overrides["msg_overhead_us"]).items()}
        protos = tuple(dataclasses.replace(p, msg_overhead_us={**p.msg_overhead_us, **extra}) for p in protos)
    if "base_us" in overrides:
        protos = tuple(dataclasses.replace(p, base_us=float(overrides["base_us"])) for p in protos)
    kwargs["protocols"] = tuple(protos)
    kwargs["cpu"] = merge_cpu(merge_cpu(base.cpu, overrides), nested)
    return dataclasses.replace(base, **kwargs)


def params_for(topo: Any, overrides: Mapping[str, Any] | None = None) -> SimParams:
    """Defaults, then the topology's meta['sim'], then explicit `overrides`, then the
    `per_transport` entry of the chosen host transport (if any)."""
    meta = getattr(topo, "meta", None) or {}
    p = merge_params(merge_params(SimParams(), meta.get("sim")), overrides)
    extra = (p.cpu.per_transport or {}).get(p.cpu.host_transport)
    return merge_params(p, extra) if extra else p
