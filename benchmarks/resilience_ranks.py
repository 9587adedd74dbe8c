"""Rank-side programs of the resilience tests and benchmarks: each runs inside a real rank.

    python benchmarks/resilience_ranks.py SCENARIO --out DIR [options]

The rank joins its job from the environment (RINGFLOW_RANK, _WORLD_SIZE, _STORE_ADDR, _SECRET,
_JOB_ID, as `ringflow run` or the tests set them), runs SCENARIO and writes ``DIR/rank<r>.json``.
``DIR/ready<r>`` appears once a looping scenario is in steady state, so the parent knows when to
kill a rank or cut a link *mid-collective*. Times are ``time.monotonic()``, which is one clock
for every process of the host (and of its network namespaces), so the parent can subtract its own
kill time from a rank's detection time.

Scenarios: loop (all-reduce until an error; then shrink and check a new all-reduce), mismatch,
abort, timeout, frames (rank 1 sends hostile frames to rank 0), ifbind, soak, lossbench.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ringflow  # noqa: E402
from ringflow.errors import RemoteError, RingflowError, Timeout  # noqa: E402
from ringflow.runtime import native  # noqa: E402
from ringflow.testing.selftest import reduce_ref, values  # noqa: E402


def err_info(exc: BaseException, t0: float | None = None) -> dict[str, Any]:
    """A JSON-able description of an error (type, named rank, message, seconds since t0)."""
    d: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc), "t": time.monotonic()}
    if isinstance(exc, RemoteError):
        d["rank"] = exc.rank
    elif isinstance(exc, Timeout):
        import re
        missing = str(exc).split("ranks not in call", 1)[-1]   # the ranks that had not entered the call
        named = (re.search(r"rank (\d+) did not answer", missing) or re.search(r"rank (\d+) is ", missing)
                 or re.search(r"waiting for ranks \[(\d+)", str(exc)))
        d["rank"] = int(named.group(1)) if named else None
    if t0 is not None:
        d["elapsed_s"] = d["t"] - t0
    return d


def expect(fn: Callable[[], Any], t0: float | None = None) -> dict[str, Any]:
    """Run fn, which should raise a ringflow error; its description (type 'none' if it did not raise)."""
    t = time.monotonic() if t0 is None else t0
    try:
        fn()
    except RingflowError as exc:
        return err_info(exc, t)
    return {"type": "none", "elapsed_s": time.monotonic() - t}


def proc_usage() -> dict[str, int]:
    """This process's resident memory (KiB), open file descriptors and threads, from /proc."""
    rss_kib = threads = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss_kib": rss_kib, "fds": len(os.listdir("/proc/self/fd")), "threads": threads}


def checked_all_reduce(comm: Any, count: int, salt: int, dtype: str = "float32") -> bool:
    """One all-reduce of values unique per rank and element; True if the result is exact."""
    n = comm.size
    x = values(comm.rank, n, count, dtype, "sum", salt)
    comm.all_reduce(x)
    want = reduce_ref([values(q, n, count, dtype, "sum", salt) for q in range(n)], "sum")
    return bool(np.array_equal(x, want))


class Rank:
    """Output directory handling for one rank."""

    def __init__(self, out: str, rank: int) -> None:
        self.out, self.rank = Path(out), rank
        self.out.mkdir(parents=True, exist_ok=True)

    def ready(self) -> None:
        (self.out / f"ready{self.rank}").write_text(json.dumps({"t": time.monotonic(), "pid": os.getpid(),
                                                                 "job": os.environ.get("RINGFLOW_JOB_ID", "")}))

    def write(self, result: dict[str, Any]) -> None:
        tmp = self.out / f".rank{self.rank}.json"
        tmp.write_text(json.dumps(result))
        tmp.rename(self.out / f"rank{self.rank}.json")


# ---------------------------------------------------------------------------- scenarios
def scenario_loop(a: argparse.Namespace) -> dict[str, Any]:
    """All-reduce (checked) until an error; then shrink and run a checked all-reduce on the survivors."""
    comm = ringflow.init(timeout=a.timeout)
    rk = Rank(a.out, comm.rank)
    n = comm.size
    refs = [reduce_ref([values(q, n, a.count, "float32", "sum", s) for q in range(n)], "sum") for s in range(3)]
    mine = [values(comm.rank, n, a.count, "float32", "sum", s) for s in range(3)]
    x = comm.alloc(a.count, np.float32) if a.alloc else np.empty(a.count, np.float32)
    res: dict[str, Any] = {"rank": comm.rank, "size": n, "iterations": 0, "wrong": 0, "pid": os.getpid()}
    if a.orphan and comm.rank == 1:  # a message rank 0 never receives: its segment is never mapped
        comm.isend(np.ones(1 << 14, np.float32), 0, tag=77).wait(timeout=a.timeout)
    end = time.monotonic() + a.max_s
    leave: list[int] = []
    if a.depart_on_signal:
        import signal
        signal.signal(signal.SIGUSR2, lambda *_: leave.append(1))
    try:
        while time.monotonic() < end:
            s = res["iterations"] % 3
            x[:] = mine[s]
            comm.all_reduce(x)
            res["wrong"] += int(not np.array_equal(x, refs[s]))
            res["iterations"] += 1
            if res["iterations"] == a.warm:
                rk.ready()
            if leave:
                res["departed_t"] = time.monotonic()
                comm.destroy()
                rk.write(res)
                return res
        res["error"] = None
    except RingflowError as exc:
        res["error"] = err_info(exc)
        res["error"]["in_call"] = "all_reduce"
    res["native_runs"] = native.hot_stats()["runs"]
    if res["error"] is not None and a.shrink:
        t0 = time.monotonic()
        try:
            new = comm.shrink(timeout=a.timeout)
            res["shrink_s"] = time.monotonic() - t0
            res["new_rank"], res["new_size"] = new.rank, new.size
            res["parent_ranks"] = list(new.parent_ranks)
            res["after_shrink_ok"] = all(checked_all_reduce(new, c, 5) for c in (1, 1000, a.count))
            new.destroy()
        except RingflowError as exc:
            res["shrink_error"] = err_info(exc, t0)
    elif res["error"] is None:
        comm.destroy()
    rk.write(res)
    return res


def scenario_mismatch(a: argparse.Namespace) -> dict[str, Any]:
    """The last rank passes a different count / dtype / root; every rank must raise InvalidArgument."""
    comm = ringflow.init(timeout=a.timeout)
    n, r = comm.size, comm.rank
    odd = r == n - 1
    cases: list[tuple[str, Callable[[], Any], np.ndarray]] = []

    def add(name: str, buf: np.ndarray, call: Callable[[np.ndarray], Any]) -> None:
        buf[...] = np.arange(buf.size).reshape(buf.shape) % 100 + 7  # sentinel contents
        cases.append((name, lambda: call(buf), buf))

    for count in (8, 1 << 18):  # a one-shot (self-checking) size and a ring size with its CHECK exchange
        add(f"all_reduce count {count} vs {count + 1}", np.empty(count + int(odd), np.float32),
            lambda b: comm.all_reduce(b))
        add(f"all_reduce float32 vs int32 ({count} elements: equal bytes)",
            np.empty(count, np.int32 if odd else np.float32), lambda b: comm.all_reduce(b))
        add(f"all_reduce float32 vs float64 ({count} elements)", np.empty(count, np.float64 if odd else np.float32),
            lambda b: comm.all_reduce(b))
        add(f"broadcast root 0 vs 1 ({count} elements)", np.empty(count, np.float32),
            lambda b: comm.broadcast(b, root=1 if odd else 0))
    out = np.full((8 + int(odd)) * n, -1, np.float32)  # each rank's call is locally consistent
    add("all_gather count 8 vs 9", np.empty(8 + int(odd), np.float32), lambda b: comm.all_gather(b, out=out))
    res: dict[str, Any] = {"rank": r, "cases": []}
    for name, fn, buf in cases:
        before = buf.copy()
        info = expect(fn)
        info.update(case=name, unchanged=bool(np.array_equal(before, buf)))
        res["cases"].append(info)
    res["all_gather_out_unchanged"] = bool((out == -1).all())
    res["usable_after"] = checked_all_reduce(comm, 1000, 2) and checked_all_reduce(comm, 1 << 18, 3)
    comm.destroy()
    Rank(a.out, r).write(res)
    return res


def scenario_abort(a: argparse.Namespace) -> dict[str, Any]:
    """Rank 0's all-reduce waits for rank 1 (which is late); another thread aborts; then both shrink."""
    comm = ringflow.init(timeout=a.timeout)
    r = comm.rank
    res: dict[str, Any] = {"rank": r}
    x = np.ones(1 << 16, np.float32)
    for _ in range(3):  # the same call made before: the waiting call below runs on the native executor if built
        x[:] = 1
        comm.all_reduce(x)
    x[:] = 1
    res["native_runs"] = native.hot_stats()["runs"]
    if r == 0:
        t_abort: list[float] = []

        def later() -> None:
            time.sleep(a.delay_s)
            t_abort.append(time.monotonic())
            comm.abort()
        threading.Thread(target=later, daemon=True).start()
        info = expect(lambda: comm.all_reduce(x))
        info["after_abort_s"] = info["t"] - t_abort[0] if t_abort else None
        res["sync"] = info
        res["unchanged"] = bool((x == 1).all())
        res["next_call"] = expect(lambda: comm.barrier())
    else:
        time.sleep(a.delay_s + 1.0)
        res["late_call"] = expect(lambda: comm.all_reduce(np.ones(4, np.float32)))
    new = comm.shrink(timeout=a.timeout)
    res["new_size"] = new.size
    # an async all-reduce that waits, aborted from another thread: Work.wait raises promptly
    if new.rank == 0:
        w = new.all_reduce(np.ones(1 << 16, np.float32), async_op=True)
        time.sleep(0.3)
        t0 = time.monotonic()
        new.abort()
        res["async"] = expect(lambda: w.wait(timeout=30), t0)
    else:
        res["async_peer"] = expect(lambda: (time.sleep(1.0), new.all_reduce(np.ones(4, np.float32))))
    newer = new.shrink(timeout=a.timeout)
    res["after_ok"] = checked_all_reduce(newer, 4096, 1)
    newer.destroy()
    Rank(a.out, r).write(res)
    return res


def scenario_timeout(a: argparse.Namespace) -> dict[str, Any]:
    """Per-call timeouts on rank 0 while rank 1 is away (sync, p2p, async handle); re-init in between."""
    comm = ringflow.init(timeout=a.timeout)
    r = comm.rank
    lim = a.call_timeout
    res: dict[str, Any] = {"rank": r, "limit_s": lim}
    if r == 0:
        res["recv"] = expect(lambda: comm.recv(np.empty(16, np.float32), 1, tag=3, timeout=lim))
        res["all_reduce"] = expect(lambda: comm.all_reduce(np.ones(1 << 14, np.float32), timeout=lim))
        res["next_call"] = expect(lambda: comm.barrier(timeout=lim))  # the timed-out communicator is failed
    else:
        time.sleep(3 * lim + 1.0)
    new = comm.shrink(timeout=a.timeout)
    if r == 0:
        w = new.all_reduce(np.ones(1 << 14, np.float32), async_op=True, timeout=2 * lim)
        res["work_wait"] = expect(lambda: w.wait(timeout=lim / 2))  # the handle's wait times out first
        t0 = time.monotonic() - lim / 2
        res["work_op"] = expect(lambda: w.wait(timeout=60), t0)  # then the operation's own timeout fires
    else:
        time.sleep(3 * lim + 1.0)
    newer = new.shrink(timeout=a.timeout)
    res["after_ok"] = checked_all_reduce(newer, 1 << 14, 4)
    newer.destroy()
    Rank(a.out, r).write(res)
    return res


def scenario_shrinkvote(a: argparse.Namespace) -> dict[str, Any]:
    """The last rank leaves (mode exclude: it destroys, the others exclude it) or stays silent (mode absent:
    it never calls shrink, the others leave it out at their deadline); the rest shrink and continue."""
    comm = ringflow.init(timeout=a.timeout)
    r, last = comm.rank, comm.size - 1
    res: dict[str, Any] = {"rank": r, "mode": a.mode}
    if r == last:
        if a.mode == "exclude":
            comm.destroy()
        else:
            time.sleep(a.delay_s)
    else:
        t0 = time.monotonic()
        new = comm.shrink(exclude=[last] if a.mode == "exclude" else (), timeout=a.call_timeout)
        res.update(shrink_s=time.monotonic() - t0, new_size=new.size, parent_ranks=list(new.parent_ranks),
                   after_ok=checked_all_reduce(new, 1000, 1))
        new.destroy()
    Rank(a.out, r).write(res)
    return res


def _hostile_frames(comm: Any) -> dict[int, bytes | None]:
    """Crafted byte streams for tags 1.. (rank 1 -> rank 0); None: close after the HELLO only."""
    import struct
    import zlib

    from ringflow.runtime.transport import frames
    from ringflow.runtime.transport.frames import HEADER, Kind

    def raw(magic: bytes = frames.MAGIC, version: int = frames.VERSION, kind: int = int(Kind.DATA), seq: int = 1,
            nbytes: int = 64) -> bytes:
        body = struct.pack("<4sHHIQQQIi", magic, version, kind, 0, seq, nbytes, 0, 0, 0)
        return body + struct.pack("<I", zlib.crc32(body))

    good = frames.pack(Kind.DATA, 1, 64)
    assert len(good) == HEADER.size
    flipped = bytearray(good)
    flipped[20] ^= 0x40  # a bit flip in the size field: the CRC catches it
    return {
        1: b"XXXX" + good[4:] + b"\xee" * 64,                     # malformed: bad magic
        2: raw(version=99) + b"\xee" * 64,                         # malformed: unknown version
        3: bytes(flipped) + b"\xee" * 64,                          # malformed: corrupt header (CRC)
        4: raw(kind=99) + b"\xee" * 64,                            # malformed: unknown kind
        5: raw(seq=7) + b"\xee" * 64,                              # out of sequence
        6: raw(nbytes=1 << 40) + b"\xee" * 4096,                   # oversized (claims 1 TiB for 64 bytes)
        7: good[:20],                                              # truncated header, then EOF
        8: good + b"\xee" * 20,                                    # truncated payload, then EOF
    }


EXPECT_FRAMES = {1: ("ProtocolError", "magic"), 2: ("ProtocolError", "version"), 3: ("ProtocolError", "checksum"),
                 4: ("ProtocolError", "kind"), 5: ("ProtocolError", "out-of-sequence"),
                 6: ("ProtocolError", "oversized"), 7: ("RemoteError", "truncated after 20 of 48 header"),
                 8: ("RemoteError", "truncated after 20 of 64 payload")}


def scenario_frames(a: argparse.Namespace) -> dict[str, Any]:
    """Rank 1 writes hostile frames (authenticated, after a valid HELLO) to rank 0's TCP transport."""
    from ringflow.runtime.transport.tcp import dial
    comm = ringflow.init(timeout=a.timeout)
    r = comm.rank
    res: dict[str, Any] = {"rank": r, "cases": {}}
    if r == 1:
        card = comm.cards[0]
        addr = (card.address, card.port)
        socks = []
        for tag, data in _hostile_frames(comm).items():
            s = dial(addr, comm._sh.secret, {"uid": comm.uid, "rank": 1, "key": f"p{tag}"}, None,
                     time.monotonic() + 10, "rank 0")
            s.sendall(data)
            if tag in (7, 8):
                s.close()
            else:
                socks.append(s)
        # a connection with the secret but garbage instead of HELLO, and one without the secret
        s = dial(addr, comm._sh.secret, {"uid": "not-this-communicator", "rank": 1, "key": "p99"}, None,
                 time.monotonic() + 10, "rank 0")
        socks.append(s)
        res["wrong_secret"] = expect(lambda: dial(addr, b"not-the-job-secret", {"uid": comm.uid, "rank": 1,
                                                                                "key": "p98"},
                                                  None, time.monotonic() + 10, "rank 0"))
        comm.barrier()  # rank 0 has examined every hostile connection
        comm.send(values(1, 2, 64, "float32", "sum", 9), 0, tag=50)
        res["after_ok"] = checked_all_reduce(comm, 1 << 16, 6)
        for s in socks:
            s.close()
    else:
        for tag in sorted(EXPECT_FRAMES):
            buf = np.full(16, 3.0, np.float32)  # 64 bytes, the size the hostile headers announce
            info = expect(lambda buf=buf, tag=tag: comm.recv(buf, 1, tag=tag, timeout=10))
            info["unchanged"] = bool((buf == 3.0).all())
            res["cases"][str(tag)] = info
        comm.barrier()
        got = np.zeros(64, np.float32)
        comm.recv(got, 1, tag=50)
        res["honest_recv_ok"] = bool(np.array_equal(got, values(1, 2, 64, "float32", "sum", 9)))
        res["after_ok"] = checked_all_reduce(comm, 1 << 16, 6)
    comm.destroy()
    Rank(a.out, r).write(res)
    return res


def scenario_ifbind(a: argparse.Namespace) -> dict[str, Any]:
    """Create the communicator, report this process's listening sockets, wait for the parent."""
    comm = ringflow.init(timeout=a.timeout)
    res = {"rank": comm.rank, "pid": os.getpid(), "card": [comm.cards[comm.rank].address,
                                                           comm.cards[comm.rank].port]}
    rk = Rank(a.out, comm.rank)
    rk.write(res)
    rk.ready()
    end = time.monotonic() + a.max_s
    while time.monotonic() < end and not (Path(a.out) / "done").exists():
        time.sleep(0.05)
    t0 = time.monotonic()
    comm.barrier()  # the first use of the data connections: they are dialed now
    res["first_barrier_s"] = time.monotonic() - t0
    ok = checked_all_reduce(comm, 1 << 16, 1)
    comm.destroy()
    res["after_ok"] = ok
    (Path(a.out) / f"final{comm.rank}.json").write_text(json.dumps(res))
    return res


def _mixed_ops(comm: Any) -> list[Callable[[], bool]]:
    """Small collectives of every kind, each returning True when its result is exact."""
    n, r = comm.size, comm.rank
    c = 8
    xs = [values(q, n, c * n, "float32", "sum", 1) for q in range(n)]
    mine = xs[r]
    red = reduce_ref(xs, "sum")
    buf = np.empty(c * n, np.float32)
    part = np.empty(c, np.float32)
    gat = np.empty(c * n, np.float32)
    cat = np.concatenate([x[:c] for x in xs])
    a2a_want = np.concatenate([xs[q][r * c:(r + 1) * c] for q in range(n)])

    def all_reduce() -> bool:
        buf[:] = mine
        comm.all_reduce(buf)
        return bool(np.array_equal(buf, red))

    def broadcast() -> bool:
        buf[:] = mine
        comm.broadcast(buf, root=0)
        return bool(np.array_equal(buf, xs[0]))

    def all_gather() -> bool:
        comm.all_gather(mine[:c], out=gat)
        return bool(np.array_equal(gat, cat))

    def reduce_scatter() -> bool:
        comm.reduce_scatter(mine, op="sum", out=part)
        return bool(np.array_equal(part, red[r * c:(r + 1) * c]))

    def all_to_all() -> bool:
        comm.all_to_all(mine, out=buf)
        return bool(np.array_equal(buf, a2a_want))

    def reduce() -> bool:
        buf[:] = mine
        comm.reduce(buf, root=n - 1)
        return r != n - 1 or bool(np.array_equal(buf, red))

    def barrier() -> bool:
        comm.barrier()
        return True

    return [all_reduce, broadcast, all_gather, reduce_scatter, all_to_all, reduce, barrier]


def _cycle(comm: Any, i: int) -> int:
    """One create/destroy cycle of kind i % 4 (split, new_group, split+shrink, full init); communicators made."""
    kind = i % 4
    if kind == 0:
        c = comm.split(0, comm.rank)
        made = 1
    elif kind == 1:
        c = comm.new_group(list(range(comm.size))[::-1])
        made = 1
    elif kind == 2:
        c = comm.split(0, comm.rank).shrink()  # re-initialisation under a new generation
        made = 2
    else:
        c = ringflow.init(timeout=comm.timeout)
        made = 1
    ok = checked_all_reduce(c, 4, i % 3)
    c.destroy()
    if not ok:
        raise AssertionError(f"cycle {i}: wrong all-reduce result")
    return made


def scenario_soak(a: argparse.Namespace) -> dict[str, Any]:
    """a.ops back-to-back small collectives, then a.cycles create/destroy cycles; usage at checkpoints."""
    comm = ringflow.init(timeout=a.timeout)
    ops = _mixed_ops(comm)
    res: dict[str, Any] = {"rank": comm.rank, "ops": [], "cycles": [], "wrong": 0, "made": 0}
    t0 = time.monotonic()
    for i in range(a.ops):
        if i % max(1, a.ops // 10) == 0:
            gc.collect()
            res["ops"].append({"i": i, **proc_usage()})
        res["wrong"] += int(not ops[i % len(ops)]())
    gc.collect()
    res["ops"].append({"i": a.ops, **proc_usage()})
    res["ops_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    for i in range(a.cycles):
        if i % max(1, a.cycles // 10) == 0:
            gc.collect()
            res["cycles"].append({"i": i, **proc_usage()})
        res["made"] += _cycle(comm, i)
    gc.collect()
    res["cycles"].append({"i": a.cycles, **proc_usage()})
    res["cycles_s"] = time.monotonic() - t0
    comm.destroy()
    Rank(a.out, res["rank"]).write(res)
    return res


def scenario_lossbench(a: argparse.Namespace) -> dict[str, Any]:
    """Checked all-reduces of each size; median time and busbw (nccl-tests factor 2(n-1)/n)."""
    from ringflow.runtime.bench import bus_factor, default_iters
    comm = ringflow.init(timeout=a.timeout)
    n = comm.size
    rows = []
    for nbytes in a.sizes:
        count = max(1, nbytes // 4)
        x = values(comm.rank, n, count, "float32", "sum", 0)
        want = reduce_ref([values(q, n, count, "float32", "sum", 0) for q in range(n)], "sum")
        buf = np.empty_like(x)
        times, wrong = [], 0
        iters = a.iters or default_iters(count * 4)  # 0: as many as `ringflow bench` uses for this size
        for it in range(a.warm + iters):
            buf[:] = x
            comm.barrier()
            t0 = time.perf_counter()
            comm.all_reduce(buf)
            dt = time.perf_counter() - t0
            wrong += int(not np.array_equal(buf, want))
            if it >= a.warm:
                times.append(dt)
        t, mean = float(np.median(times)), float(np.mean(times))
        rows.append({"size_bytes": count * 4, "time_us": t * 1e6, "algbw_GBps": count * 4 / t / 1e9,
                     "busbw_GBps": count * 4 / t / 1e9 * bus_factor("all_reduce", n), "wrong": wrong,
                     "iters": iters, "mean_us": mean * 1e6, "max_us": max(times) * 1e6,
                     "mean_busbw_GBps": count * 4 / mean / 1e9 * bus_factor("all_reduce", n)})
    comm.destroy()
    res = {"rank": comm.rank, "rows": rows}
    Rank(a.out, comm.rank).write(res)
    return res


# ---------------------------------------------------------------------------- parent side
def take_leaked_names(since: int) -> list[str]:
    """/dev/shm names of the Jobs started after the first `since`, removed (so a failure leaves nothing)."""
    import glob
    leaked = [p for j in Job.all_ids[since:] for p in glob.glob(f"/dev/shm/ringflow-{j}-*")]
    for p in leaked:
        try:
            os.unlink(p)
        except OSError:
            pass
    return leaked


def dropped_packets(cluster: Any) -> int:
    """Packets the loss rules of `NetnsCluster.set_loss` have dropped so far (their nftables counters)."""
    import re
    import subprocess
    out = subprocess.run(["ip", "netns", "exec", cluster.bridge_ns, "nft", "list", "table", "bridge", "rfloss"],
                         capture_output=True, text=True, timeout=10)
    return sum(int(m) for m in re.findall(r"counter packets (\d+) bytes \d+ drop", out.stdout))


def clear_loss(cluster: Any) -> None:
    """Remove the loss rules `NetnsCluster.set_loss` added (the link is lossless again)."""
    import subprocess
    subprocess.run(["ip", "netns", "exec", cluster.bridge_ns, "nft", "delete", "table", "bridge", "rfloss"],
                   capture_output=True, timeout=10)


def tcp_retransmits(cluster: Any) -> int:
    """TCP segments retransmitted, summed over the cluster's host namespaces (/proc/net/snmp)."""
    import subprocess
    total = 0
    for h in range(cluster.nhosts):
        out = subprocess.run(cluster.command(h, ["cat", "/proc/net/snmp"]), capture_output=True, text=True,
                             check=True, timeout=10).stdout
        tcp = [ln.split() for ln in out.splitlines() if ln.startswith("Tcp:")]
        total += int(tcp[1][tcp[0].index("RetransSegs")])
    return total


def mtu_packets(cluster: Any) -> None:
    """Make every host of a NetnsCluster send MTU-sized packets (gso_max_segs 1), so that a loss rule
    drops 1% of real packets rather than 1% of 64 KiB GSO bundles."""
    import subprocess
    for ns in cluster.names:
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "gso_max_segs", "1"], check=True,
                       capture_output=True, timeout=10)


class Job:
    """n real ranks running one scenario; the store is served here unless `store_addr` is given.

    `wrap(rank, argv)` can wrap a rank's command (e.g. `NetnsCluster.command` to place it in a
    namespace). Output of rank r goes to ``out/log<r>.txt``.
    """

    all_ids: list[str] = []  # every job id started in this process, for leak checks

    def __init__(self, n: int, scenario: str, out: Path, args: list[str] | tuple[str, ...] = (),
                 env: dict[str, str] | None = None, store_addr: str | None = None,
                 wrap: Callable[[int, list[str]], list[str]] | None = None, job_id: str | None = None) -> None:
        import secrets
        import subprocess

        from ringflow.runtime.job import auth
        from ringflow.runtime.job.store import StoreServer
        self.n, self.out = n, Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.secret = auth.new_secret()
        self.job_id = job_id or "rs" + secrets.token_hex(4)
        Job.all_ids.append(self.job_id)
        self.server = None
        if store_addr is None:
            self.server = StoreServer("127.0.0.1", 0, self.secret)
            store_addr = f"{self.server.address[0]}:{self.server.address[1]}"
        self.store_addr = store_addr
        self.procs: list[subprocess.Popen] = []
        self.killed: dict[int, float] = {}
        for r in range(n):
            e = dict(os.environ)
            for k in ("RINGFLOW_SHM_DISABLE", "RINGFLOW_DEBUG", "RINGFLOW_DEBUG_FILE", "RINGFLOW_SOCKET_IFNAME"):
                e.pop(k, None)
            e.update({"RINGFLOW_RANK": str(r), "RINGFLOW_WORLD_SIZE": str(n), "RINGFLOW_STORE_ADDR": store_addr,
                      "RINGFLOW_SECRET": self.secret, "RINGFLOW_JOB_ID": self.job_id, "PYTHONUNBUFFERED": "1",
                      "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                      "PYTHONPATH": str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")})
            e.update(env or {})
            argv = [sys.executable, str(Path(__file__).resolve()), scenario, "--out", str(self.out), *args]
            if wrap is not None:
                argv = wrap(r, argv)
            log = open(self.out / f"log{r}.txt", "wb")
            self.procs.append(subprocess.Popen(argv, env=e, stdout=log, stderr=subprocess.STDOUT))
            log.close()

    def wait_ready(self, ranks: list[int] | None = None, timeout_s: float = 60.0) -> None:
        """Block until the ranks have written their ready file (TimeoutError, with their logs, if not)."""
        ranks = list(range(self.n)) if ranks is None else ranks
        end = time.monotonic() + timeout_s
        while not all((self.out / f"ready{r}").exists() for r in ranks):
            dead = [r for r in ranks if self.procs[r].poll() is not None]
            if dead or time.monotonic() > end:
                raise TimeoutError(f"ranks {ranks} not ready (exited: {dead})\n" + self.logs())
            time.sleep(0.01)

    def signal(self, rank: int, signum: int) -> float:
        """Send `signum` to one rank; the monotonic time just before the signal."""
        t = time.monotonic()
        os.kill(self.procs[rank].pid, signum)
        return t

    def kill(self, rank: int) -> float:
        """SIGKILL one rank; the monotonic time just before the signal."""
        import signal
        t = time.monotonic()
        os.kill(self.procs[rank].pid, signal.SIGKILL)
        self.killed[rank] = t
        return t

    def wait(self, timeout_s: float = 60.0) -> list[int | None]:
        """Wait for every rank to exit (killing stragglers at the deadline); exit codes (None: had to kill)."""
        import subprocess
        end = time.monotonic() + timeout_s
        codes: list[int | None] = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes

    def result(self, rank: int) -> dict[str, Any] | None:
        """The JSON a rank wrote (None if it wrote none)."""
        f = self.out / f"rank{rank}.json"
        return json.loads(f.read_text()) if f.exists() else None

    def logs(self) -> str:
        """Every rank's output, tail first 3000 characters each."""
        parts = []
        for r in range(self.n):
            f = self.out / f"log{r}.txt"
            txt = f.read_text(errors="replace") if f.exists() else ""
            parts.append(f"--- rank {r} ---\n{txt[-3000:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Kill what still runs and stop the store."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if self.server is not None:
            self.server.close()
            self.server = None

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


SCENARIOS = {"loop": scenario_loop, "mismatch": scenario_mismatch, "abort": scenario_abort,
             "timeout": scenario_timeout, "frames": scenario_frames, "shrinkvote": scenario_shrinkvote,
             "ifbind": scenario_ifbind, "soak": scenario_soak, "lossbench": scenario_lossbench}


def main(argv: list[str] | None = None) -> int:
    """Run one scenario in this rank."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=30.0, help="communicator timeout (s)")
    ap.add_argument("--count", type=int, default=1 << 16, help="elements per all-reduce (loop)")
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--max-s", type=float, default=60.0)
    ap.add_argument("--shrink", action="store_true", help="loop: shrink after the error")
    ap.add_argument("--alloc", action="store_true", help="loop: all-reduce a comm.alloc buffer (zero-copy sends)")
    ap.add_argument("--orphan", action="store_true", help="loop: rank 1 first sends rank 0 a message it never receives")
    ap.add_argument("--depart-on-signal", action="store_true",
                    help="loop: on SIGUSR2 this rank destroys its communicator after its current call and stops")
    ap.add_argument("--delay-s", type=float, default=0.5)
    ap.add_argument("--mode", default="absent", help="shrinkvote: absent or exclude")
    ap.add_argument("--call-timeout", type=float, default=1.0)
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--cycles", type=int, default=1_000)
    ap.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=[4096, 1 << 20])
    a = ap.parse_args(argv)
    SCENARIOS[a.scenario](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
