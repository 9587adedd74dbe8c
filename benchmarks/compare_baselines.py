#!/usr/bin/env python3
"""ringflow vs torch.distributed (Gloo) vs mpi4py over Open MPI, same sizes, same ranks, one table.

    .venv/bin/python benchmarks/compare_baselines.py --nranks 2,4 --json results.json

Every library is timed the same way (ringflow.runtime.bench): per size, warm-up calls, then
samples; a sample is a barrier and as many back-to-back calls as take 1 ms; its time is the slowest
rank's time per call (max all-reduce); the row shows the median sample. Bus bandwidth uses nccl-tests' factors.

Bounds printed beside the table (derived here, from measurements taken in the same run):

* ``copy_GBps``: bytes one core copies per second (np.copyto of 64 MiB, best of 7).
* memory-bandwidth limit of a shared-memory all-reduce: every byte nccl-tests' busbw counts for a
  rank (2(n-1)/n x size) is a byte that rank must take in from another rank, and taking a byte in
  costs at least one copy's worth of memory traffic (read it, write it or a sum of it) on some
  core; n ranks share `cores` cores, each moving ``copy_GBps``. So
  ``limit = copy_GBps x min(1, cores / nranks)``: a true upper bound for any design, zero-copy
  included (the issue's "several GB/s" for 2 ranks; measured here in the same run).
* loopback-TCP limit for a ring: n processes each stream the bytes a ring all-reduce moves per
  rank (2(n-1)/n x size) to the next rank over loopback sockets while receiving the same from the
  previous (no reduction; 1, 2 or 4 streams per neighbour; 20 messages streamed back to back after a
  warm-up one by one thread per rank on non-blocking sockets set up as ringflow's (buffers, the
  congestion control it picks for same-host peers), time per message; the best of 3 runs):
  ``busbw = bytes per rank / time``.
  Bounds use best-of timings (optimistic limits, strict targets); library rows use medians.

Placement is the same for all three: one core per rank when the ranks fit (`ringflow run`'s
default, ``mpirun --bind-to core``, and the same affinity for the Gloo processes), unbound when
they outnumber the cores. Open MPI and mpi4py are installed by this script if missing
(apt-get openmpi-bin libopenmpi-dev; pip install --target ~/.cache/ringflow-baselines/mpi4py mpi4py). Open MPI runs with
``--mca btl self,vader`` (shared memory) or ``self,tcp`` with ``btl_tcp_if_include lo``; as root it
needs --allow-run-as-root and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1. torch.distributed uses
``init_method=file://`` (a tcp:// store would resolve names).
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ringflow.runtime.bench import bus_factor, median_call_s, settle  # noqa: E402
from ringflow.units import format_size, parse_size  # noqa: E402

MPI_TARGET = Path.home() / ".cache" / "ringflow-baselines" / "mpi4py"
COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


# ------------------------------------------------------------------ shared timing helpers
def _elems(coll: str, nbytes: int, n: int, itemsize: int = 4) -> tuple[int, int]:
    """(input elements, output elements) for a collective whose nccl-tests size is nbytes."""
    e = nbytes // itemsize
    if coll in ("all_gather",):
        e -= e % n
        return e // n, e
    if coll in ("reduce_scatter",):
        e -= e % n
        return e, e // n
    if coll == "all_to_all":
        e -= e % n
        return e, e
    return e, e


def _median_time_s(call: Callable[[], None], nbytes: int, quick: bool, barrier: Callable[[], None],
                   clock: Callable[[], float], slowest: Callable[[float], float]) -> float:
    """The timing loop of `ringflow bench` (median_call_s), for a baseline library's calls."""
    return median_call_s(call, barrier, slowest, quick=quick, clock=clock)[0]


def gloo_worker(spec: dict, rank: int, n: int, init_file: str, out: str) -> None:
    """One torch.distributed Gloo rank."""
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=n)
    rows = []
    t = torch.zeros(1, dtype=torch.float64)

    def slowest(seconds: float) -> float:
        t[0] = seconds
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t[0])
    settle(slowest)
    for coll in spec["collectives"]:
        for nbytes in spec["sizes"]:
            ein, eout = _elems(coll, nbytes, n)
            if ein == 0:
                continue
            x = torch.ones(ein, dtype=torch.float32)
            y = torch.empty(eout, dtype=torch.float32)

            def call(coll: str = coll, x: torch.Tensor = x, y: torch.Tensor = y) -> None:
                if coll == "all_reduce":
                    dist.all_reduce(x)
                elif coll == "broadcast":
                    dist.broadcast(x, 0)
                elif coll == "all_gather":   # torch 2.13 names; *_tensor are deprecated aliases
                    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(y, x)
                elif coll == "reduce_scatter":
                    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(y, x)
                elif coll == "all_to_all":
                    dist.all_to_all_single(y, x)
            try:
                rows.append(_row("gloo", coll, n, nbytes, _median_time_s(call, nbytes, spec["quick"], dist.barrier,
                                                                         time.perf_counter, slowest)))
            except (RuntimeError, ValueError) as exc:
                rows.append({"library": "gloo", "collective": coll, "nranks": n, "size_bytes": nbytes,
                             "error": str(exc).splitlines()[0][:120]})
                dist.barrier()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(rows, fh)
    dist.destroy_process_group()


def _row(lib: str, coll: str, n: int, nbytes: int, t: float) -> dict:
    algbw = nbytes / t / 1e9
    return {"library": lib, "collective": coll, "nranks": n, "size_bytes": nbytes, "time_us": t * 1e6,
            "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(coll, n)}


def run_gloo(spec: dict, n: int, timeout_s: float) -> list[dict]:
    """Start n Gloo ranks on this host."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: Gloo column skipped", file=sys.stderr)
        return []
    with tempfile.TemporaryDirectory(prefix="rf-gloo-") as tmp:
        spec_path, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "rows.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        init = os.path.join(tmp, "init")
        from ringflow.runtime.job.launcher import binding
        cores = binding(n)  # the same one-core-per-rank placement ringflow run and mpirun use
        procs = [subprocess.Popen([sys.executable, __file__, "--gloo-worker", spec_path, str(r), str(n), init, out],
                                  preexec_fn=None if cores is None else (lambda c=cores[r]: os.sched_setaffinity(0, c)))
                 for r in range(n)]
        try:
            for p in procs:
                p.wait(timeout=timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if not os.path.exists(out):
            print("Gloo run failed", file=sys.stderr)
            return []
        with open(out) as fh:
            return json.load(fh)


# ------------------------------------------------------------------ MPI worker
def mpi_worker(spec: dict, out: str, label: str) -> None:
    """One mpi4py rank (under mpirun)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    rows = []
    t = np.zeros(1)
    tmax = np.zeros(1)

    def slowest(seconds: float) -> float:
        t[0] = seconds
        comm.Allreduce(t, tmax, op=MPI.MAX)
        return float(tmax[0])
    settle(slowest)   # as ringflow's own benchmark: the job-start transient passes before the first row
    for coll in spec["collectives"]:
        for nbytes in spec["sizes"]:
            ein, eout = _elems(coll, nbytes, n)
            if ein == 0:
                continue
            x = np.ones(ein, np.float32)
            y = np.empty(eout, np.float32)

            def call(coll: str = coll, x: np.ndarray = x, y: np.ndarray = y) -> None:
                if coll == "all_reduce":
                    comm.Allreduce(MPI.IN_PLACE, x)
                elif coll == "broadcast":
                    comm.Bcast(x, 0)
                elif coll == "all_gather":
                    comm.Allgather(x, y)
                elif coll == "reduce_scatter":
                    comm.Reduce_scatter_block(x, y)
                elif coll == "all_to_all":
                    comm.Alltoall(x, y)
            rows.append(_row(label, coll, n, nbytes, _median_time_s(call, nbytes, spec["quick"], comm.Barrier,
                                                                    MPI.Wtime, slowest)))
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(rows, fh)


def ensure_mpi() -> bool:
    """Install Open MPI (apt) and mpi4py (pip --target) if missing; True when usable."""
    if shutil.which("mpirun") is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            print("installing Open MPI (apt-get install openmpi-bin libopenmpi-dev) ...", file=sys.stderr)
            subprocess.run(["apt-get", "update", "-qq"], check=False)
            subprocess.run(["apt-get", "install", "-y", "-qq", "openmpi-bin", "libopenmpi-dev"], check=False,
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if shutil.which("mpirun") is None:
            print("Open MPI is not available: MPI column skipped", file=sys.stderr)
            return False
    probe = subprocess.run([sys.executable, "-c", "import mpi4py"], env=_mpi_env(), capture_output=True)
    if probe.returncode != 0:
        print(f"installing mpi4py into {MPI_TARGET} ...", file=sys.stderr)
        MPI_TARGET.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(MPI_TARGET), "mpi4py"],
                       check=False)
        probe = subprocess.run([sys.executable, "-c", "import mpi4py"], env=_mpi_env(), capture_output=True)
    if probe.returncode != 0:
        print("mpi4py could not be installed: MPI column skipped", file=sys.stderr)
        return False
    return True


def _mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(MPI_TARGET), str(ROOT), env.get("PYTHONPATH", "")])
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def run_mpi(spec: dict, n: int, tcp: bool, timeout_s: float) -> list[dict]:
    """mpirun n mpi4py ranks over shared memory (vader) or loopback TCP."""
    with tempfile.TemporaryDirectory(prefix="rf-mpi-") as tmp:
        spec_path, out = os.path.join(tmp, "spec.json"), os.path.join(tmp, "rows.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        btl = ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"] if tcp else \
            ["--mca", "btl", "self,vader"]
        fits = n <= len(os.sched_getaffinity(0))
        cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "core" if fits else "none"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += [*btl, "--mca", "pml", "ob1", sys.executable, __file__, "--mpi-worker", spec_path, out,
                "openmpi-tcp" if tcp else "openmpi"]
        proc = subprocess.run(cmd, env=_mpi_env(), capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0 or not os.path.exists(out):
            print(f"mpirun failed ({proc.returncode}): {proc.stderr[-1500:]}", file=sys.stderr)
            return []
        with open(out) as fh:
            return json.load(fh)


# ------------------------------------------------------------------ ringflow
def run_ringflow(spec: dict, n: int, tcp: bool, timeout_s: float, log_rounds: bool = False) -> list[dict]:
    """ringflow's own benchmark on n ranks (shared memory, or TCP over loopback only; `log_rounds`: under the
    log-depth argument check, RINGFLOW_CHECK_ROUNDS=log)."""
    from ringflow.runtime.bench import launch
    extra = {"RINGFLOW_SHM_DISABLE": "1", "RINGFLOW_SOCKET_IFNAME": "=lo"} if tcp else {}
    if log_rounds:
        extra["RINGFLOW_CHECK_ROUNDS"] = "log"
    got = launch(",".join(spec["collectives"]), n, 0, 0, sizes=spec["sizes"], iters=4 if spec["quick"] else 0,
                 timeout_s=timeout_s, extra_env=extra, algo=spec.get("algo"))
    lib = "ringflow-tcp" if tcp else "ringflow-log" if log_rounds else "ringflow"
    return [_row(lib, r["collective"], n, r["size_bytes"], r["time_us"] / 1e6)
            | {"algorithm": r.get("algorithm")} for r in got]


# ------------------------------------------------------------------ bounds
def copy_rate_GBps(nbytes: int = 64 * 2**20) -> float:
    """Bytes one core copies per second (np.copyto, best of 7: an optimistic rate makes a strict bound)."""
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    np.copyto(b, a)
    ts = []
    for _ in range(7):
        t0 = time.perf_counter()
        np.copyto(b, a)
        ts.append(time.perf_counter() - t0)
    return nbytes / float(min(ts)) / 1e9


def shm_allreduce_limit_GBps(copy_GBps: float, n: int, cores: int) -> float:
    """busbw upper bound of a shared-memory all-reduce: one copy per busbw byte (module docstring)."""
    return copy_GBps * min(1.0, cores / n)


RING_ITERS = 20   # messages the raw loopback ring streams back to back (after one warm-up message)
RING_REPEATS = 3  # runs of it per stream count, the best counted (loopback TCP varies from run to run)


def _tcp_ring_rank(rank: int, n: int, port_base: int, nbytes: int, iters: int, streams: int, q) -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port_base + rank))
    srv.listen(streams)
    time.sleep(0.3)
    outs = [socket.create_connection(("127.0.0.1", port_base + (rank + 1) % n)) for _ in range(streams)]
    inns = [srv.accept()[0] for _ in range(streams)]
    from ringflow.runtime.transport.tcp import tune_socket
    for s in outs + inns:   # as ringflow's own sockets: buffers, no Nagle, a congestion control that does not pace
        tune_socket(s, None, "127.0.0.1")
    part = max(1, nbytes // streams)   # a receive of 0 bytes would wait for a readable socket forever
    src = np.ones(part * streams, np.uint8)
    dst = np.empty(part * streams, np.uint8)
    for sock in outs + inns:
        sock.setblocking(False)

    def stream(messages: int) -> None:
        """Send `messages` x part bytes on every outgoing stream while receiving as many on every incoming one,
        in this one thread (non-blocking sockets, a selector: no threads to schedule, no GIL to share)."""
        total = messages * part
        sent, got = [0] * streams, [0] * streams
        sel = selectors.DefaultSelector()
        for j, sock in enumerate(outs):
            sel.register(sock, selectors.EVENT_WRITE, ("out", j))
        for j, sock in enumerate(inns):
            sel.register(sock, selectors.EVENT_READ, ("in", j))
        left = 2 * streams
        while left:
            for key, _ in sel.select():
                side, j = key.data
                sock = key.fileobj
                if side == "out":
                    at = sent[j] % part
                    try:
                        sent[j] += sock.send(memoryview(src)[j * part + at:(j + 1) * part])   # what the kernel takes
                    except BlockingIOError:
                        continue
                    done = sent[j] >= total
                else:
                    at = got[j] % part
                    try:
                        got[j] += sock.recv_into(memoryview(dst)[j * part + at:(j + 1) * part])
                    except BlockingIOError:
                        continue
                    done = got[j] >= total
                if done:
                    sel.unregister(sock)
                    left -= 1
        sel.close()

    stream(1)   # warm-up: connections, socket buffers, pages
    t0 = time.perf_counter()
    stream(iters)
    q.put((rank, (time.perf_counter() - t0) / iters))


def tcp_ring_limit_GBps(n: int, size_bytes: int) -> float:
    """busbw a ring of n processes reaches moving raw bytes over loopback TCP (no reduction): the best
    of RING_REPEATS runs with 1, 2 and 4 streams per neighbour, RING_ITERS messages streamed back to back each."""
    import multiprocessing as mp
    per_rank = int(size_bytes * 2 * (n - 1) / n)
    best = 0.0
    runs = [streams for _ in range(RING_REPEATS) for streams in (1, 2, 4)]
    for k, streams in enumerate(runs):
        port_base = 29800 + (os.getpid() % 50) * len(runs) * n + k * n
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        ps = [ctx.Process(target=_tcp_ring_rank, args=(r, n, port_base, per_rank, RING_ITERS, streams, q))
              for r in range(n)]
        for p in ps:
            p.start()
        res = [q.get(timeout=120) for _ in ps]
        for p in ps:
            p.join(timeout=10)
        best = max(best, per_rank / max(v for _, v in res) / 1e9)
    return best


# ------------------------------------------------------------------ table
def median_rounds(rows: list[dict]) -> list[dict]:
    """One row per (library, collective, ranks, size): the round with the median time, and every
    round's time (`round_times_us`) so the run-to-run spread is on record."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["library"], r["collective"], r["nranks"], r["size_bytes"]), []).append(r)
    out = []
    for rs in groups.values():
        ok = sorted((r for r in rs if "error" not in r), key=lambda r: r["time_us"])
        if not ok:
            out.append(rs[0])
            continue
        out.append(dict(ok[(len(ok) - 1) // 2], round_times_us=[r["time_us"] for r in rs if "error" not in r]))
    return out


def print_table(rows: list[dict], bounds: dict) -> None:
    """One table: time / busbw per library, ratios of ringflow to each baseline."""
    libs = ["ringflow", "ringflow-log", "openmpi", "gloo", "ringflow-tcp", "openmpi-tcp"]
    key = {}
    for r in rows:
        if "error" not in r:
            key[(r["collective"], r["nranks"], r["size_bytes"], r["library"])] = r
    combos = sorted({(r["collective"], r["nranks"], r["size_bytes"]) for r in rows},
                    key=lambda c: (c[1], COLLS.index(c[0]) if c[0] in COLLS else 9, c[2]))
    present = [lib for lib in libs if any(k[3] == lib for k in key)]
    head = f"{'collective':<15}{'n':>2} {'size':>7} " + "".join(f"{lib + ' us':>17}{'busbw':>8}" for lib in present)
    head += f"{'rf/mpi':>8}{'log/mpi':>8}{'rf/gloo':>8}{'tcp/mpi':>8}"
    print(head)
    print("-" * len(head))
    for coll, n, size in combos:
        line = f"{coll:<15}{n:>2} {format_size(size):>7} "
        for lib in present:
            r = key.get((coll, n, size, lib))
            line += f"{r['time_us']:>17.1f}{r['busbw_GBps']:>8.3f}" if r else f"{'n/a':>17}{'':>8}"

        def ratio(a: str, b: str, coll: str = coll, n: int = n, size: int = size) -> str:
            ra, rb = key.get((coll, n, size, a)), key.get((coll, n, size, b))
            return f"{rb['time_us'] / ra['time_us']:>8.2f}" if ra and rb else f"{'':>8}"
        line += ratio("ringflow", "openmpi") + ratio("ringflow-log", "openmpi") + ratio("ringflow", "gloo") + \
            ratio("ringflow-tcp", "openmpi-tcp")
        print(line)
    print("ratios are speed-ups (baseline time / ringflow time; > 1 means ringflow is faster)")
    print(f"copy rate of one core: {bounds['copy_GBps']:.2f} GB/s; cores: {bounds['cores']}")
    for n, v in bounds["shm_allreduce_limit_GBps"].items():
        print(f"  {n} ranks: shm all-reduce busbw limit = {bounds['copy_GBps']:.2f} x "
              f"min(1, {bounds['cores']}/{n}) = {v:.2f} GB/s (one copy per busbw byte)")
    for n, v in bounds.get("tcp_ring_limit_GBps", {}).items():
        print(f"  {n} ranks: loopback-TCP ring limit (raw bytes of a ring all-reduce) = {v:.2f} GB/s")


def speedups(rf: dict, base: dict) -> list[float]:
    """Per round, the baseline's time over ringflow's (round k against round k: they ran side by side)."""
    return [tb / ta for ta, tb in zip(rf.get("round_times_us", []), base.get("round_times_us", []),
                                          strict=False)]  # a row without rounds gives none


# the runtime's targets, per rank count: 8 B all-reduce and broadcast within this factor of Open MPI's time;
# every collective at the medium sizes and at the largest size at least as fast as Open MPI; the largest all-reduce
# this much faster and at this fraction of the memory-bandwidth limit
SMALL_WITHIN = 1.5
SMALL_COLLS = ("all_reduce", "broadcast")
MEDIUM_SIZES = (64 * 1024, 2**20)
BIG_ALL_REDUCE_SPEEDUP = 2.5
BIG_OTHER_SPEEDUP = 1.0
BIG_MEMORY_FRACTION = 0.6


def targets(rows: list[dict], bounds: dict, big: int) -> list[dict]:
    """The performance targets, evaluated on this run's rows (speed-up = baseline time / ringflow time)."""
    idx = {(r["library"], r["collective"], r["nranks"], r["size_bytes"]): r for r in rows if "error" not in r}
    out = []

    def vs(lib: str, c: str, n: int, size: int, need: float, what: str) -> None:
        a, b = idx.get(("ringflow", c, n, size)), idx.get((lib, c, n, size))
        if a and b:
            out.append({"target": what, "nranks": n, "value": b["time_us"] / a["time_us"], "need": need,
                        "per_round": speedups(a, b)})

    for n in sorted({r["nranks"] for r in rows}):
        for c in SMALL_COLLS:
            vs("openmpi", c, n, 8, 1 / SMALL_WITHIN, f"{c} 8B within {SMALL_WITHIN:g}x Open MPI's time")
        for size in MEDIUM_SIZES:
            for c in COLLS:
                vs("openmpi", c, n, size, 1.0, f"{c} {format_size(size)} >= Open MPI")
        if big > max(MEDIUM_SIZES):   # the large-message targets need a large message in the run
            need = BIG_ALL_REDUCE_SPEEDUP
            vs("openmpi", "all_reduce", n, big, need, f"all_reduce {format_size(big)} >= {need:g}x Open MPI")
            for c in COLLS[1:]:
                vs("openmpi", c, n, big, BIG_OTHER_SPEEDUP,
                   f"{c} {format_size(big)} >= {BIG_OTHER_SPEEDUP:g}x Open MPI")
        for c, size in sorted({(r["collective"], r["size_bytes"]) for r in rows if r["nranks"] == n}):
            vs("gloo", c, n, size, 1.0, f"{c} {format_size(size)} faster than Gloo")
        rf = idx.get(("ringflow", "all_reduce", n, big))
        lim = bounds["shm_allreduce_limit_GBps"].get(str(n))
        if rf and lim and big > max(MEDIUM_SIZES):
            out.append({"target": f"all_reduce {format_size(big)} busbw as a fraction of the memory limit",
                        "nranks": n, "value": rf["busbw_GBps"] / lim, "need": BIG_MEMORY_FRACTION})
        tcp = idx.get(("ringflow-tcp", "all_reduce", n, big))
        tl = bounds.get("tcp_ring_limit_GBps", {}).get(str(n))
        if tcp and tl:
            out.append({"target": f"TCP all_reduce {format_size(big)} >= 70% of the loopback ring limit",
                        "nranks": n, "value": tcp["busbw_GBps"] / tl, "need": 0.7})
    for t in out:
        t["met"] = t["value"] <= t["need"] if t.get("lower_is_better") else t["value"] >= t["need"]
    return out


def plot_times(rows: list[dict], path: str) -> None:
    """Time per call vs message size, one panel per (collective, ranks), a line per library."""
    from ringflow.plotting import pyplot
    plt = pyplot()
    combos = sorted({(r["collective"], r["nranks"]) for r in rows if "error" not in r},
                    key=lambda c: (c[1], COLLS.index(c[0]) if c[0] in COLLS else 9))
    ncol = len(COLLS)
    nrow = max(1, -(-len(combos) // ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.2 * ncol, 2.8 * nrow), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for k, (coll, n) in enumerate(combos):
        ax = axes.flat[k]
        ax.set_visible(True)
        for lib in ("ringflow", "openmpi", "gloo"):
            pts = sorted((r["size_bytes"], r["time_us"]) for r in rows
                         if "error" not in r and r["library"] == lib and r["collective"] == coll and r["nranks"] == n)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=lib)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{coll}, {n} ranks", fontsize=9)
        ax.set_xlabel("bytes", fontsize=8)
        ax.set_ylabel("us per call", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nranks", default="2,4", help="comma list of rank counts")
    ap.add_argument("--sizes", default="8,64KiB,1MiB,64MiB", help="comma list of sizes")
    ap.add_argument("--collectives", default=",".join(COLLS))
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--no-tcp", action="store_true", help="skip the TCP-only comparison")
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--algo", default=None, help="RINGFLOW_ALGO for ringflow")
    ap.add_argument("--log-rounds", action="store_true",
                    help="also time ringflow under the log-depth argument check (RINGFLOW_CHECK_ROUNDS=log)")
    ap.add_argument("--json", default=None, help="write rows, bounds and targets here")
    ap.add_argument("--plot", default=None, help="write time vs size per collective (PNG) here")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--rounds", type=int, default=3,
                    help="ringflow and Open MPI run this many times, interleaved; rows show the median round")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    colls = [c.strip() for c in args.collectives.split(",") if c.strip()]
    ns = [int(v) for v in args.nranks.split(",")]
    spec = {"collectives": colls, "sizes": sizes, "quick": args.quick, "algo": args.algo}
    big = max(sizes)
    cores = len(os.sched_getaffinity(0))
    bounds: dict = {"copy_GBps": copy_rate_GBps(), "cores": cores, "shm_allreduce_limit_GBps": {},
                    "tcp_ring_limit_GBps": {}}
    have_mpi = not args.no_mpi and ensure_mpi()
    rows: list[dict] = []
    rounds = max(1, args.rounds)
    for n in ns:
        bounds["shm_allreduce_limit_GBps"][str(n)] = shm_allreduce_limit_GBps(bounds["copy_GBps"], n, cores)
        tspec = dict(spec, collectives=["all_reduce"], sizes=[big])
        # ringflow and Open MPI alternate, so a drift of the machine's speed hits both alike
        for k in range(rounds):
            tag = f" (round {k + 1}/{rounds})"
            print(f"== {n} ranks: ringflow{tag}", file=sys.stderr)
            rows += run_ringflow(spec, n, False, args.timeout)
            if args.log_rounds and n >= 3:
                print(f"== {n} ranks: ringflow, log-depth check{tag}", file=sys.stderr)
                rows += run_ringflow(spec, n, False, args.timeout, log_rounds=True)
            if have_mpi:
                print(f"== {n} ranks: Open MPI (vader){tag}", file=sys.stderr)
                rows += run_mpi(spec, n, False, args.timeout)
            if not args.no_tcp:
                print(f"== {n} ranks: TCP only (ringflow, Open MPI){tag}", file=sys.stderr)
                rows += run_ringflow(tspec, n, True, args.timeout)
                if have_mpi:
                    rows += run_mpi(tspec, n, True, args.timeout)
        if not args.no_gloo:
            print(f"== {n} ranks: Gloo", file=sys.stderr)
            rows += run_gloo(spec, n, args.timeout)
        if not args.no_tcp:
            print(f"== {n} ranks: raw loopback ring", file=sys.stderr)
            bounds["tcp_ring_limit_GBps"][str(n)] = tcp_ring_limit_GBps(n, big)
    rows = median_rounds(rows)
    print_table(rows, bounds)
    tg = targets(rows, bounds, big)
    for t in tg:
        cmp = "<=" if t.get("lower_is_better") else ">="
        rounds_note = ""
        if len(t.get("per_round", [])) > 1:
            pr = t["per_round"]
            rounds_note = (f"; rounds {' '.join(f'{v:.2f}' for v in pr)}, met in "
                           f"{sum(v >= t['need'] for v in pr)}/{len(pr)}")
        print(f"[{'MET ' if t['met'] else 'MISS'}] {t['nranks']} ranks: {t['target']}: {t['value']:.2f} "
              f"(need {cmp} {t['need']}{rounds_note})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "bounds": bounds, "targets": tg, "host": {"cores": cores}}, fh, indent=2)
    if args.plot:
        plot_times(rows, args.plot)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--gloo-worker":
        with open(sys.argv[2]) as fh:
            gloo_worker(json.load(fh), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    elif len(sys.argv) > 1 and sys.argv[1] == "--mpi-worker":
        with open(sys.argv[2]) as fh:
            mpi_worker(json.load(fh), sys.argv[3], sys.argv[4])
    else:
        sys.exit(main())
