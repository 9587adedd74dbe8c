"""Call recorder and flight recorder: what every collective and point-to-point call of a rank did, and when.

Where RINGFLOW_DUMP_DIR or RINGFLOW_RECORD says where records go (`ringflow run` sets RINGFLOW_DUMP_DIR to its job
directory), every communicator keeps its last RINGFLOW_FLIGHT_RECORDER calls twice: in a file-backed ring,
``ring-rank<R>-<K>.bin`` (flightring.py; each call written as it is entered, started and ended, so a rank killed
or blocked leaves it on disk), and in memory; a timeout, a failed peer, SIGUSR1 or `comm.dump()` writes the
latter to ``flight-rank<R>.json`` beside it. With
RINGFLOW_RECORD=DIR every call is also kept and written to ``DIR/rank<R>.jsonl`` (R: the global rank), and
world rank 0 writes ``DIR/manifest.json``.
`ringflow record merge` and `ringflow diagnose` (ringflow.workload.recorded) read them; docs/record.md
describes the format.

The runtime passes each call's metadata as a tuple ``meta = (op, dtype, count, root_or_peer, redop_or_tag)``:
for collectives ``(name, dtype, input elements on this rank, root or None, reduction or None)``, for
point-to-point ``("send"|"recv", dtype, elements, peer, tag)``.
"""
from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import Any

from ... import config
from ...errors import InvalidArgument
from . import flightring
from .record_rows import (
    ALGO,
    CODE,
    LANE,
    LANES,
    LINE,
    META,
    SEQ,
    STATUS,
    T_END,
    T_START,
    WAIT,
    desc_key,
    desc_row,
    op_name,
    pack_rows,
    row,
    site_text,
)
from .record_rows import ASYNC as ASYNC  # record.X names each field of an entry, as record_rows.X does
from .record_rows import DESC as DESC
from .record_rows import T_ENQ as T_ENQ

log = logging.getLogger("ringflow.runtime")

FORMAT = "ringflow-record/2"   # 2: calls as packed rows of described calls
FLUSH_EVERY = 1024   # calls kept before the record file is written (also at destroy, exit and on errors)
MAX_DESCS = 65536    # call descriptions a process remembers (each keeps its objects alive) before starting again
_PKG = str(Path(__file__).resolve().parents[2]) + os.sep   # .../ringflow/
_now = time.perf_counter_ns    # CLOCK_MONOTONIC on Linux: one clock for every process of a host
_getframe = sys._getframe


def _is_internal(filename: str) -> bool:
    """Frames of ringflow itself, of torch, of the deprecation wrappers torch puts around some calls
    (typing_extensions) and of a worker thread's start are skipped when looking for the user's call site."""
    return filename.startswith(_PKG) or f"{os.sep}torch{os.sep}" in filename or filename.startswith("<frozen") \
        or filename.endswith((f"{os.sep}threading.py", f"{os.sep}typing_extensions.py"))


_internal: dict[CodeType, bool] = {}


def _inside(code: CodeType) -> bool:
    """True for code of ringflow itself, of torch or of a thread's start (cached per code object)."""
    inside = _internal.get(code)
    if inside is None:
        inside = _internal[code] = _is_internal(code.co_filename)
    return inside


def _first_outside(f: Any, limit: int) -> tuple[Any, int]:
    """The first of `limit` frames from f outward whose code is outside ringflow and torch, and how many frames up
    from f it is; (None, -1) if none is."""
    n = 0
    while f is not None and n < limit:
        if not _inside(f.f_code):
            return f, n
        f, n = f.f_back, n + 1
    return None, -1


def call_site(depth: int = 2) -> tuple[CodeType | None, int]:
    """(code object, line) of the first frame outside ringflow and torch, `depth` frames up."""
    f, _ = _first_outside(sys._getframe(depth), sys.maxsize)
    return (f.f_code, f.f_lineno) if f is not None else (None, 0)


# frames looked at for a call site: a user's line is a few frames above ringflow's entry point, and calls made
# from deep inside a framework (a benchmark driver, torch's autograd thread) have none worth the walk
MAX_WALK = 24   # torch's deprecated all_gather_into_tensor reaches the backend 16 frames below the user
_sites: dict[CodeType, int] = {}   # code 4 frames up -> depth of the user's frame there, or -1


def call_site_of() -> tuple[CodeType | None, int, int]:
    """(code, line, queued_ns) of the operation the recorder is entered for; queued_ns is 0 unless the call
    runs a job another thread queued (`with_site`): then it is when the job was queued.

    The path from the user's line to here is the same for every call made from the same place, so the depth
    of the user's frame (or that there is none within MAX_WALK frames) is remembered per code object 4 frames
    up (the user's own function on the repeated-call path): a repeated call looks at one or two frames instead
    of walking and materialising all of them. On a worker thread with no user frame: the site `with_site`
    noted when the job was queued."""
    try:
        f: Any = _getframe(4)
    except ValueError:   # a shallow stack
        f = None
    if f is not None:
        d = _sites.get(f.f_code)
        if d is not None:
            if d < 0:
                return getattr(_queued, "site", None) or (None, 0, 0)
            g = f   # the remembered depth holds if the frames below it are ringflow's or torch's, and it is not
            for _ in range(d - 4):
                if g is None or _internal.get(g.f_code) is not True:
                    break
                g = g.f_back
            else:
                if g is not None and _internal.get(g.f_code) is False:
                    return g.f_code, g.f_lineno, 0
    try:
        start: Any = _getframe(2)   # from our caller's caller, as the depths count
    except ValueError:
        start = None
    g, n = _first_outside(start, MAX_WALK - 2)
    if f is not None:
        if len(_sites) > 4096:
            _sites.clear()
        _sites[f.f_code] = n + 2 if g is not None else -1
    if g is not None:
        return g.f_code, g.f_lineno, 0
    return getattr(_queued, "site", None) or (None, 0, 0)


class _Queued(threading.local):
    """On a worker thread: the call site of the job it runs and when it was queued (`with_site`). The class
    defaults answer a thread that runs no queued job without raising AttributeError, which costs about 1 us on
    every call the recorder looks them up for."""
    site: tuple[CodeType | None, int, int] | None = None
    sink: list[tuple[Recorder, list[Any]]] | None = None


_queued = _Queued()


def with_site(job: Callable[[], Any], sink: list[tuple[Recorder, list[Any]]] | None = None) -> Callable[[], Any]:
    """`job`, remembering the caller's call site and the time for the recorder when another thread runs it (the
    torch backend's lanes queue asynchronous operations this way): the call is recorded as the caller's
    asynchronous call, issued when it was queued; `sink` receives (recorder, entry) of the call it makes, for
    noting a later wait on it (`Recorder.waited`)."""
    code, line = call_site(2)
    site = (code, line, _now())

    def run() -> Any:
        _queued.site, _queued.sink = site, sink
        try:
            return job()
        finally:
            _queued.site = _queued.sink = None
    return run


def global_rank(comm: Any) -> int:
    """This process's rank in its job: the world communicator's rank, else the launcher's."""
    if "/" not in comm.ns:
        return int(comm.rank)
    try:
        from ..call.identity import get_rank
        return get_rank()
    except InvalidArgument:
        return int(comm.rank)


class _Process:
    """What every communicator of this process shares: its global rank, the record file and the dump hook."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rank: int | None = None
        self.record_dir: Path | None = None
        self.file: Any = None
        # call description -> (id in the record file, its objects)
        self.descs: dict[tuple, tuple[int, tuple]] = {}
        self.recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()
        self.mono0, self.wall0 = _now(), time.time_ns()
        self.hooked = False
        self.told = False   # said once that flight records go nowhere without a directory
        self.nrings = 0     # ring files this process opened (K of ring-rank<R>-<K>.bin)

    def open_record(self, directory: str, rank: int) -> None:
        """Open DIR/rank<R>.jsonl (once per process) with its header line."""
        if self.file is not None:
            return
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.record_dir = d
        self.file = open(d / f"rank{rank}.jsonl", "a", encoding="utf-8")
        self.write([{"kind": "process", "format": FORMAT, "rank": rank, "pid": os.getpid(),
                     "hostname": socket.gethostname(), "mono0_ns": self.mono0, "wall0_ns": self.wall0,
                     "argv": sys.argv}])

    def write_calls(self, ns: str, entries: list[list[Any]], pack: Callable[..., str]) -> None:
        """Calls as one line ``{"kind": "calls", "rows": B}``, B the base64 of little-endian int64 quintuples
        (seq, enq_ns, start_ns, end_ns, desc) that `pack` (the recorder's pack_rows) makes; a description's fields go
        once in a ``{"kind": "desc", "id": desc, ...}`` line before its first call. Formatting numbers as text
        would cost the recorded call more than the rest of the recording does; `recorded.read_dir` expands both."""
        if self.file is None or not entries:
            return
        with self.lock:
            if len(self.descs) >= MAX_DESCS:   # ids start again, between batches: a reader takes an id's latest line
                self.descs.clear()
            descs, new = self.descs, []

            def desc_id(e: list[Any]) -> int:
                key = desc_key(ns, e)
                d = descs.get(key)
                if d is None:
                    d = descs[key] = (len(descs), (e[META], e[CODE], e[ALGO]))
                    new.append(json.dumps({"kind": "desc", "id": d[0], **desc_row(ns, e)}, separators=(",", ":"))
                               + "\n")
                return d[0]
            rows = pack(entries, desc_id)
            self.file.write("".join(new) + f'{{"kind":"calls","rows":"{rows}"}}\n')
            self.file.flush()

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))

    def write_text(self, text: str) -> None:
        if self.file is None or not text:
            return
        with self.lock:
            self.file.write(text)
            self.file.flush()

    def hook_signals(self, term: Callable[[], bool] | None = None) -> None:
        """SIGUSR1 dumps every live communicator's flight record (only if nobody else handles SIGUSR1); `term`
        (the C recorder's install_term_handler) marks the rings ended on SIGTERM where nothing handles it."""
        if self.hooked:
            return
        self.hooked = True
        atexit.register(flush_all)
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR1, lambda signum, frame: dump_all("SIGUSR1"))
        if term is not None and threading.current_thread() is threading.main_thread():
            term()


_proc = _Process()


def dump_dir() -> Path | None:
    """Where flight records go: RINGFLOW_DUMP_DIR, else the record directory; None: nowhere configured."""
    d = str(config.get("DUMP_DIR") or "") or str(config.get("RECORD") or "")
    return Path(d) if d else None


class Recorder:
    """The calls of one communicator: a ring of the last N, and (recording) every call until written."""

    def __init__(self, comm: Any, ring_n: int, record_dir: str) -> None:
        self.comm = weakref.proxy(comm)
        self.ns, self.rank, self.size = comm.ns, int(comm.rank), int(comm.size)
        self.grank = global_rank(comm)
        self.ring: collections.deque[list[Any]] = collections.deque(maxlen=max(1, ring_n))
        self.pending: list[list[Any]] | None = [] if record_dir else None
        self.seqs: dict[Any, int] = {}
        self.coll_seq = 0
        self.last: list[Any] | None = None     # the latest collective entered
        self.barrier_ns: int | None = None
        self.reason = ""
        self.fring: Any = None        # the file-backed ring's writer (open_ring), None without one
        self.fring_map: Any = None    # its mapping

    pack_rows = staticmethod(pack_rows)   # the rows of the record file (record_native.py's are C's)

    def open_ring(self, directory: Path, nslots: int) -> None:
        """Create this communicator's ring file in `directory` and write every call into it from now on."""
        mm, slots_at = self.ring_file(directory, nslots)
        self.fring_map = mm
        self.fring = flightring.PyRing(mm, slots_at, nslots, flightring.Names(mm))

    def ring_file(self, directory: Path, nslots: int) -> tuple[Any, int]:
        """A new ring file of `nslots` slots in `directory` (flightring.create): its mapping and slots' offset."""
        with _proc.lock:
            k = _proc.nrings
            _proc.nrings = k + 1
        directory.mkdir(parents=True, exist_ok=True)
        info = flightring.process_info(self.info(), os.getpid(), _proc.mono0, _proc.wall0)
        return flightring.create(directory / f"ring-rank{self.grank}-{k}.bin", nslots, info)

    def end_ring(self, state: int) -> None:
        """Mark the ring ended (`state`: flightring.DESTROYED or EXITED) and stop writing it."""
        ring, mm = self.fring, self.fring_map
        if ring is None or mm is None:
            return
        self.fring = self.fring_map = None
        ring.release()
        flightring.mark_ended(mm, state, _now())
        try:
            mm.close()
        except BufferError:   # a writer still holds it: the mapping goes with the process
            pass

    # -------------------------------------------------------------- the hot path
    def enter(self, lane: int, description: str, meta: tuple | None, async_op: bool) -> list[Any]:
        """Note an asynchronous call as it is issued; `call(..., entry=)` runs and times it later."""
        return self.call(lane, description, meta, None, None, 0.0, async_op=async_op)

    def call(self, lane: int, description: str, meta: tuple | None, guard: Callable[[Any, float, int], None] | None,
             fn: Any, deadline: float, entry: list[Any] | None = None, async_op: bool = False) -> Any:
        """Note a call (its entry is in the ring at once, so a hang shows it) and run it through the communicator's
        `guard`, noting its start, end and outcome; with no `guard`, only note it and return its entry. A job
        another thread queued (`with_site`) is the queuing caller's asynchronous call, issued then. One method
        for both halves: the recorder is on every call, and each call frame costs."""
        e = entry
        if e is None:
            code, line, queued = call_site_of()
            if lane == 0:
                seq = self.coll_seq
                self.coll_seq = seq + 1
            else:
                key = (lane, meta[3], meta[4]) if meta else (lane, description)
                seq = self.seqs.get(key, 0)
                self.seqs[key] = seq + 1
            e = [lane, seq, meta, description, queued or _now(), 0, 0, code, line, "", None, async_op or queued != 0]
            if queued:
                sink = getattr(_queued, "sink", None)
                if sink is not None:
                    sink.append((self, e))
            self.ring.append(e)
            pending = self.pending
            if pending is not None:
                pending.append(e)
                if len(pending) >= FLUSH_EVERY:
                    self.flush()
            fring = self.fring
            pos = -1 if fring is None else fring.enter(e)
        else:
            fring = self.fring
            pos = -1 if fring is None or guard is None else fring.find(e)
        if guard is None:
            return e
        e[T_START] = _now()
        if pos >= 0:
            fring.start(pos, e)
        if lane == 0:
            self.last = e
        try:
            guard(fn, deadline, lane)
        except BaseException as exc:
            e[T_END], e[STATUS] = _now(), type(exc).__name__
            if pos >= 0:
                fring.exit(pos, e)
            self.failed(exc)
            raise
        e[T_END] = _now()
        if pos >= 0:
            fring.exit(pos, e)
        if lane == 0 and self.size > 1:
            e[ALGO] = self.comm.last_schedule   # its name is read when the entry is written
        return None

    def run(self, description: str, meta: tuple | None, miss: Any, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args): a collective that runs without the communicator's guard (the remembered-call path on NumPy
        arrays), recorded as `call` records one; fn returning `miss` ran nothing, and its record is taken back (the
        full path records the call)."""
        last = self.last
        e = self.call(0, description, meta, None, None, 0.0)
        got: list[Any] = []
        self.call(0, description, meta, lambda _fn, _deadline, _lane: got.append(fn(*args)), None, 0.0, entry=e)
        if got[0] is miss:
            self.take_back(e, last)
        return got[0]

    def take_back(self, e: list[Any], last: list[Any] | None) -> None:
        """Forget collective `e`, which did not run: its place in the ring left empty, its sequence number and the
        latest collective (`last`) as they were."""
        fring = self.fring
        if fring is not None:
            fring.cancel(fring.find(e))
        for kept in (self.ring, self.pending or [], getattr(_queued, "sink", None) or []):
            for i in range(len(kept) - 1, -1, -1):
                it = kept[i]
                if it is e or (type(it) is tuple and it[1] is e):
                    del kept[i]
                    break
        if self.coll_seq == e[SEQ] + 1:
            self.coll_seq = e[SEQ]
        self.last = last

    def waited(self, e: list[Any], t0: int, t1: int) -> None:
        """The program waited on the Work of asynchronous call `e` from t0 to t1 (ns): a "wait" entry naming it
        (its lane, sequence number and metadata), so a replay blocks the rank there until the call ends."""
        code, line = call_site(2)   # from Work.wait outward (not call_site_of's cache: its depths are the calls')
        w = [WAIT, e[SEQ], e[META], LANES[e[LANE]], t0, t0, t1, code, line, "", None, False]
        self.keep(w)
        if self.pending is not None:
            self.pending.append(w)

    def keep(self, e: list[Any]) -> None:
        """Keep a new entry among the last calls (and in the ring file)."""
        self.ring.append(e)
        if self.fring is not None:
            self.fring.enter(e)

    # -------------------------------------------------------------- off the hot path
    def status(self) -> dict[str, object]:
        """This rank's latest collective, for a peer's STATUS query: recorder sequence number and call site."""
        e = self.last
        if e is None:
            return {"rec_seq": -1}
        return {"rec_seq": e[SEQ], "rec_op": op_name(e), "site": site_text(e[CODE], e[LINE]),
                "rec_done": bool(e[T_END])}

    def info(self) -> dict[str, Any]:
        """The communicator line of the record file."""
        return {"kind": "comm", "comm": self.ns, "rank": self.rank, "size": self.size, "global_rank": self.grank,
                "barrier_ns": self.barrier_ns}

    def flush(self) -> None:
        """Write the calls recorded since the last flush (completed or not) to the record file."""
        p = self.pending
        if not p:
            return
        done = [e for e in p if e[T_END]]
        self.pending = [e for e in p if not e[T_END]]
        _proc.write_calls(self.ns, done, self.pack_rows)

    def close(self, state: int = flightring.DESTROYED) -> None:
        """The communicator is destroyed (or the process exits: `state`): write everything, in-flight calls
        included, and mark the ring ended."""
        p = self.pending
        if p:
            _proc.write_calls(self.ns, p, self.pack_rows)
            self.pending = []
        self.end_ring(state)
        _proc.recorders.discard(self)   # a flight record names live communicators only

    def failed(self, exc: BaseException) -> None:
        """A call raised: write the record and dump the flight record (if a directory is configured)."""
        from ...errors import InvalidUsage
        if isinstance(exc, InvalidUsage):
            return
        self.flush()
        dump_all(f"{type(exc).__name__}: {exc}")

    def flight(self) -> dict[str, Any]:
        """This communicator's flight record: its info, its last calls and what peers said they were doing."""
        out = self.info()
        seq, what = getattr(self.comm, "_last_call", (-1, ""))
        wd = getattr(self.comm, "_watchdog", None)
        peers = {str(p): s for p, s in dict(getattr(wd, "statuses", {}) or {}).items()}
        dead = sorted(int(p) for p in dict(getattr(wd, "dead", {}) or {}))
        out.update({"calls": [row(self.ns, e) for e in list(self.ring)], "peers": peers, "dead": dead,
                    "runtime_last_call": [seq, what]})
        return out


def _write_manifest(d: Path, comm: Any) -> None:
    m = {"format": FORMAT, "world": comm.ns, "world_size": comm.size, "files": [f"rank{r}.jsonl"
                                                                               for r in range(comm.size)],
         "wall0_ns": time.time_ns(), "argv": sys.argv, "hostname": socket.gethostname()}
    (d / "manifest.json").write_text(json.dumps(m, indent=1) + "\n")


def _flight(rec: Recorder) -> dict[str, Any] | None:
    """rec's flight record; None once its communicator is gone (a recorder the garbage collector has not
    taken yet)."""
    try:
        return rec.flight()
    except ReferenceError:
        return None


def dump_all(reason: str, path: str | os.PathLike[str] | None = None) -> Path | None:
    """Write every live communicator's flight record of this process to `path` (default
    ``<dump dir>/flight-rank<R>.json``); None when no directory is configured."""
    if path is None:
        d = dump_dir()
        if d is None:
            if not _proc.told:
                _proc.told = True
                log.info("ringflow: flight record not written (%s): set RINGFLOW_DUMP_DIR to keep it", reason)
            return None
        d.mkdir(parents=True, exist_ok=True)
        path = d / f"flight-rank{_proc.rank if _proc.rank is not None else os.getpid()}.json"
    recs = list(_proc.recorders)
    doc = {"kind": "flight", "format": FORMAT, "rank": _proc.rank, "pid": os.getpid(),
           "hostname": socket.gethostname(), "reason": reason, "mono_ns": _now(), "wall_ns": time.time_ns(),
           "mono0_ns": _proc.mono0, "wall0_ns": _proc.wall0, "comms": [f for r in recs if (f := _flight(r))]}
    p = Path(path)
    tmp = p.with_name(p.name + f".{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, p)
    log.warning("ringflow: flight record written to %s (%s)", p, reason)
    return p


def flush_all() -> None:
    """Write every recorder's pending calls and mark its ring ended (at exit)."""
    for r in list(_proc.recorders):
        try:
            r.close(flightring.EXITED)
        except (OSError, ReferenceError):
            pass
