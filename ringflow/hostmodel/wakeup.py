"""The wake-up term: what a collective costs beyond the host model when one rank arrives long after another.

A rank that reaches a collective first spins for its window (`runtime.executor.HOT_SPIN_S` below the
low-latency threshold, the doorbell's spin budget above it), then sleeps on its doorbell; when the last rank's
data lands the sleeper pays a wake-up, which on a virtual machine is tens to hundreds of microseconds and grows
with how long it slept. The calibration sweep starts its ranks together, so its model holds no such wake-up.
`measure` runs a 2-rank job in which one rank enters an 8-byte all-reduce `delay` after the other; `fit` prices
each role's time past the late rank's start, beyond the same call entered together, as

    early_us(wait) = early_a_us + early_b_us * ln(wait / 1 ms)      (the rank that waited and slept)
    late_us(wait)  = late_a_us + late_b_us * ln(wait / 1 ms)        (the rank that arrived last)

with b = 0 (a constant) unless the logarithm predicts held-out delays better; the wait is clamped to the
measured range. `added_s` prices a recorded operation: when its members' starts spread beyond the spin window,
the median over members of their role's cost (the recorded duration is the members' median end).
"""
from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np

from ..errors import ConfigError, InvalidArgument
from ..runtime.bench import run_rank_job

DELAYS_US = (0.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0)
REPS = 20             # trials per delay (the late rank alternates)
NBYTES = 8            # the probe: one float64 all-reduce


def _spin_windows() -> tuple[float, float, int]:
    """(hot spin us, bulk spin us, low-latency threshold bytes) of this runtime."""
    from .. import config
    from ..runtime.call.executor import HOT_SPIN_S
    from ..runtime.transport.doorbell import spin_budget_s
    return HOT_SPIN_S * 1e6, spin_budget_s(2) * 1e6, int(config.get("LL_THRESHOLD"))


@dataclass(frozen=True)
class WakeupCost:
    """Fitted wake-up costs (us) of the early (slept) and late rank, and the runtime's spin windows."""

    early_a_us: float
    early_b_us: float
    late_a_us: float
    late_b_us: float
    min_wait_us: float          # the measured range of waits (the log form is clamped to it)
    max_wait_us: float
    spin_us: float              # a waiter's spin window below ll_threshold_bytes (HOT_SPIN_S)
    bulk_spin_us: float         # ... and at or above it (the doorbell's spin budget)
    ll_threshold_bytes: int

    def _at(self, a: float, b: float, wait_s: float) -> float:
        w_us = min(max(wait_s * 1e6, self.min_wait_us), self.max_wait_us)
        return max(0.0, a + b * math.log(w_us / 1000.0))

    def early_us(self, wait_s: float) -> float:
        """Extra time of a rank that waited `wait_s` (and slept) for the last one."""
        return self._at(self.early_a_us, self.early_b_us, wait_s)

    def late_us(self, wait_s: float) -> float:
        """Extra time of the last rank, the first having waited `wait_s`."""
        return self._at(self.late_a_us, self.late_b_us, wait_s)

    def spin_window_s(self, nbytes: int) -> float:
        """How long a waiter spins before it sleeps, for a call of `nbytes`."""
        return (self.spin_us if nbytes < self.ll_threshold_bytes else self.bulk_spin_us) / 1e6

    def added_s(self, starts_s: Sequence[float], nbytes: int) -> float:
        """Seconds a recorded operation (its members' start times) takes beyond its synchronous price: 0 unless
        the starts spread beyond the spin window; else the median over members of their role's cost."""
        if len(starts_s) < 2:
            return 0.0
        last, window = max(starts_s), self.spin_window_s(nbytes)
        spread = last - min(starts_s)
        if spread <= window:
            return 0.0
        extra = [self.early_us(last - s) if last - s > window else self.late_us(spread) for s in starts_s]
        return statistics.median(extra) / 1e6

    def to_dict(self) -> dict:
        """JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> WakeupCost:
        """From `to_dict` output."""
        names = {f.name for f in fields(cls)}
        if set(d) != names:
            raise ConfigError(f"malformed wake-up cost: fields {sorted(d)}, expected {sorted(names)}",
                              "recalibrate: ringflow calibrate")
        vals = {k: float(v) for k, v in d.items() if k != "ll_threshold_bytes"}
        return cls(**vals, ll_threshold_bytes=int(d["ll_threshold_bytes"]))


def role_times_us(rows: Sequence[dict]) -> dict[str, dict[float, list[float]]]:
    """Per role ('late', 'early'), per delay (us): each trial's time (us) from the late rank's start to that
    rank's end (delay 0: both ranks count as 'late', the synchronous baseline)."""
    out: dict[str, dict[float, list[float]]] = {"late": {}, "early": {}}
    for r in rows:
        late, d = int(r["late"]), float(r["delay_us"])
        s = r["start_ns"][late]
        for rank, end in enumerate(r["end_ns"]):
            role = "late" if rank == late or d == 0 else "early"
            out[role].setdefault(d, []).append((end - s) / 1e3)
    return out


def _fit_curve(waits_us: np.ndarray, extra_us: np.ndarray) -> tuple[float, float]:
    """(a, b) of a + b ln(wait / 1 ms) through per-delay medians: the log form only where it predicts each
    left-out delay better than a constant does."""
    x = np.log(waits_us / 1000.0)
    const_err = log_err = 0.0
    if len(x) >= 3:
        for i in range(len(x)):
            keep = np.arange(len(x)) != i
            const_err += abs(float(np.mean(extra_us[keep])) - extra_us[i])
            b, a = np.polyfit(x[keep], extra_us[keep], 1)
            log_err += abs(a + b * x[i] - extra_us[i])
    if len(x) >= 3 and log_err < const_err:
        b, a = np.polyfit(x, extra_us, 1)
        return float(a), float(b)
    return float(np.mean(extra_us)), 0.0


def fit(rows: Sequence[dict]) -> WakeupCost:
    """The wake-up cost from `measure`'s rows (delay-0 trials give the synchronous baseline; delays within the
    spin window are left out: the waiter did not sleep)."""
    times = role_times_us(rows)
    base = times["late"].get(0.0)
    if not base:
        raise InvalidArgument("the wake-up rows hold no delay-0 trials", "measure with 0 among the delays")
    base_us = statistics.median(base)
    spin_us, bulk_us, ll = _spin_windows()
    delays = sorted(d for d in times["early"] if d > spin_us)
    if not delays:
        raise InvalidArgument(f"no wake-up trial waited beyond the {spin_us:.0f} us spin window",
                              "measure with delays of 0.1 to 20 ms")
    w = np.array(delays)
    coef = {role: _fit_curve(w, np.array([statistics.median(times[role][d]) - base_us for d in delays]))
            for role in ("early", "late")}
    return WakeupCost(coef["early"][0], coef["early"][1], coef["late"][0], coef["late"][1],
                      float(w.min()), float(w.max()), spin_us, bulk_us, ll)


def measure(delays_us: Sequence[float] = DELAYS_US, reps: int = REPS, timeout_s: float = 120.0) -> list[dict]:
    """Run the 2-rank shared-memory wake-up job; its rows (`_wake_worker`)."""
    if reps < 1 or not delays_us or min(delays_us) < 0:
        raise InvalidArgument(f"delays {list(delays_us)}, reps {reps}", "give delays >= 0 us and reps >= 1")
    env = {k: v for k, v in os.environ.items() if k not in ("RINGFLOW_SHM_DISABLE", "RINGFLOW_RECORD")}
    spec = {"delays_us": list(delays_us), "reps": reps}
    rows: list[dict] = run_rank_job("ringflow.hostmodel._wake_worker", 2, spec, env=env, timeout_s=timeout_s,
                                    what="wake-up ranks")
    return rows
