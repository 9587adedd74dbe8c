"""Calibration sweep: time every registered algorithm of every collective on real local ranks, then fit.

A job is one `ringflow run -n N -m ringflow.hostmodel._sweep_worker` launch for one rank count and one
transport ('tcp' forces every rank onto TCP with RINGFLOW_SHM_DISABLE=1); the host load over each job is
recorded (`runtime.hostload.HostLoadMeter`) so a job that ran beside other work is visible. With shared memory
a 2-rank job also measures the wake-up of a rank that waited long enough to sleep (`wakeup`).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from ..algorithms import registry, tuner
from ..algorithms.schedule import Collective, Schedule
from ..algorithms.selection import call_shape, flat_choice
from ..errors import InvalidArgument
from ..runtime.bench import run_rank_job
from ..runtime.job.hostload import FOREIGN_BUSY_FRACTION, HostLoadMeter
from . import wakeup
from .features import TRANSPORTS, cache_sizes, call_features, host_cores

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all")
INPLACE = ("all_reduce", "broadcast", "reduce")   # called in place, as `ringflow bench` does
CALIBRATION_SIZES = tuple(4096 * 4**k for k in range(7))       # 4 KiB .. 16 MiB
QUICK_SIZES = (16 * 2**10, 1 * 2**20)
# one-host jobs never run these: the tuner offers `hierarchical` only with several hosts
SKIP_ALGORITHMS = ("hierarchical",)
FLAT = "flat"   # a task's algorithm: the runtime's default (flat tuner) choice for the call
QUIET_WAIT_S = 60.0      # before a job, wait this long at most for other processes' work to stop
BUSY_RETRIES = 2         # a job that ran beside other work is measured again up to this many times
CALIBRATION_PASSES = 3   # each call's samples are split over this many sweeps of the job (a noise burst meets one)


def single_ring_bytes() -> int:
    """The size below which the runtime keeps to one-channel schedules (RINGFLOW_SINGLE_RING_THRESHOLD)."""
    from .. import config
    return int(config.get("SINGLE_RING_THRESHOLD"))


def runtime_default(coll: str, nbytes: int, nranks: int) -> Schedule:
    """The schedule the runtime runs for this bench call without a cost model (its flat choice)."""
    c = Collective.parse(coll)
    root = 0 if c.has_root else None
    ch = tuner.choose(c, nbytes, nranks, dtype_size=4, root=root)
    return flat_choice(ch, c, nranks, root, nbytes, 4, single_channel=nbytes < single_ring_bytes(),
                       inplace=coll in INPLACE)


def schedule_for(task: dict, nranks: int) -> Schedule:
    """The schedule a task names: the flat choice, or an algorithm with segments and channels."""
    c = Collective.parse(task["collective"])
    if task["algorithm"] == FLAT:
        return runtime_default(c.value, int(task["size_bytes"]), nranks)
    root = 0 if c.has_root else None
    nch = int(task.get("nchannels", 1))
    rings = None
    if nch > 1:
        rings = tuner.choose(c, int(task["size_bytes"]), nranks, dtype_size=4, root=root).rings
    return registry.get_schedule(c, task["algorithm"], nranks, root=root, nsegs=int(task.get("nsegs", 1)),
                                 nchannels=nch, rings=rings)


def calibration_tasks(nranks: int, sizes: Sequence[int] = CALIBRATION_SIZES,
                      collectives: Sequence[str] = COLLECTIVES) -> list[dict]:
    """Every registered algorithm (one segment, one channel) of every collective at every size, plus the
    runtime's default choice where that is another schedule (segments or channels)."""
    tasks = []
    for size in sizes:
        for coll in collectives:
            names = [a for a in registry.algorithms_for(coll) if a not in SKIP_ALGORITHMS]
            for a in names:
                try:
                    registry.get_schedule(coll, a, nranks, root=0 if Collective.parse(coll).has_root else None)
                except Exception:   # noqa: BLE001 - an algorithm that does not build at this rank count
                    continue
                tasks.append({"collective": coll, "algorithm": a, "nsegs": 1, "nchannels": 1, "size_bytes": size})
            flat = runtime_default(coll, size, nranks)
            if flat.nchannels > 1 or max(lay.nsegs for lay in flat.layouts.values()) > 1:
                tasks.append({"collective": coll, "algorithm": FLAT, "size_bytes": size})
    return tasks


def wait_for_quiet(max_wait_s: float = QUIET_WAIT_S, probe_s: float = 2.0) -> float | None:
    """Wait (at most `max_wait_s`) until other processes use less than FOREIGN_BUSY_FRACTION of the cores
    over a `probe_s` window; the last window's share (None off Linux)."""
    end = time.monotonic() + max_wait_s
    while True:
        with HostLoadMeter() as m:
            time.sleep(probe_s)
        if m.result is None:
            return None
        share = m.result.foreign_fraction
        if share < FOREIGN_BUSY_FRACTION or time.monotonic() >= end:
            return share


def run_job(nranks: int, transport: str, tasks: list[dict], *, passes: int = 1, quick: bool = True,
            warmup: int = 3, iters: int = 0, timeout_s: float = 600.0) -> dict:
    """Launch one measuring job; {"transport", "nranks", "rows", "load", "wall_s"}."""
    if transport not in TRANSPORTS:
        raise InvalidArgument(f"unknown transport {transport!r}", "use shm or tcp")
    spec = {"tasks": tasks, "dtype": "float32", "warmup": warmup, "iters": iters, "passes": passes, "quick": quick}
    env = {k: v for k, v in os.environ.items() if k not in ("RINGFLOW_ALGO", "RINGFLOW_TUNER_MODEL")}
    if transport == "tcp":
        env["RINGFLOW_SHM_DISABLE"] = "1"
    else:
        env.pop("RINGFLOW_SHM_DISABLE", None)
    t0 = time.monotonic()
    with HostLoadMeter() as meter:
        rows = run_rank_job("ringflow.hostmodel._sweep_worker", nranks, spec, env=env, timeout_s=timeout_s,
                            what="measuring ranks")
    wall = time.monotonic() - t0
    load = meter.result.as_dict() if meter.result is not None else None
    for r in rows:
        r["transport"] = transport
    return {"transport": transport, "nranks": nranks, "rows": rows, "load": load, "wall_s": wall}


def _busy(job: dict) -> bool:
    return bool(job["load"] and job["load"]["foreign_fraction"] >= FOREIGN_BUSY_FRACTION)


def measure_quietly(nranks: int, transport: str, tasks: list[dict], say: Callable[[str], None] | None = None,
                    quiet_wait_s: float = QUIET_WAIT_S, retries: int = BUSY_RETRIES, **kw: object) -> dict:
    """`run_job` after waiting for the host to be quiet; a job that still ran beside other processes' work is
    measured again (BUSY_RETRIES times at most) and the least disturbed attempt kept (`attempts` says how many)."""
    best: dict | None = None
    for attempt in range(1 + retries):
        if quiet_wait_s > 0:
            wait_for_quiet(quiet_wait_s)
        job = run_job(nranks, transport, tasks, **kw)  # type: ignore[arg-type]
        job["attempts"] = attempt + 1
        if best is None or (job["load"] and best["load"]
                            and job["load"]["foreign_fraction"] < best["load"]["foreign_fraction"]):
            best = job
        if not _busy(job):
            break
        if say and attempt < retries:
            say(f"  other processes used {job['load']['foreign_fraction']:.0%} of the cores: measuring again")
    assert best is not None
    best["attempts"] = attempt + 1
    return best


def samples_from_rows(rows: Sequence[dict], transport: str, cores: int) -> list:
    """Fit samples (features of each row's schedule, measured time) for one transport."""
    from .fit import Sample
    caches = cache_sizes()
    out = []
    for r in rows:
        if r["transport"] != transport:
            continue
        n = int(r["nranks"])
        s = schedule_for(r, n)
        shape = call_shape(Collective.parse(r["collective"]), n, int(r["size_bytes"]), int(r.get("itemsize", 4)))
        out.append(Sample(call_features(s, shape, bool(r["inplace"]), transport, cores, caches), float(r["time_us"])))
    return out


def calibrate(ranks: Sequence[int] = (2, 4), transports: Sequence[str] = TRANSPORTS, *, quick: bool = False,
              sizes: Sequence[int] | None = None, collectives: Sequence[str] = COLLECTIVES,
              progress: Callable[[str], None] | None = None, command: str = "", quiet_wait_s: float = QUIET_WAIT_S,
              retries: int = BUSY_RETRIES) -> dict:
    """Measure and fit (waiting up to `quiet_wait_s` for a quiet host before each job, measuring a disturbed job
    again up to `retries` times); the host-model document (`model.write_file` writes it), with the calibration rows."""
    from .model import new_document
    say = progress or (lambda _m: None)
    if not ranks or min(ranks) < 2:
        raise InvalidArgument(f"ranks {list(ranks)}", "calibrate at 2 or more ranks, e.g. --ranks 2,4")
    sizes = tuple(sizes or (QUICK_SIZES if quick else CALIBRATION_SIZES))
    cores = host_cores()
    t0 = time.monotonic()
    jobs = []
    for tr in transports:
        for n in ranks:
            tasks = calibration_tasks(n, sizes, collectives)
            say(f"{tr}, {n} ranks: {len(tasks)} calls ...")
            job = measure_quietly(n, tr, tasks, say, quiet_wait_s, retries, passes=CALIBRATION_PASSES, quick=True)
            load = job["load"]
            say(f"  {job['wall_s']:.0f} s" + (f", other processes used {load['foreign_fraction']:.0%} of the cores"
                                             if load else ""))
            jobs.append(job)
    doc = new_document({"command": command, "ranks": list(ranks), "sizes": list(sizes),
                        "collectives": list(collectives), "measure_s": time.monotonic() - t0,
                        "jobs": [{k: j[k] for k in ("transport", "nranks", "load", "wall_s", "attempts")}
                                 for j in jobs]})
    doc["calibration"] = [r for j in jobs for r in j["rows"]]
    if "shm" in transports:
        say("shm, 2 ranks: wake-up after a late arrival ...")
        if quiet_wait_s > 0:
            wait_for_quiet(quiet_wait_s)
        doc["wakeup_calibration"] = wakeup.measure()
    _fit_document(doc, transports, ranks, cores, say)
    doc["meta"]["total_s"] = time.monotonic() - t0
    return doc


def _fit_document(doc: dict, transports: Sequence[str], ranks: Sequence[int], cores: int,
                  say: Callable[[str], None]) -> None:
    """Fit every transport's model from the document's calibration rows into the document."""
    from .fit import fit_model
    for tr in transports:
        samples = samples_from_rows(doc["calibration"], tr, cores)
        model = fit_model(samples, tr, cores, cache_sizes(), ranks)
        if tr == "shm" and doc.get("wakeup_calibration"):
            model.wakeup = wakeup.fit(doc["wakeup_calibration"])
            w = model.wakeup
            say(f"shm wake-up past the {w.spin_us:.0f} us spin window, at 1 ms: early rank {w.early_us(1e-3):.0f} us, "
                f"last rank {w.late_us(1e-3):.0f} us")
        doc["transports"][tr] = model.to_dict()
        say(f"{tr}: fitted on {len(samples)} calls; cross-validated median error {model.fit_stats['cv_median']:.1%}, "
            f"p90 {model.fit_stats['cv_p90']:.1%}; margin {model.margin:.2f}")


def refit(doc: dict, progress: Callable[[str], None] | None = None, command: str = "") -> dict:
    """A host-model document fitted again, with this code, from the calibration rows another one stored
    (measured on this host; nothing is measured again)."""
    rows = doc.get("calibration")
    if not rows:
        raise InvalidArgument("the host-model file holds no calibration rows", "calibrate again: ringflow calibrate")
    transports = sorted({r["transport"] for r in rows})
    ranks = sorted({int(r["nranks"]) for r in rows})
    out = {**doc, "transports": {}, "meta": {**doc.get("meta", {}), "refit_command": command}}
    _fit_document(out, transports, ranks, host_cores(), progress or (lambda _m: None))
    return out
