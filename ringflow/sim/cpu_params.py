"""Named parameters of CPU hosts (ringflow's own runtime on GPU-less machines), each with its source.

GPUs move bytes with DMA engines and fuse reductions into the copy kernel, so none of these apply
to them: every default is "no such cost".  On a host-cpu topology they describe what the CPU
runtime spends beyond the links' figures: the per-rank copy engine, the host's cores, local
copies and reductions, the argument check before a call.  Measured figures come from the host
model (docs/hostmodel.md) or a user's ``meta["sim"]`` / ``--param``, under the same flat names
(`SimParams.cpu` holds them; `params.merge_params` maps the keys).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

HOST_TRANSPORTS = ("auto", "shm", "tcp")


@dataclass(frozen=True)
class CpuHostParams:
    """What ringflow's CPU runtime costs on a host beyond its links (defaults: no such cost)."""

    # Between two PROC ranks of one host: "auto" = the topology's route, "shm" = through shared
    # memory, "tcp" = over loopback TCP (RINGFLOW_SHM_DISABLE=1; runtime.transport).
    host_transport: str = "auto"
    # The per-rank copy engine by transport (GB/s): the runtime moves every byte with the CPU of the
    # ranks at both ends (the sender copies into a shm slot or socket, the receiver out of it), one
    # progress thread per rank, so everything a rank sends and receives shares it.  None: no limit.
    endpoint_GBps: dict[str, float] | None = None
    # A host's CPUs: a pool of host_cores x the engine rate that every byte crosses once at each end,
    # and local work slowed by ranks / cores where ranks outnumber them.  None: no limit.
    host_cores: int | None = None
    # The host pool's total rate (GB/s) where measured directly; None: host_cores x the engine rate.
    host_pool_GBps: float | None = None
    # Local copies and reductions of a rank (GB/s of bytes touched); None: free (on GPUs NCCL fuses
    # the reduction into the copy kernel).  The CPU runtime reduces with numpy after receiving.
    copy_GBps: float | None = None
    reduce_GBps: float | None = None
    # Fixed cost per call and per peer on top of the protocol's base_us (microseconds): the runtime
    # exchanges the call's description with every peer before data moves.
    call_overhead_per_peer_us: float = 0.0
    # The runtime's CHECK exchange of a call's arguments before any data moves, unless the schedule's
    # first step already exchanges with every peer (algorithms.schedule.is_self_checking), or does once the
    # compiler adds its verify messages (algorithms.verify_messages): microseconds.
    check_us: float = 0.0
    # Overrides (any simulator parameter) applied when `host_transport` is the key: shm and TCP
    # figures of one host side by side.
    per_transport: dict[str, dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.host_transport not in HOST_TRANSPORTS:
            raise ConfigError(f"sim host_transport {self.host_transport!r} is unknown", "use auto, shm or tcp")
        for k, v in (self.endpoint_GBps or {}).items():
            if not float(v) > 0:
                raise ConfigError(f"sim endpoint_GBps[{k!r}]={v} must be > 0", "give a measured GB/s")
        if self.host_cores is not None and int(self.host_cores) < 1:
            raise ConfigError(f"sim host_cores={self.host_cores} must be >= 1", "or null for no limit")
        for rate, name in ((self.copy_GBps, "copy_GBps"), (self.reduce_GBps, "reduce_GBps"),
                           (self.host_pool_GBps, "host_pool_GBps")):
            if rate is not None and rate <= 0:
                raise ConfigError(f"sim {name}={rate} must be > 0", "or null for 'free'")

    @property
    def transport(self) -> str:
        """The transport CPU-moved bytes take between ranks of one host: "tcp" or "shm"."""
        return "tcp" if self.host_transport == "tcp" else "shm"


CPU_FIELDS = frozenset(f.name for f in dataclasses.fields(CpuHostParams))


def merge_cpu(base: CpuHostParams, overrides: Mapping[str, Any]) -> CpuHostParams:
    """`base` with the CPU-host fields of a meta['sim']-style dict replaced (other keys ignored)."""
    kwargs = {k: v for k, v in overrides.items() if k in CPU_FIELDS}
    return dataclasses.replace(base, **kwargs) if kwargs else base
