"""`ringflow bench`: the nccl-tests table measured on real local ranks.

Bus bandwidth factors are nccl-tests' (doc/PERFORMANCE.md in NVIDIA/nccl-tests):
all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1;
gather, scatter (n-1)/n. ``algbw = size / time``, ``busbw = algbw x factor``, where size is the
nccl-tests size: the whole buffer for all_reduce / broadcast / reduce, the whole output for
all_gather / gather, the whole input for reduce_scatter / scatter and all_to_all.
Time (`median_call_s`, shared with the baselines and calibration): a sample is a barrier followed by
back-to-back calls timed together (as many as take SAMPLE_MIN_S, 1 ms); the sample's time is the
slowest rank's time per call, and the row shows the median over samples (about ROW_TARGET_S of
them). A job's ranks first make SETTLE_S of back-to-back small all-reduces (`settle`), so its first row
is not timed in the job-start transient. Values are not reset between calls, as in nccl-tests:
resetting would rewrite the buffer into one core's cache before every sample and time a cache state
no training step has.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidArgument, RingflowSystemError
from ..units import format_size, parse_size, size_range

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather",
               "scatter")
REDUCTIONS = ("all_reduce", "reduce_scatter", "reduce")
IN_PLACE = ("all_reduce", "broadcast", "reduce")  # called in place, as nccl-tests and torch users do
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    if n <= 1:
        return 1.0 if collective in ("broadcast", "reduce") else 0.0 if collective != "all_reduce" else 0.0
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_to_all": (n - 1) / n, "gather": (n - 1) / n, "scatter": (n - 1) / n,
            "broadcast": 1.0, "reduce": 1.0}[collective]


# untimed calls before a row's samples, as nccl-tests' default (-w 5): on this VM a 16 MiB in-place reduce
# between 2 ranks runs 1.3-1.7x slow for its first 4-6 calls on memory not touched for a while (its
# buffers fresh, or used last a sweep ago) and settles by the sixth, so 2 warm-up calls left the
# calibration's 6-sample points half in that transient (10-15 % slow) and the bench's 20-sample rows a fifth
WARMUP_CALLS = 5
SAMPLE_MIN_S = 1e-3   # a sample times back-to-back calls for at least this long (barrier skew is amortised)
ROW_TARGET_S = 0.3    # samples per row: about this much timed work, between MIN_ and MAX_SAMPLES
MIN_SAMPLES, MAX_SAMPLES = 10, 200


# a job's first timed row starts after this long of back-to-back collectives: on a 16-core host the small
# all-reduces of a 16-rank job run two to three times slower in the job's first few hundred milliseconds than
# later (a job-start transient: the cores' clocks, the processes' first pages, the launcher), so a job that
# timed its 8-byte row first reported that transient instead of its steady latency
SETTLE_S = 0.5


def settle(slowest: Callable[[float], float], seconds: float = SETTLE_S,
           clock: Callable[[], float] = time.perf_counter) -> int:
    """Make the job's collectives back to back (each `slowest`, itself a small all-reduce) until the slowest rank has
    spent `seconds`, before the job's first timed row; every rank makes the same calls. The calls made."""
    t0, calls = clock(), 1
    while slowest(clock() - t0) < seconds:
        calls += 1
    return calls


def batch_size(call_s: float) -> int:
    """Calls timed back to back per sample, as nccl-tests times a loop of iterations: the barrier's
    exit skew (tens of us) is spread over at least SAMPLE_MIN_S of work."""
    return max(1, min(50, int(np.ceil(SAMPLE_MIN_S / max(call_s, 1e-7)))))


def default_iters(call_s: float, batch: int) -> int:
    """Samples per row: enough for a stable median without running for minutes."""
    return int(np.clip(ROW_TARGET_S / max(call_s * batch, 1e-7), MIN_SAMPLES, MAX_SAMPLES))


def median_call_s(call: Callable[[], Any], barrier: Callable[[], Any], slowest: Callable[[float], float], *,
                  warmup: int = WARMUP_CALLS, iters: int = 0, quick: bool = False,
                  clock: Callable[[], float] = time.perf_counter) -> tuple[float, int]:
    """Median over samples of the slowest rank's mean time per call; (seconds, samples).

    The one timing loop of every benchmark here (ringflow, Gloo and Open MPI baselines, calibration):
    warm-up calls (the fastest sizes the batch, agreed by all ranks through `slowest`), then
    samples of a barrier and `batch_size` back-to-back calls."""
    times = call_samples_s(call, barrier, slowest, warmup=warmup, iters=iters, quick=quick, clock=clock)
    return float(np.median(times)), len(times)


def call_samples_s(call: Callable[[], Any], barrier: Callable[[], Any], slowest: Callable[[float], float], *,
                   warmup: int = WARMUP_CALLS, iters: int = 0, quick: bool = False, share: int = 1,
                   clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """`median_call_s`'s samples, seconds per call; with `share` > 1 a 1/share part of their
    count (`iters`, or the default; at least 3), for a row timed in that many passes."""
    one = float("inf")
    for _ in range(max(1, warmup)):
        t0 = clock()
        call()
        one = min(one, clock() - t0)   # one descheduled warm-up call must not shrink the batch to a single call
    one = slowest(one)
    m = batch_size(one)
    n = iters or default_iters(one, m)
    if quick and not iters:
        n = max(3, n // 4)
    if share > 1:
        n = max(3, -(-n // share))
    times = []
    for _ in range(n):
        barrier()
        t0 = clock()
        for _ in range(m):
            call()
        times.append(slowest((clock() - t0) / m))
    return times


def _fill(comm: Any, coll: str, nelem: int, dtype: np.dtype, alloc: bool) -> tuple[np.ndarray, np.ndarray | None]:
    n = comm.size
    in_n = nelem if coll in ("all_reduce", "broadcast", "reduce", "all_to_all", "reduce_scatter", "scatter") \
        else nelem // n
    out_n = {"all_gather": nelem, "gather": nelem, "reduce_scatter": nelem // n, "scatter": nelem // n,
             "all_to_all": nelem}.get(coll)
    mk = (lambda k: comm.alloc(k, dtype)) if alloc else (lambda k: np.empty(k, dtype))
    x = mk(in_n)
    x[...] = ((np.arange(in_n) % 97) + comm.rank + 1).astype(dtype)
    out = mk(out_n) if out_n is not None else None
    return x, out


def _expected(coll: str, n: int, rank: int, nelem: int, dtype: np.dtype, x_of) -> np.ndarray | None:
    """Reference result for --check (None where a rank has no defined output)."""
    xs = [x_of(r) for r in range(n)]
    if coll == "all_reduce":
        return sum(x.astype(np.float64) for x in xs).astype(dtype)
    if coll == "reduce":
        return sum(x.astype(np.float64) for x in xs).astype(dtype) if rank == 0 else None
    if coll == "broadcast":
        return xs[0]
    if coll in ("all_gather", "gather"):
        return np.concatenate(xs) if (coll == "all_gather" or rank == 0) else None
    if coll == "reduce_scatter":
        c = nelem // n
        return sum(x.astype(np.float64) for x in xs).astype(dtype)[rank * c:(rank + 1) * c]
    if coll == "scatter":
        c = nelem // n
        return xs[0][rank * c:(rank + 1) * c]
    if coll == "all_to_all":
        c = nelem // n
        return np.concatenate([xs[r][rank * c:(rank + 1) * c] for r in range(n)])
    return None


def _call(comm: Any, coll: str, x: np.ndarray, out: np.ndarray | None, op: str) -> np.ndarray:
    if coll == "all_reduce":
        comm.all_reduce(x, op)
        return x
    if coll == "broadcast":
        comm.broadcast(x, 0)
        return x
    if coll == "reduce":
        comm.reduce(x, 0, op)
        return x
    if coll == "all_gather":
        return comm.all_gather(x, out=out)
    if coll == "gather":
        return comm.gather(x, 0, out=out)
    if coll == "reduce_scatter":
        return comm.reduce_scatter(x, op, out=out)
    if coll == "scatter":
        return comm.scatter(x, 0, out=out)
    if coll == "all_to_all":
        return comm.all_to_all(x, out=out)
    raise InvalidArgument(f"unknown collective {coll!r}", f"use one of {', '.join(COLLECTIVES)}")


def bench_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a supported element type name (bfloat16 from ml_dtypes)."""
    from .call.ops import BFLOAT16
    if name == "bfloat16":
        if BFLOAT16 is None:  # pragma: no cover
            raise InvalidArgument("bfloat16 needs ml_dtypes", "pip install ml_dtypes")
        return BFLOAT16
    return np.dtype(name)


def row_elements(coll: str, nbytes: int, itemsize: int, nranks: int) -> int:
    """Elements of a row of `nbytes` (per-rank collectives: a multiple of the rank count; 0: the row is skipped)."""
    nelem = nbytes // itemsize
    if coll in ("all_gather", "gather", "reduce_scatter", "scatter", "all_to_all"):
        nelem -= nelem % nranks
    return nelem


def _bench_row(comm: Any, spec: dict, coll: str, nbytes: int, dtype: np.dtype, timer: np.ndarray, passes: int,
               check: bool) -> dict | None:
    """One row's share of samples (`samples_s`, seconds per call) and its description; None where the
    size holds no element per rank."""
    n, rank = comm.size, comm.rank
    nelem = row_elements(coll, nbytes, dtype.itemsize, n)
    if nelem == 0:
        return None
    op = spec["op"] if coll in REDUCTIONS else None
    x, out = _fill(comm, coll, nelem, dtype, spec["alloc"])
    x0 = x.copy()
    x[...] = x0

    def slowest(seconds: float) -> float:
        timer[0] = seconds
        comm.all_reduce(timer, "max")
        return float(timer[0])

    ran: list[Any] = [None]  # the schedule the timed calls ran (not the timer's all-reduce)

    def call() -> None:
        _call(comm, coll, x, out, op or "sum")
        ran[0] = getattr(comm, "last_schedule", None)

    with np.errstate(all="ignore"):  # values are not reset between calls: they may overflow
        times = call_samples_s(call, comm.barrier, slowest, warmup=spec["warmup"],
                               iters=spec["iters"], share=passes)
    wrong = 0
    if spec["check"] and check:
        x[...] = x0
        res = _call(comm, coll, x, out, op or "sum")
        in_n = x0.size
        exp = _expected(coll, n, rank, nelem, dtype, lambda r: ((np.arange(in_n) % 97) + r + 1).astype(dtype))
        if exp is not None:
            wrong = int(np.count_nonzero(res.reshape(-1) != exp.reshape(-1)))
        w = np.array([wrong], np.int64)
        comm.all_reduce(w)
        wrong = int(w[0])
    return {"collective": coll, "nranks": n, "size_bytes": nelem * dtype.itemsize, "count": nelem,
            "dtype": str(dtype), "redop": op or "none", "root": 0 if coll in ROOTED else -1, "samples_s": times,
            "wrong": wrong, "shm": os.environ.get("RINGFLOW_SHM_DISABLE") not in ("1", "true"),
            "algorithm": ran[0].algorithm if ran[0] is not None else (spec.get("algo") or "auto"),
            "nchannels": ran[0].nchannels if ran[0] is not None else 1}


def worker(spec: dict) -> list[dict]:
    """Body of one benchmark rank (run under `ringflow run`); rank 0 returns the rows."""
    import ringflow
    comm = ringflow.init()
    n, rank = comm.size, comm.rank
    dtype = bench_dtype(spec["dtype"])
    rows: list[dict] = []
    timer = np.zeros(1, np.float64)
    passes = max(1, int(spec.get("passes") or 1))
    samples: dict[tuple[str, int], list[float]] = {}
    by_pass: dict[tuple[str, int], list[float]] = {}   # each pass's median (us)
    passes_done = [0]

    def slowest(seconds: float) -> float:
        timer[0] = seconds
        comm.all_reduce(timer, "max")
        return float(timer[0])
    settle(slowest)

    def bench_pass() -> None:
        """Time every row's share of its samples (the last pass also checks the results and adds the rows)."""
        last = passes_done[0] == passes - 1
        for coll in spec["collectives"]:
            for nbytes in spec["sizes"]:
                row = _bench_row(comm, spec, coll, nbytes, dtype, timer, passes, check=last)
                if row is None:
                    continue
                key = (coll, row["size_bytes"])
                mine = row.pop("samples_s")
                got = samples.setdefault(key, [])
                got.extend(mine)
                by_pass.setdefault(key, []).append(1e6 * float(np.median(mine)))
                if last:
                    t = float(np.median(got))
                    algbw = row["size_bytes"] / t / 1e9 if t > 0 else 0.0
                    rows.append({**row, "time_us": t * 1e6, "algbw_GBps": algbw,
                                 "busbw_GBps": algbw * bus_factor(coll, n), "iters": len(got),
                                 "pass_us": by_pass[key]})
        passes_done[0] += 1

    while passes_done[0] < passes:
        bench_pass()
    comm.destroy()
    return rows if rank == 0 else []


def available_memory_bytes() -> int | None:
    """Memory the kernel says new allocations can get without swapping (/proc/meminfo MemAvailable)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_launch(colls: list[str], sizes: list[int], nprocs: int, dtype: str, op: str, algo: str | None,
                 check: bool) -> None:
    """Every argument a benchmark's ranks would reject, rejected here before any rank starts."""
    from ..algorithms.tuner import parse_algo_spec
    from .call.ops import SUPPORTED_DTYPES, parse_op
    if nprocs < 1:
        raise InvalidArgument(f"{nprocs} ranks", "run at least 1 rank (-n 1 or more)")
    if dtype not in SUPPORTED_DTYPES:
        raise InvalidArgument(f"dtype {dtype!r} is not supported", f"use one of {', '.join(SUPPORTED_DTYPES)}")
    if any(c in REDUCTIONS for c in colls):
        parse_op(op)
    if algo:
        for c in colls:
            parse_algo_spec(algo, c)
    if not sizes:
        raise InvalidArgument("no message size to run", "give --min <= --max")
    itemsize = bench_dtype(dtype).itemsize
    if not any(row_elements(c, s, itemsize, nprocs) for c in colls for s in sizes):
        raise InvalidArgument(f"no size up to {format_size(max(sizes))} holds an element of {dtype} per rank of "
                              f"{', '.join(colls)} on {nprocs} ranks",
                              f"give --max of at least {format_size(nprocs * itemsize)}")
    # each rank holds its input, its output and a copy of the input; --check also builds every rank's input and
    # the reference in float64 (about 2n + 2 more buffers of the message)
    need = nprocs * max(sizes) * (3 + (2 * nprocs + 2 if check else 0))
    avail = available_memory_bytes()
    if avail is not None and need > avail:
        raise InvalidArgument(f"a benchmark up to {format_size(max(sizes))} on {nprocs} ranks needs about "
                              f"{format_size(need)} of memory; {format_size(avail)} is available",
                              "lower --max" + (" or drop --check" if check else ""))


def launch(collective: str, nprocs: int, min_size: str | int, max_size: str | int, *, factor: int = 2,
           algo: str | None = None, dtype: str = "float32", op: str = "sum", iters: int = 0, warmup: int = WARMUP_CALLS,
           check: bool = False, alloc: bool = False, timeout_s: float = 600.0,
           extra_env: dict[str, str] | None = None, sizes: list[int] | None = None, passes: int = 1) -> list[dict]:
    """Run the benchmark on `nprocs` local ranks; the rows (as in --json).

    `collective` is one name, a comma list, or 'all'; `sizes` (bytes) overrides min/max/factor.
    `passes` > 1: every row's samples are split over that many sweeps of all rows (a burst of host noise
    meets one pass of a row, not all of its samples), and its time is the median of them all.
    """
    if passes < 1:
        raise InvalidArgument(f"passes must be at least 1, got {passes}", "pass --passes 1 or more")
    colls = list(COLLECTIVES) if collective == "all" else [c.strip().replace("-", "_")
                                                          for c in collective.split(",") if c.strip()]
    for c in colls:
        if c not in COLLECTIVES:
            raise InvalidArgument(f"unknown collective {c!r}", f"use one of {', '.join(COLLECTIVES)} or all")
    if sizes is None:
        sizes = size_range(max(1, parse_size(min_size)), parse_size(max_size), factor)
    check_launch(colls, sizes, nprocs, dtype, op, algo, check)
    spec = {"collectives": colls, "sizes": sizes, "dtype": dtype, "op": op, "iters": iters, "warmup": warmup,
            "check": check, "alloc": alloc, "algo": algo, "passes": passes}
    env = dict(os.environ)
    if algo:
        env["RINGFLOW_ALGO"] = algo
    env.update(extra_env or {})
    return run_rank_job("ringflow.runtime.bench", nprocs, spec, env=env, timeout_s=timeout_s, what="benchmark ranks")


def run_rank_job(module: str, nranks: int, spec: dict, *, env: dict[str, str] | None = None,
                 timeout_s: float = 600.0, what: str = "ranks") -> Any:
    """Run `module` on `nranks` local ranks (`ringflow run -m module SPEC OUT`): its ranks read the JSON `spec`
    and one of them writes its rows to OUT; those rows. `what` names the ranks in the error if they fail."""
    with tempfile.TemporaryDirectory(prefix="ringflow-job-") as tmp:
        spec_path, out_path = os.path.join(tmp, "spec.json"), os.path.join(tmp, "rows.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        cmd = [sys.executable, "-m", "ringflow", "run", "-n", str(nranks), "--timeout", str(timeout_s),
               "-m", module, spec_path, out_path]
        proc = subprocess.run(cmd, env=dict(os.environ) if env is None else env, timeout=timeout_s + 30)
        if proc.returncode != 0:
            raise RingflowSystemError(f"{what} failed (exit code {proc.returncode})", "see the rank output above")
        with open(out_path) as fh:
            return json.load(fh)


def rank_job_main(measure: Callable[[Any, dict], list], argv: list[str]) -> None:
    """A rank of `run_rank_job`: join the job, `measure(comm, spec)`, and rank 0 writes the rows."""
    import ringflow
    with open(argv[0]) as fh:
        spec = json.load(fh)
    comm = ringflow.init()
    rows = measure(comm, spec)
    rank = comm.rank
    comm.destroy()
    if rank == 0:
        with open(argv[1], "w") as fh:
            json.dump(rows, fh)


def print_rows(rows: list[dict]) -> None:
    """The nccl-tests table."""
    from ..tables import print_table
    by: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        by.setdefault((r["collective"], r["nranks"]), []).append(r)
    for (coll, n), rs in by.items():
        print_table(f"{coll}, {n} ranks", ["size", "count", "type", "redop", "root", "time (us)", "algbw (GB/s)",
                                            "busbw (GB/s)", "#wrong"],
                    [[format_size(r["size_bytes"]), r["count"], r["dtype"], r["redop"], r["root"],
                      f"{r['time_us']:.1f}", f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}", r["wrong"]]
                     for r in rs])


def _main(argv: list[str]) -> None:
    with open(argv[0]) as fh:
        spec = json.load(fh)
    rows = worker(spec)
    if rows:
        with open(argv[1], "w") as fh:
            json.dump(rows, fh)


if __name__ == "__main__":
    _main(sys.argv[1:])
