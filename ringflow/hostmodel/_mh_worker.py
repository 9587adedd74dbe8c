"""One rank of the multi-host validation: flat ring vs hierarchical all-reduce, timed like `ringflow bench`.

Run inside a network namespace by `hostmodel.multihost`; argv: OUT.json PER_HOST SIZE [SIZE ...].
Ranks r = host * PER_HOST + local; rank 0 writes the rows.
"""
from __future__ import annotations

import json
import sys
import time

import numpy as np


def main() -> None:
    """Time flat ring and hierarchical all-reduce; rank 0 writes the rows."""
    import ringflow

    from ..algorithms import registry
    out_path, per_host = sys.argv[1], int(sys.argv[2])
    sizes = [int(s) for s in sys.argv[3:]]
    comm = ringflow.init()
    n = comm.size
    groups = [list(range(h * per_host, (h + 1) * per_host)) for h in range(n // per_host)]
    scheds = {"ring": registry.get_schedule("all_reduce", "ring", n),
              "hierarchical": registry.get_schedule("all_reduce", "hierarchical", n, host_groups=groups)}
    timer = np.zeros(1)
    rows = []
    for algo, sched in scheds.items():
        for nbytes in sizes:
            x = np.ones(nbytes // 4, dtype=np.float32)
            comm.execute(sched, x)
            times = []
            for _ in range(max(3, min(10, int(2e7 // max(nbytes, 1))))):
                comm.barrier()
                t0 = time.perf_counter()
                comm.execute(sched, x)
                timer[0] = time.perf_counter() - t0
                comm.all_reduce(timer, "max")
                times.append(float(timer[0]))
            rows.append({"collective": "all_reduce", "nranks": n, "size_bytes": nbytes, "count": nbytes // 4,
                         "dtype": "float32", "time_us": 1e6 * float(np.median(times)), "algorithm": algo})
    if comm.rank == 0:
        with open(out_path, "w") as fh:
            json.dump(rows, fh)
    comm.destroy()


if __name__ == "__main__":
    main()
