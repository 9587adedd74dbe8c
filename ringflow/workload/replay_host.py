"""Replay a recording on the host it came from: each collective priced by the host cost model that
`ringflow calibrate` wrote (docs/hostmodel.md), to check the replay against what the run measured.

The schedule priced is the one the runtime's flat tuner picks for the call (`algorithms.selection.
pick_schedule`; the recorded algorithm when the tuner would pick another); point-to-point calls, which the
model does not price, keep their recorded durations.

The calibration starts its ranks together; a recorded collective whose members' starts spread beyond a
waiter's spin window (`runtime.executor.HOT_SPIN_S` below the low-latency threshold, the doorbell's spin budget
above it) had its early ranks asleep, and each paid a wake-up when the last rank's data landed. Where the model
carries a wake-up cost (`model.wakeup`, `hostmodel.wakeup.WakeupCost`, fitted by `ringflow calibrate` on a
2-rank job in which one rank arrives late) such an operation is priced at the model's time plus the median over
its members of their wake-up cost, each early rank's at its recorded wait (the last start minus its own), the
last rank's at the recorded spread; a model without one prices every collective as if its ranks arrived together.
"""
from __future__ import annotations

from typing import Any

from ..algorithms.layout import CallShape
from ..algorithms.registry import get_schedule
from ..algorithms.schedule import Collective
from ..algorithms.selection import CostModel, pick_schedule
from ..errors import InvalidArgument
from .replay import Call, Key, instance_key, measured_durations, timeline

SINGLE_RING_BYTES = 256 * 2**10   # the runtime's default RINGFLOW_SINGLE_RING_THRESHOLD


class HostDurations:
    """Operation durations from a host cost model (collectives) and the recording (point-to-point)."""

    def __init__(self, model: CostModel, trace: dict[str, Any]) -> None:
        self.model, self.trace = model, trace
        self.measured = measured_durations(trace)
        self._cache: dict[tuple, float] = {}
        self.wakeup = getattr(model, "wakeup", None)

    def __call__(self, k: Key, cs: list[Call]) -> float:
        c0 = cs[0]
        members = [m for m in self.trace["groups"].get(k[1], []) if m is not None]
        if k[0] != "coll" or len(members) < 2 or c0["op"] == "barrier":
            return self.measured.get(k, 0.0)
        n = len(members)
        coll = Collective.parse(str(c0["op"]))
        nbytes = max(int(c.get("nbytes") or 0) for c in cs)
        itemsize = max(1, nbytes // max(1, int(c0.get("count") or 1)))
        root = c0.get("root")
        key = (coll, nbytes, n, root, c0.get("algo"))
        if key not in self._cache:
            if not self.model.supports(n):
                raise InvalidArgument(f"the host model was not calibrated for {n} ranks",
                                      f"calibrate with {n} among --ranks")
            count = nbytes // itemsize // (n if coll in (Collective.REDUCE_SCATTER, Collective.SCATTER,
                                                         Collective.ALL_TO_ALL) else 1)
            call_bytes = count * itemsize * (n if coll.per_rank_sized else 1)
            inplace = coll in (Collective.ALL_REDUCE, Collective.BROADCAST, Collective.REDUCE)
            sched = pick_schedule(coll, call_bytes, n, root, itemsize, inplace, SINGLE_RING_BYTES)
            if c0.get("algo") and sched.algorithm != c0["algo"]:
                sched = get_schedule(coll, str(c0["algo"]), n, root=root)
            self._cache[key] = self.model.predict_us(sched, CallShape(coll, n, count, itemsize), inplace) / 1e6
        return self._cache[key] + self.wakeup_s(cs, nbytes)

    def wakeup_s(self, cs: list[Call], nbytes: int) -> float:
        """Seconds the model's wake-up cost adds to an operation whose members' starts are `cs`' (0 without one)."""
        starts = [c["start_ns"] / 1e9 for c in cs if c.get("start_ns") is not None]
        return 0.0 if self.wakeup is None or len(starts) < 2 else float(self.wakeup.added_s(starts, nbytes))


def communication_time(trace: dict[str, Any], durations: Any | None = None) -> float:
    """Total seconds of the trace's collectives (each counted once): recorded, or as `durations` prices them."""
    ops: dict[Key, list[Call]] = {}
    for c in trace["calls"]:
        if c["lane"] == "coll" and c.get("status") == "ok":
            ops.setdefault(instance_key(c), []).append(c)
    if durations is None:
        m = measured_durations(trace)
        return sum(m.get(k, 0.0) for k in ops)
    return sum(durations(k, cs) for k, cs in ops.items())


def exposed_time(trace: dict[str, Any]) -> float:
    """Mean seconds per rank the recorded program spent blocked in communication: its blocking calls and its
    waits on asynchronous calls, each from issue to end."""
    per = [sum((c["end_ns"] - c["enq_ns"]) / 1e9 for c in cs
               if c.get("end_ns") and c.get("enq_ns") is not None and (c["lane"] == "wait" or not c.get("async")))
           for cs in timeline(trace).values()]
    return sum(per) / len(per) if per else 0.0
