"""One rank of `ringflow calibrate`: times tiny hand-built schedules on the real runtime.

Run under the launcher (`python -m ringflow.sim._calib_worker OUT.json [quick]`); rank 0 writes
the times as JSON, taken the way `ringflow bench` takes them (`runtime.bench.median_call_s`).
"""
from __future__ import annotations

import json
import sys
import numpy as np


def _schedules(n: int):
    from ..algorithms.schedule import Buffer, BufferLayout, ChunkRef, ScheduleBuilder
    lay = {Buffer.IN: BufferLayout(1), Buffer.OUT: BufferLayout(1)}
    IN0, OUT0 = ChunkRef(Buffer.IN, 0), ChunkRef(Buffer.OUT, 0)

    def build(name: str, steps: int, reduce: bool = False, exchange: bool = False):  # noqa: ANN202
        """`steps` steps of 0 -> 1 (and 1 -> 0 with exchange), receiving or reducing."""
        b = ScheduleBuilder("all_reduce", n, name, layouts=lay)
        for s in range(steps):
            b.transfer(s, 0, 1, IN0, OUT0, reduce=reduce, local=IN0 if reduce else None)
            if exchange:
                b.transfer(s, 1, 0, IN0, OUT0, reduce=reduce, local=IN0 if reduce else None)
        return b.build()

    cp = ScheduleBuilder("all_reduce", n, "cal-copy", layouts=lay)
    for r in range(n):
        cp.copy(r, 0, OUT0, IN0)
    return {"copy": cp.build(), "oneway": build("cal-oneway", 1), "exchange": build("cal-exchange", 1, exchange=True),
            "exchange_reduce": build("cal-exchange-reduce", 1, reduce=True, exchange=True),
            "steps1": build("cal-steps1", 1), "steps8": build("cal-steps8", 8)}


def main() -> None:
    """Time every calibration schedule and write rank 0's results."""
    import ringflow
    out_path = sys.argv[1]
    quick = len(sys.argv) > 2 and sys.argv[2] == "quick"
    comm = ringflow.init()
    n = comm.size
    scheds = _schedules(n)
    sizes = [2**16, 2**20, 2**22] if quick else [2**16, 2**18, 2**20, 2**22, 2**24]
    res: dict = {"nranks": n, "results": {}}

    timer = np.zeros(1)

    def slowest(seconds: float) -> float:
        timer[0] = seconds
        comm.all_reduce(timer, "max")
        return float(timer[0])

    def timed(name: str, nbytes: int) -> float:
        """Timed like `ringflow bench` (runtime.bench.median_call_s); the median of a few batches."""
        from ..runtime.bench import median_call_s
        count = max(1, nbytes // 4)
        x = np.ones(count, dtype=np.float32)
        y = np.zeros(count, dtype=np.float32)
        with np.errstate(all="ignore"):
            batches = [median_call_s(lambda: comm.execute(scheds[name], x, y), comm.barrier, slowest,
                                     iters=5 if quick else 10)[0] for _ in range(3)]
        return float(np.median(batches))

    for name in ("steps1", "steps8"):
        res["results"][name] = {"4": 1e6 * timed(name, 4)}
    for name in ("copy", "oneway", "exchange", "exchange_reduce"):
        res["results"][name] = {str(s): 1e6 * timed(name, s) for s in sizes}
    if comm.rank == 0:
        with open(out_path, "w") as fh:
            json.dump(res, fh)
    comm.destroy()


if __name__ == "__main__":
    main()
