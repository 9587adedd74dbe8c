"""Engine timing versus cluster size: `python -m ringflow.sim.scaling [64 256 1024 4096] [--json FILE]`.

Builds N/8 x dgx-h100 on a rail-optimised fabric (3 switch tiers above 1,024 GPUs), then times
ring and hierarchical all-reduce of 1 GiB with both engines: the first call (rings, routes,
tables) and a repeated call at another size (cached tables, as a planner sees it).
"""
from __future__ import annotations

import sys
import time

from ..algorithms.schedule import Collective


def run(gpus: list[int], size_bytes: int = 2**30) -> list[dict]:
    """Timing rows for every (GPU count, algorithm, engine)."""
    from ..topology import build_cluster
    from .api import simulate, table_for
    from .params import SimParams
    rows = []
    for n in gpus:
        nodes = max(1, n // 8)
        t0 = time.perf_counter()
        topo = build_cluster("dgx-h100", nodes, fabric="rail", tiers=3 if nodes > 128 else 2)
        build_s = time.perf_counter() - t0
        for algo in ("ring", "hierarchical"):
            for engine in ("analytic", "flow"):
                t0 = time.perf_counter()
                res = simulate(topo, Collective.ALL_REDUCE, size_bytes, algorithm=algo, engine=engine)
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                simulate(topo, Collective.ALL_REDUCE, size_bytes // 2, algorithm=algo, engine=engine)
                again = time.perf_counter() - t0
                tab = table_for(topo, Collective.ALL_REDUCE, n, algo, max_transfers=SimParams().max_transfers)
                rows.append({"gpus": n, "algorithm": algo, "engine": engine, "cluster_build_s": build_s,
                             "first_s": first, "repeat_s": again, "table_rows": tab.ntransfers,
                             "steps_merged": tab.coarsened, "time_us": res.time_us, "busbw_GBps": res.busbw_GBps,
                             "protocol": res.protocol})
    return rows


def main(argv: list[str]) -> None:
    """Print the timing table for the GPU counts in argv (default 64 256 1024 4096); --json FILE writes it."""
    import argparse
    import json
    ap = argparse.ArgumentParser(prog="python -m ringflow.sim.scaling", description=__doc__.splitlines()[0])
    ap.add_argument("gpus", nargs="*", type=int, default=[64, 256, 1024, 4096], help="cluster sizes (multiples of 8)")
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args(argv)
    print(f"{'GPUs':>5} {'algorithm':>12} {'engine':>8} {'first s':>8} {'repeat s':>9} {'rows':>8} "
          f"{'merge':>5} {'pred us':>10} {'busbw':>7}")
    rows = []
    for n in args.gpus:
        for r in run([n]):
            rows.append(r)
            print(f"{r['gpus']:>5} {r['algorithm']:>12} {r['engine']:>8} {r['first_s']:>8.2f} {r['repeat_s']:>9.4f} "
                  f"{r['table_rows']:>8} {r['steps_merged']:>5} {r['time_us']:>10.1f} {r['busbw_GBps']:>7.1f}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
        print(f"wrote {len(rows)} rows to {args.json}")


if __name__ == "__main__":
    main(sys.argv[1:])
