"""Calibrated tuning: the runtime's algorithm choice priced by the simulator on this host's calibration.

The runtime's tuner prices candidates with a flat alpha-beta model (`algorithms.cost`), which cannot
see a host's cache regimes, its single-copy thresholds or ranks sharing cores; on a 2-core VM it picks
pipelined tree broadcasts for 4 ranks from 2 MiB that a binomial tree beats by 1.4-2x.
With a topology written by `ringflow calibrate` (RINGFLOW_TUNER_TOPO) every candidate the tuner
considered is priced again by the analytic engine on the calibrated host curves, with the runtime's
own plans and argument check, exactly as `ringflow validate` predicts a bench row, and the fastest
replaces the flat choice where the simulator predicts a clear win (MIN_PREDICTED_GAIN).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
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
    # calibrated decisions made on this host, by call (`runtime.communicator.calibrated_decision`): the
    # communicators of a job that share one host file (split groups included) price a call shape once
    decisions: dict = field(default_factory=dict, compare=False, repr=False)

    def decision(self, key: tuple, make: Any) -> "CalibratedDecision":
        """The decision cached under `key`, else `make()` (kept: at most MAX_DECISIONS, then started anew)."""
        hit = self.decisions.get(key)
        if hit is None:
            hit = make()
            if len(self.decisions) >= MAX_DECISIONS:
                self.decisions.clear()
            self.decisions[key] = hit
        return hit

    @property
    def calibrated(self) -> bool:
        """True if the topology carries measured curves for this transport."""
        return bool((self.topo.meta.get("sim", {}).get("host_curves") or {}).get(self.transport))

    def supports(self, nranks: int) -> bool:
        """True if the calibration covers a job of `nranks` ranks on this transport."""
        return self.calibrated and len(self.topo.endpoints()) >= nranks


# A process keeps this many loaded host files (every communicator of a job loads RINGFLOW_TUNER_TOPO) and
# each host model this many priced call shapes (10-50 ms each)
MAX_LOADED_HOSTS = 8
MAX_DECISIONS = 4096
_LOADED: dict[tuple, HostModel] = {}


def load_host_model(path: str, transport: str) -> HostModel:
    """The calibrated topology at `path` for ranks talking over `transport` ('shm' or 'tcp'); the same
    model (and its priced decisions) again while the file is unchanged."""
    from ..topology import load_topology
    if transport not in HOST_TRANSPORTS:
        raise ConfigError(f"unknown host transport {transport!r}", f"use one of {', '.join(HOST_TRANSPORTS)}")
    try:
        st = os.stat(path)
        key: tuple | None = (os.path.realpath(path), st.st_mtime_ns, st.st_size, transport)
    except OSError:   # not a file (a preset name) or missing: load_topology says which
        key = None
    if key is not None and key in _LOADED:
        return _LOADED[key]
    model = HostModel(load_topology(path), transport)
    if not model.calibrated:
        raise ConfigError(f"{path} has no calibration for {transport}",
                          "write it with `ringflow calibrate --out FILE` on this host")
    if key is not None:
        if len(_LOADED) >= MAX_LOADED_HOSTS:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = model
    return model


def dtype_for(itemsize: int) -> str:
    """A dtype name of `itemsize` bytes (the simulator prices bytes; the name only labels rows)."""
    return {1: "uint8", 2: "float16", 4: "float32", 8: "float64"}.get(itemsize, "float32")


def predict_call_us(host: HostModel, schedule: Schedule, shape: CallShape, inplace: bool,
                    engine: str = "analytic") -> float:
    """Predicted time (us) of one runtime call of `schedule`: the runtime's plans (`from_plans`) and its
    argument check, on the calibrated host."""
    from .api import simulate_table
    from .results import size_for_count
    from .transfers import from_plans
    tab = from_plans(schedule, shape, inplace)
    size = size_for_count(shape.collective, shape.nranks, shape.count, shape.itemsize)
    dtype = dtype_for(shape.itemsize)
    res = simulate_table(host.topo, tab, size, dtype=dtype, engine=engine, params={"host_transport": host.transport},
                         endpoints=host.topo.endpoints()[:shape.nranks], checked=not is_self_checking(schedule))
    return res.time_us


# The simulator replaces the flat tuner's choice only where it predicts at least this speed-up: its
# error on a candidate is +-15-25 % (`ringflow validate`), and the cheapest of a dozen noisy estimates
# is most often one it under-prices. Measured on this 2-core VM (`ringflow validate --tuned` against a
# flat run, 288 rows, per job): switching at any predicted gain changed 274 job-rows for a geometric
# mean speed-up of 1.00 (a quarter of them >10 % slower); from 1.2x 90 rows, 1.11x; from 1.3x 51
# rows, 1.17x, 14 % of them slower; from 1.4x 33 rows, 1.20x.
MIN_PREDICTED_GAIN = 1.3


@dataclass(frozen=True)
class CalibratedDecision:
    """One call's calibrated tuning: the flat tuner's choice and its price on the host, every candidate
    the runtime may run with its price, and the schedule it runs."""

    flat: Schedule
    flat_us: float
    candidates: tuple[tuple[Any, Schedule, float], ...]   # (tuner candidate, its schedule, predicted us)
    chosen: Schedule

    @property
    def chosen_us(self) -> float:
        """The predicted time of the schedule calibrated tuning runs."""
        if self.chosen is self.flat:
            return self.flat_us
        return next(t for _, s, t in self.candidates if s is self.chosen)


def decide(flat: Schedule, pool: Sequence[Any], schedules: Sequence[Schedule], shape: CallShape, inplace: bool,
           host: HostModel) -> CalibratedDecision:
    """The candidate the calibrated host runs fastest where it beats the flat tuner's choice `flat` by
    MIN_PREDICTED_GAIN, else `flat` (ties: the earlier candidate, so every rank agrees). `pool[i]` is
    the tuner's candidate whose schedule is `schedules[i]`."""
    t_flat = predict_call_us(host, flat, shape, inplace)
    times = [predict_call_us(host, s, shape, inplace) for s in schedules]
    chosen = flat
    if times:
        i = min(range(len(times)), key=lambda k: (times[k], k))
        if t_flat >= MIN_PREDICTED_GAIN * times[i]:
            chosen = schedules[i]
    return CalibratedDecision(flat, t_flat, tuple(zip(pool, schedules, times)), chosen)


def sweep(host: HostModel, collective: Any, nranks: int, sizes: Sequence[int], dtype_size: int = 4,
          inplace: bool | None = None, progress: Any = None) -> list[dict[str, Any]]:
    """What calibrated tuning runs at every size (nccl-tests sizes): one row per size with the keys of
    `ringflow bench --json` for the calibrated choice (`algorithm`, `time_us`, algbw, busbw) and the flat
    tuner's (`flat_algorithm`, `flat_time_us`, `flat_busbw_GBps`), both priced on the host, `gain` and `changed`."""
    from .. import config
    from ..algorithms.schedule import Collective
    from ..errors import InvalidArgument
    from ..runtime.communicator import calibrated_decision
    from .results import busbw_factor, count_for_size, size_for_count
    from .validate import BENCH_IN_PLACE
    c = Collective.parse(collective)
    if not host.supports(nranks):
        raise InvalidArgument(f"the calibrated host has no {host.transport} calibration for {nranks} ranks "
                              f"({len(host.topo.endpoints())} endpoints)", "calibrate with --nprocs >= the ranks")
    ip = c in BENCH_IN_PLACE if inplace is None else bool(inplace)
    dtype = dtype_for(dtype_size)
    bus = busbw_factor(c, nranks)
    rows = []
    for size in sizes:
        count = count_for_size(c, nranks, size, dtype_size)
        if count < 1:
            continue
        nbytes = size_for_count(c, nranks, count, dtype_size)   # the runtime's S of the call (per-rank: all ranks')
        d = calibrated_decision(c, nbytes, nranks, 0 if c.has_root else None, dtype_size, ip,
                                int(config.get("SINGLE_RING_THRESHOLD")), host)
        t, t_flat = d.chosen_us, d.flat_us
        rows.append({"collective": c.value, "nranks": nranks, "size_bytes": nbytes, "count": count, "dtype": dtype,
                     "time_us": round(t, 4), "algbw_GBps": round(nbytes / (t * 1e3), 4),
                     "busbw_GBps": round(nbytes / (t * 1e3) * bus, 4), "wrong": None,
                     "algorithm": d.chosen.algorithm, "nsegs": int(d.chosen.params.get("nsegs", 1)),
                     "nchannels": d.chosen.nchannels, "engine": "analytic", "transport": host.transport,
                     "in_place": ip, "flat_algorithm": d.flat.algorithm,
                     "flat_nsegs": int(d.flat.params.get("nsegs", 1)), "flat_time_us": round(t_flat, 4),
                     "flat_busbw_GBps": round(nbytes / (t_flat * 1e3) * bus, 4), "gain": round(t_flat / t, 4),
                     "changed": d.chosen is not d.flat})
        if progress is not None:
            progress()
    return rows
