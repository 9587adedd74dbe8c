"""How much of the machine other processes used while a measurement ran.

A benchmark's times include whatever else the cores did meanwhile. A check before a run
(`sim.calibrate.busy_warning`, a second of this meter) misses work that starts during it: a `nice -n 19`
replay beside a `ringflow validate` run put its 2-shm-rank rooted rows 16-460 % off while the start-of-run
load looked normal. `HostLoadMeter` measures the window itself, from Linux's /proc/stat (every core's busy time)
minus the CPU time of this process and of the children it has waited for (a launcher's ranks are its
children's children, counted once each process is reaped), and the time the hypervisor stole.
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

# other processes' share of the machine from which a measurement is flagged as run beside other work:
# an idle 2-core VM shows 0.5-2 % (kernel threads, the shell), one busy foreign process 50 %
FOREIGN_BUSY_FRACTION = 0.1
_STAT = "/proc/stat"


@dataclass(frozen=True)
class HostLoad:
    """CPU time over a measurement's window, in core-seconds: the machine's, ours, the hypervisor's steal."""
    wall_s: float
    cores: int
    busy_core_s: float
    ours_core_s: float
    steal_core_s: float

    @property
    def foreign_core_s(self) -> float:
        """Core-seconds other processes (not this one, not its reaped children) ran in the window."""
        return max(0.0, self.busy_core_s - self.ours_core_s)

    @property
    def foreign_fraction(self) -> float:
        """Other processes' and stolen time as a share of all the cores over the window (0..1)."""
        capacity = self.wall_s * self.cores
        return 0.0 if capacity <= 0 else min(1.0, (self.foreign_core_s + self.steal_core_s) / capacity)

    @property
    def busy(self) -> bool:
        """Whether the measurement ran beside enough other work that its times include it."""
        return self.foreign_fraction >= FOREIGN_BUSY_FRACTION

    def as_dict(self) -> dict[str, Any]:
        """The figures for a JSON record, with the derived share."""
        return {**asdict(self), "foreign_fraction": round(self.foreign_fraction, 4)}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> HostLoad:
        """The figures `as_dict` wrote (the derived share is computed again)."""
        return cls(**{f.name: record[f.name] for f in fields(cls)})

    def describe(self) -> str:
        """One line for a console: how much other work ran, and what it means."""
        return (f"other processes used {self.foreign_fraction:.0%} of the {self.cores} cores over "
                f"{self.wall_s:.0f} s ({self.foreign_core_s:.1f} core-s, {self.steal_core_s:.1f} stolen): "
                f"its times include their work")


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, steal) jiffies summed over all cores, or None off Linux."""
    try:
        with open(_STAT, encoding="ascii") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    v = [int(x) for x in fields[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = v[:7]
    steal = v[7] if len(v) > 7 else 0
    return user + nice + system + irq + softirq, steal   # guest time is already inside user


def _our_cpu_s() -> float:
    """CPU seconds of this process and of every descendant it has waited for."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


class HostLoadMeter:
    """Context manager: `with HostLoadMeter() as m: ...`, then `m.result` (None where /proc/stat is missing).

    Reap the processes the window started before it ends: a child still running counts as foreign."""

    def __init__(self) -> None:
        self.result: HostLoad | None = None
        self._start: tuple[float, float, tuple[int, int] | None] | None = None

    def __enter__(self) -> HostLoadMeter:
        self._start = (time.monotonic(), _our_cpu_s(), _cpu_jiffies())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None
        t0, ours0, jiffies0 = self._start
        jiffies1 = _cpu_jiffies()
        if jiffies0 is None or jiffies1 is None:
            return
        hz = os.sysconf("SC_CLK_TCK")
        self.result = HostLoad(wall_s=time.monotonic() - t0, cores=os.cpu_count() or 1,
                               busy_core_s=(jiffies1[0] - jiffies0[0]) / hz, ours_core_s=_our_cpu_s() - ours0,
                               steal_core_s=(jiffies1[1] - jiffies0[1]) / hz)
