"""Rank side of the one-thread-per-communicator tests: several threads call collectives on one communicator.

Usage: ringflow run -n N -- python tests/threads_ranks.py NTHREADS CALLS
The owning thread mixes synchronous and asynchronous all-reduces and checks each result; the other threads
call at the same time and must get InvalidUsage naming both threads, never run. Then the communicator is
handed to a worker thread with bind_thread(), which must get exact results. Prints one JSON line of counts.
"""
from __future__ import annotations

import json
import sys
import threading

import numpy as np

import ringflow
from ringflow.errors import InvalidUsage


def main() -> int:
    nthreads, calls = int(sys.argv[1]), int(sys.argv[2])
    comm = ringflow.init(timeout=60.0)
    r, n = comm.rank, comm.size
    want = sum(range(1, n + 1))
    counts = {"exact": 0, "wrong": 0, "refused": 0, "refused_named": 0, "other_ran": 0, "handed_over_exact": 0}
    stop = threading.Event()
    lock = threading.Lock()

    def intruder(k: int) -> None:
        x = np.full(16, r + 1, np.float32)
        while not stop.is_set():
            try:
                if k % 2:
                    comm.all_reduce(x, async_op=True).wait()
                else:
                    comm.all_reduce(x)
                with lock:
                    counts["other_ran"] += 1
            except InvalidUsage as e:
                with lock:
                    counts["refused"] += 1
                    named = threading.current_thread().name in str(e) and "MainThread" in str(e)
                    counts["refused_named"] += named

    others = [threading.Thread(target=intruder, args=(k,), name=f"intruder-{k}") for k in range(nthreads - 1)]
    for t in others:
        t.start()
    xs = [np.full(1000 * (i % 3 + 1), r + 1, np.float32) for i in range(4)]
    for i in range(calls):
        x = xs[i % 4]
        x[:] = r + 1
        if i % 3 == 0:
            works = [comm.all_reduce(x, async_op=True)]
            works[0].wait()
        else:
            comm.all_reduce(x)
        counts["exact" if (x == want).all() else "wrong"] += 1
    stop.set()
    for t in others:
        t.join()
    comm.barrier()

    def heir() -> None:
        comm.bind_thread()
        for _ in range(20):
            x = np.full(64, r + 1, np.int64)
            comm.all_reduce(x)
            counts["handed_over_exact"] += bool((x == want).all())
    t = threading.Thread(target=heir, name="heir")
    t.start()
    t.join()
    print(json.dumps(counts), flush=True)
    comm.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
