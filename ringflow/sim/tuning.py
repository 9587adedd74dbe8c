"""Calibrated tuning: the runtime's algorithm choice priced by the simulator on this host's calibration.

The runtime's tuner prices candidates with a flat alpha-beta model (`algorithms.cost`), which cannot
see a host's cache regimes, its single-copy thresholds or ranks sharing cores; on a 2-core VM it picks
pipelined tree broadcasts and reduces for 4 ranks from 2 MiB that a binomial tree beats by 1.2-2x.
With a topology written by `ringflow calibrate` (RINGFLOW_TUNER_TOPO) every candidate the tuner
considered is priced instead by the analytic engine on the calibrated host curves, with the runtime's
own plans and argument check, exactly as `ringflow validate` predicts a bench row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..algorithms.layout import CallShape
from ..algorithms.schedule import Schedule, is_self_checking
from ..errors import ConfigError

HOST_TRANSPORTS = ("shm", "tcp")


@dataclass(frozen=True)
class HostModel:
    """A calibrated host-cpu topology and the transport a job's ranks use on it."""

    topo: Any
    transport: str

    def supports(self, nranks: int) -> bool:
        """True if the calibration covers a job of `nranks` ranks on this transport."""
        curves = (self.topo.meta.get("sim", {}).get("host_curves") or {}).get(self.transport)
        return bool(curves) and len(self.topo.endpoints()) >= nranks


def load_host_model(path: str, transport: str) -> HostModel:
    """The calibrated topology at `path` for ranks talking over `transport` ('shm' or 'tcp')."""
    from ..topology import load_topology
    if transport not in HOST_TRANSPORTS:
        raise ConfigError(f"unknown host transport {transport!r}", f"use one of {', '.join(HOST_TRANSPORTS)}")
    topo = load_topology(path)
    model = HostModel(topo, transport)
    if not (topo.meta.get("sim", {}).get("host_curves") or {}).get(transport):
        raise ConfigError(f"{path} has no calibration for {transport}",
                          "write it with `ringflow calibrate --out FILE` on this host")
    return model


def predict_call_us(host: HostModel, schedule: Schedule, shape: CallShape, inplace: bool,
                    engine: str = "analytic") -> float:
    """Predicted time (us) of one runtime call of `schedule`: the runtime's plans (`from_plans`) and its
    argument check, on the calibrated host."""
    from .api import simulate_table
    from .results import size_for_count
    from .transfers import from_plans
    tab = from_plans(schedule, shape, inplace)
    size = size_for_count(shape.collective, shape.nranks, shape.count, shape.itemsize)
    dtype = {1: "uint8", 2: "float16", 4: "float32", 8: "float64"}.get(shape.itemsize, "float32")
    res = simulate_table(host.topo, tab, size, dtype=dtype, engine=engine, params={"host_transport": host.transport},
                         endpoints=host.topo.endpoints()[:shape.nranks], checked=not is_self_checking(schedule))
    return res.time_us


def fastest(schedules: Sequence[Schedule], shape: CallShape, inplace: bool, host: HostModel) -> Schedule:
    """The schedule the calibrated host runs fastest (ties: the earlier one, so every rank agrees)."""
    if not schedules:
        raise ValueError("no candidate schedules")
    times = [predict_call_us(host, s, shape, inplace) for s in schedules]
    return schedules[min(range(len(times)), key=lambda i: (times[i], i))]
