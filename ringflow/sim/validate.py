"""`ringflow validate`: predicted versus measured `ringflow bench`, side by side, in one run.

For every transport (shm; TCP only with RINGFLOW_SHM_DISABLE=1), rank count and collective, the
real benchmark runs (`runtime.bench.launch`, the code behind `ringflow bench --json`), and the
simulator predicts each row with *the schedule the runtime ran*: the tuner's choice for that
call, chosen by `runtime.communicator.pick_schedule` as the runtime does, on the calibrated host-cpu
topology.  Error = (predicted - measured) / measured.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..algorithms.schedule import Collective

TRANSPORTS = ("shm", "tcp")


def runtime_schedule(collective: str, count: int, itemsize: int, nranks: int, root: int | None) -> Any:
    """The schedule ringflow's runtime runs for this `ringflow bench` call (same function, same arguments:
    bench calls all_reduce, broadcast and reduce in place, the others out of place)."""
    from .. import config
    from ..runtime.communicator import pick_schedule
    c = Collective.parse(collective)
    per_rank = c in (Collective.ALL_GATHER, Collective.GATHER, Collective.REDUCE_SCATTER, Collective.SCATTER,
                     Collective.ALL_TO_ALL)
    nbytes = count * itemsize * (nranks if per_rank else 1)
    inplace = c in (Collective.ALL_REDUCE, Collective.BROADCAST, Collective.REDUCE)
    return pick_schedule(c, nbytes, nranks, root, itemsize, inplace, int(config.get("SINGLE_RING_THRESHOLD")))


def predict_rows(topo: Any, rows: Sequence[dict], transport: str) -> list[dict]:
    """Predicted time for every measured bench row."""
    from .api import itemsize_of, simulate_schedule
    out = []
    for r in rows:
        coll, n = r["collective"], int(r["nranks"])
        item = itemsize_of(r["dtype"])
        c = Collective.parse(coll)
        per_rank = c in (Collective.ALL_GATHER, Collective.GATHER, Collective.REDUCE_SCATTER, Collective.SCATTER)
        count = int(r["count"]) // n if per_rank else int(r["count"])
        if c == Collective.ALL_TO_ALL:
            count = int(r["count"]) // n
        root = 0 if c.has_root else None
        sched = runtime_schedule(coll, count, item, n, root)
        ran = r.get("algorithm")
        if ran not in (None, "auto") and ran != sched.algorithm:
            from ..errors import InvalidUsage
            raise InvalidUsage(f"bench ran {ran} for {coll} at {r['size_bytes']} bytes on {n} ranks but the "
                               f"runtime's choice here is {sched.algorithm}",
                               "measure and predict with the same RINGFLOW_* settings (ALGO, NCHANNELS, ...)")
        res = simulate_schedule(topo, sched, int(r["size_bytes"]), dtype=r["dtype"],
                                params={"host_transport": transport}, endpoints=topo.endpoints()[:n])
        meas = float(r["time_us"])
        out.append({"transport": transport, "nranks": n, "collective": coll, "algorithm": sched.algorithm,
                    "size_bytes": int(r["size_bytes"]), "measured_us": meas, "predicted_us": res.time_us,
                    "error": (res.time_us - meas) / meas if meas > 0 else 0.0})
    return out


def validate(topo: str | Any | None = None, ranks: Sequence[int] = (2, 4), collectives: Sequence[str] | None = None,
             min_size: str = "64KiB", max_size: str = "16MiB", tolerance: float = 0.15, quick: bool = False,
             console: Any = None, transports: Sequence[str] = TRANSPORTS,
             repeats: int = 2) -> tuple[list[dict], bool]:
    """Measure with `ringflow bench`, predict, compare; (rows, all within tolerance)."""
    from ..runtime import bench
    from ..topology import load_topology
    if topo is None:
        from .calibrate import calibrate
        if console is not None:
            console.print("calibrating this machine first (ringflow calibrate)...")
        t, _ = calibrate(nprocs=max(ranks), quick=quick)
    elif isinstance(topo, str):
        t = load_topology(topo)
    else:
        t = topo
    if len(t.endpoints()) < max(ranks):
        from ..errors import InvalidArgument
        raise InvalidArgument(f"topology has {len(t.endpoints())} endpoints, validation needs {max(ranks)}",
                              "calibrate with --nprocs >= the largest rank count")
    colls = list(collectives) if collectives else list(bench.COLLECTIVES)
    rows: list[dict] = []
    for tr in transports:
        env = {"RINGFLOW_SHM_DISABLE": "1" if tr == "tcp" else "0"}
        for n in ranks:
            if console is not None:
                console.print(f"measuring {n} ranks over {tr}: {', '.join(colls)} ({min_size}..{max_size})")
            groups = ["all"] if sorted(colls) == sorted(bench.COLLECTIVES) else colls
            best: dict[tuple[str, int], dict] = {}
            worst: dict[tuple[str, int], float] = {}
            for c in groups:     # one job runs every collective; the fastest of `repeats` runs counts
                for _ in range(max(1, repeats)):
                    for row in bench.launch(c, n, min_size, max_size, factor=4 if quick else 2, extra_env=env):
                        key = (row["collective"], int(row["size_bytes"]))
                        worst[key] = max(worst.get(key, 0.0), float(row["time_us"]))
                        if key not in best or row["time_us"] < best[key]["time_us"]:
                            best[key] = row
            pred = predict_rows(t, [best[k] for k in sorted(best)], tr)
            for r in pred:   # how much the repeated runs disagreed: the noise floor of the comparison
                r["spread"] = worst[(r["collective"], r["size_bytes"])] / r["measured_us"] - 1.0
            rows += pred
    ok = all(abs(r["error"]) <= tolerance for r in rows)
    return rows, ok
