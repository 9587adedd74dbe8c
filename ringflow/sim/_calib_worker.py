"""One rank of `ringflow calibrate`: times tiny hand-built schedules on the real runtime.

Run under the launcher (`python -m ringflow.sim._calib_worker OUT.json [quick]`); rank 0 writes
median-free steady-state times (total / iterations, like nccl-tests) as JSON.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np


def _schedules(n: int):
    from ..algorithms.schedule import Buffer, BufferLayout, ChunkRef, ScheduleBuilder
    lay = {Buffer.IN: BufferLayout(1), Buffer.OUT: BufferLayout(1)}
    IN0, OUT0 = ChunkRef(Buffer.IN, 0), ChunkRef(Buffer.OUT, 0)

    def build(name, steps, reduce=False, exchange=False):
        b = ScheduleBuilder("all_reduce", n, name, layouts=lay)
        for s in range(steps):
            b.transfer(s, 0, 1, IN0, OUT0, reduce=reduce, local=IN0 if reduce else None)
            if exchange:
                b.transfer(s, 1, 0, IN0, OUT0, reduce=reduce, local=IN0 if reduce else None)
        return b.build()

    return {"oneway": build("cal-oneway", 1), "exchange": build("cal-exchange", 1, exchange=True),
            "exchange_reduce": build("cal-exchange-reduce", 1, reduce=True, exchange=True),
            "steps1": build("cal-steps1", 1), "steps8": build("cal-steps8", 8)}


def main() -> None:
    import ringflow
    out_path = sys.argv[1]
    quick = len(sys.argv) > 2 and sys.argv[2] == "quick"
    comm = ringflow.init()
    n = comm.size
    scheds = _schedules(n)
    sizes = [2**16, 2**20, 2**22] if quick else [2**16, 2**18, 2**20, 2**22, 2**24]
    min_s = 0.05 if quick else 0.15
    res: dict = {"nranks": n, "results": {}}

    def timed(name: str, nbytes: int) -> float:
        count = max(1, nbytes // 4)
        x = np.ones(count, dtype=np.float32)
        y = np.zeros(count, dtype=np.float32)
        for _ in range(2):
            comm.execute(scheds[name], x, y)
        t0 = time.perf_counter()
        comm.execute(scheds[name], x, y)
        probe = np.array([time.perf_counter() - t0])
        comm.broadcast(probe, root=0)          # every rank runs the same number of iterations
        iters = int(min(1000, max(5, min_s / max(probe[0], 1e-6))))
        best = float("inf")
        for _rep in range(3):                  # best of 3 batches: other load on the machine only adds time
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.execute(scheds[name], x, y)
            best = min(best, (time.perf_counter() - t0) / iters)
        return best

    for name in ("steps1", "steps8"):
        res["results"][name] = {"4": 1e6 * timed(name, 4)}
    for name in ("oneway", "exchange", "exchange_reduce"):
        res["results"][name] = {str(s): 1e6 * timed(name, s) for s in sizes}
    if comm.rank == 0:
        with open(out_path, "w") as fh:
            json.dump(res, fh)
    comm.destroy()


if __name__ == "__main__":
    main()
