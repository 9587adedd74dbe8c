"""`ringflow calibrate`: measure this machine with ringflow's own runtime, write a host-cpu topology.

Measurements (``_calib_worker``, real processes over the real transports, best of 3 batches):

- ``steps1`` / ``steps8``: 1 and 8 steps of a 4-byte message -> per-message latency
  alpha = (t8 - t1) / 7 and per-call overhead t1 - alpha, at 2 and at 4 ranks (the runtime's
  argument check talks to every peer: overhead = base + per_peer x (n - 1));
- ``oneway``: rank 0 -> rank 1 at 64 KiB .. 16 MiB -> one-way bandwidth (1 / least-squares slope);
- ``exchange``: 0 <-> 1 at once -> per-direction bandwidth; a rank's copy engine carries both
  directions, so endpoint_GBps = 2 x that;
- ``exchange_reduce``: the same with reduction -> extra seconds per reduced byte -> reduce_GBps;
- ``copy``: every rank copies the buffer locally (a schedule of COPY ops) -> copy_GBps;
- the lines are fitted on sizes whose working set (2 x bytes x ranks) fits the last-level cache;
  larger sizes give ``dram_factor``, how much slower CPU-moved bytes are from DRAM.

Each transport (shm, and TCP with RINGFLOW_SHM_DISABLE=1) is measured separately.  `fit` turns
the numbers into a topology whose SHM / LOOPBACK edges carry the one-way bandwidth and latency and
whose ``meta["sim"]`` carries the rest; `tests/test_sim_calibrate.py` checks the round trip.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

import numpy as np

from ..errors import SystemError as RFSystemError


def busy_warning() -> str | None:
    """A warning when other processes load this machine (timings then only bound the truth)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = os.cpu_count() or 1
    if load > 0.5 * cores:
        return (f"this machine is busy (1-minute load {load:.1f} on {cores} cores): measured times include "
                f"other processes' work; repeat when it is idle for trustworthy figures")
    return None


def measure(nranks: int, transport: str, quick: bool = False, timeout_s: float = 300.0) -> dict[str, Any]:
    """Run the calibration worker on `nranks` local ranks over `transport` ('shm' or 'tcp')."""
    from ..runtime import launcher
    with tempfile.TemporaryDirectory(prefix="ringflow-cal-") as d:
        out = os.path.join(d, "cal.json")
        argv = [sys.executable, "-m", "ringflow.sim._calib_worker", out] + (["quick"] if quick else [])
        env = {"RINGFLOW_SHM_DISABLE": "1" if transport == "tcp" else "0"}
        code = launcher.run(nranks, argv, timeout_s=timeout_s, prefix=True, extra_env=env)
        if code != 0 or not os.path.exists(out):
            raise RFSystemError(f"calibration job ({nranks} ranks, {transport}) failed with exit code {code}",
                                "run `ringflow run -n 2 ...` to check the runtime works on this machine")
        with open(out) as fh:
            return json.load(fh)


def _line(points: dict[str, float]) -> tuple[float, float]:
    """Least-squares t = a + b x over (bytes, microseconds): (a us, b us per byte).

    Noisy points can tilt the line; a slope that is not positive falls back to the line through
    the origin-free two largest sizes (timings only grow with size)."""
    x = np.array([float(k) for k in points])
    y = np.array([float(v) for v in points.values()])
    A = np.stack([np.ones_like(x), x], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    if b <= 0 and x.size >= 2:
        i = np.argsort(x)[-2:]
        b = max((y[i[1]] - y[i[0]]) / max(x[i[1]] - x[i[0]], 1.0), y[i[1]] / x[i[1]] * 0.5)
        a = float(np.min(y))
    return float(a), float(max(b, 1e-9))


def llc_bytes() -> int | None:
    """This machine's last-level cache size (sysfs), or None."""
    best = None
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        entries = [d for d in os.listdir(base) if d.startswith("index")]
    except OSError:
        return None
    for d in entries:
        try:
            with open(os.path.join(base, d, "size")) as fh:
                txt = fh.read().strip().upper()
            mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(txt[-1:], 1)
            best = max(best or 0, int(txt.rstrip("KMG")) * mult)
        except (OSError, ValueError):
            continue
    return best


def fit(measured: dict[str, dict[int, dict[str, Any]]], nprocs: int = 4, cores: int | None = None,
        cache_bytes: int | None = None) -> tuple[Any, dict[str, dict[str, Any]]]:
    """measured[transport][nranks] = worker output -> (host-cpu Topology, report of fitted parameters)."""
    cache = cache_bytes if cache_bytes is not None else (llc_bytes() or 2**62)
    from ..topology import Topology
    from ..topology.presets import build_host_cpu
    report: dict[str, dict[str, Any]] = {}
    per: dict[str, dict[str, float]] = {}
    for tr, by_n in measured.items():
        ns = sorted(by_n)
        r2 = by_n[ns[0]]["results"]
        t1, t8 = r2["steps1"]["4"], r2["steps8"]["4"]
        alpha = max(0.0, (t8 - t1) / 7.0)
        over = {n: max(0.0, by_n[n]["results"]["steps1"]["4"] - alpha) for n in ns}
        if len(ns) > 1:
            per_peer = max(0.0, (over[ns[-1]] - over[ns[0]]) / (ns[-1] - ns[0]))
        else:
            per_peer = 0.0
        base = over[ns[0]] - per_peer * (ns[0] - 1)   # the line through the measured points (may be < 0 at n=1)
        n0 = int(by_n[ns[0]]["nranks"])
        fits = lambda pts: {k: v for k, v in pts.items() if 2 * int(k) * n0 <= cache}  # noqa: E731
        a1, b1 = _line(fits(r2["oneway"]) if len(fits(r2["oneway"])) >= 2 else r2["oneway"])
        ax, bx = _line(fits(r2["exchange"]) if len(fits(r2["exchange"])) >= 2 else r2["exchange"])
        _, bxr = _line(fits(r2["exchange_reduce"]) if len(fits(r2["exchange_reduce"])) >= 2 else r2["exchange_reduce"])
        # above the cache: how much slower than the in-cache line the large sizes are
        slow = [(float(t) - a) / (int(k) * b) for series, a, b in ((r2["oneway"], a1, b1), (r2["exchange"], ax, bx))
                for k, t in series.items() if 2 * int(k) * n0 > cache]
        dram = float(np.clip(np.median(slow), 1.0, 8.0)) if slow else 1.0   # guard against noisy fits
        oneway = 1e-3 / b1
        endpoint = 2 * 1e-3 / bx
        extra = max(bxr - bx, 1e-6)           # us per reduced byte (both sides reduce concurrently)
        copy_GBps = None
        if "copy" in r2:
            _, bc = _line(fits(r2["copy"]) if len(fits(r2["copy"])) >= 2 else r2["copy"])
            copy_GBps = 1e-3 / bc
        per[tr] = {"alpha_us": alpha, "base_us": base, "per_peer_us": per_peer, "oneway_GBps": oneway,
                   **({"copy_GBps": copy_GBps} if copy_GBps else {}),
                   "endpoint_GBps": max(endpoint, oneway), "reduce_GBps": 1e-3 / extra,
                   "dram_factor": max(1.0, dram)}
        for k, v in per[tr].items():
            report[f"{tr}.{k}"] = {"value": v, "from": _source(k)}
    shm, tcp = per.get("shm"), per.get("tcp")
    ref = shm or tcp
    assert ref is not None
    topo = Topology("host-cpu-calibrated", meta={"preset": "host-cpu", "calibrated": True})
    build_host_cpu(topo, 0, nprocs,
                   shm_GBps=(shm or ref)["oneway_GBps"], loopback_GBps=(tcp or ref)["oneway_GBps"],
                   shm_latency_us=(shm or ref)["alpha_us"], loopback_latency_us=(tcp or ref)["alpha_us"])
    reduce_rates = [p["reduce_GBps"] for p in per.values()]
    topo.meta["sim"] = {
        "endpoint_GBps": {tr: p["endpoint_GBps"] for tr, p in per.items()},
        "host_cores": int(cores or os.cpu_count() or 1),
        "reduce_GBps": float(np.median(reduce_rates)),
        **({"copy_GBps": float(np.median([p["copy_GBps"] for p in per.values() if "copy_GBps" in p]))}
           if any("copy_GBps" in p for p in per.values()) else {}),
        "protocols": [{"name": "simple", "bw_fraction": 1.0, "base_us": ref["base_us"], "msg_overhead_us": {}}],
        "call_overhead_per_peer_us": ref["per_peer_us"],
        "cache_bytes": int(cache) if cache < 2**62 else None,
        "dram_factor": float(np.median([p["dram_factor"] for p in per.values()])),
        "per_transport": {tr: {"base_us": p["base_us"], "call_overhead_per_peer_us": p["per_peer_us"],
                               "msg_overhead_us": {"net": p["alpha_us"]}} for tr, p in per.items()},
        "calibration": {"per_transport": per, "raw": measured},
    }
    report["host_cores"] = {"value": topo.meta["sim"]["host_cores"], "from": "os.cpu_count()"}
    return topo, report


def _source(key: str) -> str:
    return {"alpha_us": "(t 8 steps - t 1 step) / 7, 4-byte messages",
            "base_us": "t 1 step - alpha, 2 ranks",
            "per_peer_us": "growth of the call overhead from 2 to 4 ranks",
            "oneway_GBps": "1 / slope of one-way time vs bytes (64 KiB..)",
            "endpoint_GBps": "2 / slope of two-way exchange time vs bytes",
            "reduce_GBps": "1 / (slope with reduction - slope without)",
            "copy_GBps": "1 / slope of a local copy of the buffer (COPY ops: Bruck's rotations, ...)",
            "dram_factor": "sizes whose working set exceeds the last-level cache: time over the in-cache line"}.get(key, "")


def calibrate(nprocs: int = 4, quick: bool = False, transports: tuple[str, ...] = ("shm", "tcp"),
              rank_counts: tuple[int, ...] = (2, 4)) -> tuple[Any, dict[str, dict[str, Any]]]:
    """Measure (real runtime jobs) and fit; returns (topology, report)."""
    measured = {tr: {n: measure(n, tr, quick) for n in rank_counts} for tr in transports}
    return fit(measured, nprocs)
