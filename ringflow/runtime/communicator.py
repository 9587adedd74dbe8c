"""The Communicator: collectives and point-to-point on NumPy arrays / CPU tensors between processes.

Building one (``init`` or ``split``/``new_group``): agree on a namespace in the store, open a
listener on the selected interface and the lane doorbells, publish a card (host id, address,
port), read everyone's card, connect the control sockets (watched by the Watchdog) and make
the Transport (shared memory to same-host peers, TCP to others). Collectives pick a schedule
(`algorithms.tuner` / `registry`) and run it with the executor; ranks are always group-local.
"""
from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import socket
import threading
import time
from typing import Any, Sequence

import numpy as np

from .. import config
from ..algorithms.layout import CallShape, partitioned
from ..algorithms.schedule import Buffer, Collective, Schedule
from ..errors import (Aborted, InvalidArgument, InvalidUsage, RemoteError, RingflowError, RingflowSystemError,
                      Timeout)
from . import auth, logs
from .env import detect
from .plugins import load_cost_model
from ..algorithms.plan import compile_plan
from ..algorithms.selection import CostModel, pick_schedule
from .executor import CallContext, Waiter, _Broken, bind, check_exchange, describe, drive, run_bound
from .native import copy_into
from .ops import UFUNCS, Buf, finish_avg, parse_op
from .store import PrefixStore, Store, StoreServer
from .transport import doorbell
from .transport.base import Sink
from .transport.frames import Kind, call_signature
from .transport.manager import LANE_COLL, LANE_RECV, LANE_SEND, PeerCard, Transport, buffsize, lane_of
from .transport.tcp import Listener, dial, select_interface
from .watchdog import Watchdog
from .work import Lane, Work

log = logging.getLogger("ringflow.runtime")


def host_id() -> str:
    """Identity of this host *and network namespace*: ranks with equal ids share memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = "?"
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = 0
    return f"{socket.gethostname()}|{boot}|{netns}"


TCP_STREAMS = 2  # sockets a large TCP transfer is striped over (RINGFLOW_NCHANNELS overrides)


def _data_ptr(obj: Any) -> int | None:
    """A torch tensor's storage address (its storage can be swapped under the same object); None for
    NumPy arrays, whose memory cannot move while the binding holds a view of it."""
    f = getattr(obj, "data_ptr", None)
    return f() if f is not None else None


class _Prepared:
    """Everything a repeated call needs, computed once per (collective, count, dtype, op, root, in-place)."""

    __slots__ = ("schedule", "plan", "sig", "desc", "ufunc", "has_scratch", "bound")

    def __init__(self, schedule: Schedule, plan: Any, sig: int, desc: str, ufunc: Any, has_scratch: bool) -> None:
        self.schedule, self.plan, self.sig, self.desc = schedule, plan, sig, desc
        self.ufunc, self.has_scratch = ufunc, has_scratch
        self.bound: Any = None  # the binding of the last small call, reused while its arrays are the same


class _Shared:
    """What a communicator and the groups split from it share: store, job, secret, options."""

    def __init__(self, store: Store, server: StoreServer | None, job: str, secret: bytes, timeout_s: float,
                 tos: int | None) -> None:
        self.store, self.server, self.job, self.secret = store, server, job, secret
        self.timeout_s, self.tos = timeout_s, tos
        self.users = 0
        self.lock = threading.Lock()


class Communicator:
    """A group of ranks that run collectives together. Create with `ringflow.init()`."""

    def __init__(self, shared: _Shared, ns: str, rank: int, size: int) -> None:
        self._sh = shared
        self.ns, self.rank, self.size = ns, rank, size
        self.uid = hashlib.sha256(f"{shared.job}|{ns}".encode()).hexdigest()[:10]
        self.timeout = shared.timeout_s
        self._failure: RingflowError | None = None
        self._mismatch_notes: dict[int, str] = {}
        self._destroyed = False
        self._op_seq = 0
        self._nsplit = 0
        self._scratch: dict[np.dtype, np.ndarray] = {}
        self._schedules: dict[tuple, Schedule] = {}
        self._allocs: list[mmap.mmap] = []
        self._lanes = [Lane("collectives"), Lane("p2p-send"), Lane("p2p-recv")]
        # knobs are read once, when the communicator is created (as NCCL does)
        self._checks = not config.get("CHECKS_DISABLE")
        self._algo_knob, self._nch_knob = config.get("ALGO"), config.get("NCHANNELS")
        self._streams = int(self._nch_knob) if int(self._nch_knob) > 0 else TCP_STREAMS
        self._ll_bytes = int(config.get("LL_THRESHOLD"))
        self._single_ring_bytes = int(config.get("SINGLE_RING_THRESHOLD"))
        self._calls: dict[tuple, _Prepared] = {}
        self._store = PrefixStore(ns, shared.store)
        deadline = time.monotonic() + self.timeout
        self._bells = [doorbell.Doorbell(doorbell.address(shared.job, self.uid, rank, lane)) for lane in range(3)]
        self._watchdog = Watchdog(rank, self._fail, self._note_mismatch)
        ifname, addr = select_interface(config.get("SOCKET_IFNAME"))
        self._listener = Listener(addr, shared.secret, self.uid, shared.tos,
                                  on_ctrl=lambda p, s: self._watchdog.add(p, s, dialed=False),
                                  on_data=self._on_data)
        try:
            card = PeerCard(rank, host_id(), self._listener.address[0], self._listener.address[1], os.getpid())
            self._store.set(f"card/{rank}", json.dumps(card.to_json()))
            self._store.wait([f"card/{r}" for r in range(size)], max(0.1, deadline - time.monotonic()))
            cards = [PeerCard.from_json(json.loads(self._store.get(f"card/{r}", 5.0))) for r in range(size)]
            for peer in range(rank + 1, size):
                c = cards[peer]
                s = dial((c.address, c.port), shared.secret, {"uid": self.uid, "rank": rank, "key": "ctrl"},
                         shared.tos, deadline, f"rank {peer}")
                self._watchdog.add(peer, s, dialed=True)
            self._watchdog.wait_connected([p for p in range(size) if p != rank], deadline)
            self._watchdog.start()
            self._transport = Transport(job=shared.job, uid=self.uid, rank=rank, cards=cards,
                                        secret=shared.secret, tos=shared.tos, listener=self._listener,
                                        shm_disabled=bool(config.get("SHM_DISABLE")), buffsize=buffsize())
            self._host_model = self._load_host_model(str(config.get("TUNER_MODEL") or ""), cards)
        except BaseException:
            self._teardown()
            raise
        self._waiters = [Waiter(b, self._transport.local_ranks, self._check_failure) for b in self._bells]
        self.cards = cards
        with shared.lock:
            shared.users += 1
        log.info("ringflow: communicator %s rank %d/%d ready, listening on %s:%d, shm peers %s, tcp peers %s", ns,
                 rank, size, *self._listener.address, sorted(self._transport.shm_peers),
                 [p for p in range(size) if p != rank and p not in self._transport.shm_peers])

    def _load_host_model(self, path: str, cards: Sequence[PeerCard]) -> CostModel | None:
        """The cost model RINGFLOW_TUNER_MODEL names, where it covers this job (every rank on this host, all
        over shared memory or all over TCP); None otherwise, with a log line saying why."""
        if not path:
            return None
        others = [p for p in range(self.size) if p != self.rank]
        if len({c.host_id for c in cards}) > 1:
            log.warning("ringflow: RINGFLOW_TUNER_MODEL ignored: the job spans several hosts")
            return None
        shm = [p for p in others if p in self._transport.shm_peers]
        if shm and len(shm) != len(others):
            log.warning("ringflow: RINGFLOW_TUNER_MODEL ignored: peers mix shared memory and TCP")
            return None
        model = load_cost_model(path, "shm" if shm or not others else "tcp")
        if not model.supports(self.size):
            log.warning("ringflow: RINGFLOW_TUNER_MODEL ignored: %s was not calibrated for %d ranks", path, self.size)
            return None
        return model

    def tune_with(self, model: CostModel | None) -> None:
        """Pick this communicator's algorithms with a cost model (`algorithms.selection.CostModel`, e.g. a
        `ringflow.hostmodel.HostCostModel`; None: the flat tuner again). Every rank must call it with the same
        model before its next collective, as RINGFLOW_TUNER_MODEL does at creation: ranks that chose
        differently fail the argument check."""
        if model is not None and not model.supports(self.size):
            raise InvalidArgument(f"the cost model was not calibrated for {self.size} ranks",
                                  "calibrate with the communicator's size among --ranks")
        self._host_model = model
        self._schedules.clear()
        self._calls.clear()

    # ---------------------------------------------------------------- state and failure
    def _on_data(self, peer: int, key: str) -> None:
        doorbell.ring(self._bells[lane_of(key, sending=False)].address)

    def _fail(self, exc: RingflowError) -> None:
        if self._failure is None:
            self._failure = exc
        for b in self._bells:
            doorbell.ring(b.address)

    def _note_mismatch(self, op_seq: int, message: str) -> None:
        self._mismatch_notes[op_seq] = message
        for b in self._bells:
            doorbell.ring(b.address)

    def _check_failure(self) -> None:
        if self._failure is not None:
            raise self._failure
        if self._mismatch_notes:
            op_seq, msg = next(iter(self._mismatch_notes.items()))
            self._failure = InvalidArgument(f"ranks disagree on the arguments of collective #{op_seq}: {msg}",
                                            "every rank must make the same calls; create a new communicator")
            raise self._failure

    def _usable(self) -> None:
        if self._destroyed:
            raise InvalidUsage("communicator is destroyed", "create a new one with ringflow.init()")
        if self._failure is not None:
            f = self._failure
            if isinstance(f, (RemoteError, Aborted)):
                raise type(f)(f.message, **({"rank": f.rank} if isinstance(f, RemoteError) else {}),
                              hint=f.hint)
            raise Aborted(f"communicator failed earlier: {f}", "create a new communicator (or shrink)")

    def _deadline(self, timeout: float | None) -> float:
        t = self.timeout if timeout is None else float(timeout)
        if t <= 0:
            raise InvalidArgument(f"timeout={timeout}", "give a positive number of seconds")
        return time.monotonic() + t

    def _run(self, lane: int, fn, async_op: bool, timeout: float | None, description: str, result: Any) -> Any:
        """Run fn(deadline) on a lane, synchronously or as a Work."""
        self._usable()
        ln = self._lanes[lane]
        if async_op:
            def job() -> None:
                self._usable()
                self._guard(fn, self._deadline(timeout), lane)
            return ln.submit(job, Work(description, result))
        deadline = self._deadline(timeout)
        if ln.busy:
            ln.quiesce(deadline)
        self._guard(fn, deadline, lane)
        return result

    def _guard(self, fn, deadline: float, lane: int) -> None:
        try:
            fn(deadline)
        except _Broken as exc:
            err = InvalidArgument(f"rank {exc.mismatch.peer} disagrees with this rank's call "
                                  f"({exc.mismatch.got_nbytes} bytes sent, {exc.mismatch.want_nbytes} expected)",
                                  "every rank must call the same collective with the same arguments; "
                                  "create a new communicator")
            self._failure = err
            self._watchdog.broadcast(Kind.MISMATCH, json.dumps({"message": str(err)}).encode(), op_seq=self._op_seq)
            raise err from None
        except Timeout:
            # a collective may have half-moved data: its channels can no longer be trusted
            if self._failure is None and lane == LANE_COLL:
                self._failure = Aborted("an earlier operation timed out mid-transfer",
                                        "create a new communicator")
            raise

    # ---------------------------------------------------------------- schedules
    def _schedule(self, coll: Collective, nbytes: int, root: int | None, dtype_size: int,
                  inplace: bool = False) -> Schedule:
        """The tuner's schedule for this call (cached per communicator, exact size and in-place-ness)."""
        key = (coll, nbytes, root, dtype_size, inplace)
        s = self._schedules.get(key)
        if s is not None:
            return s
        from .. import config as _cfg
        with _cfg.override(ALGO=self._algo_knob, NCHANNELS=self._nch_knob):
            s = pick_schedule(coll, nbytes, self.size, root, dtype_size, inplace, self._single_ring_bytes,
                              self._host_model)
        if len(self._schedules) > 1024:
            self._schedules.clear()
        self._schedules[key] = s
        return s

    def _scratch_for(self, dtype: np.dtype, n: int) -> np.ndarray:
        a = self._scratch.get(dtype)
        if a is None or a.shape[0] < n:
            a = np.empty(max(n, 1), dtype=dtype)
            self._scratch[dtype] = a
        return a[:n]

    def _prepare(self, schedule: Schedule, coll: Collective, count: int, dtype: np.dtype, opname: str | None,
                 root: int | None, inplace: bool, splits: tuple[tuple[int, ...], ...] | None) -> "_Prepared":
        shape = CallShape(coll, self.size, count, dtype.itemsize, splits)
        plan = compile_plan(schedule, shape, self.rank, inplace)
        sig = call_signature(coll.value, count, dtype, opname, root, schedule.algorithm, schedule.nchannels)
        desc = describe(coll.value, count, dtype, opname, root, schedule.algorithm)
        return _Prepared(schedule, plan, sig, desc, UFUNCS.get(opname or "sum", np.add),
                         Buffer.SCRATCH in schedule.layouts)

    def _execute(self, schedule: Schedule | None, coll: Collective, count: int, inp: np.ndarray, out: np.ndarray,
                 opname: str | None, root: int | None, deadline: float,
                 splits: tuple[tuple[int, ...], ...] | None = None, ident: tuple = ()) -> None:
        """Run one collective call; `schedule=None` asks the tuner (cached per call shape)."""
        dtype = out.dtype
        # ctypes.data costs a microsecond: only arrays that may overlap are compared by address
        inplace = inp is out or (inp.size > 0 and out.size > 0 and np.may_share_memory(inp, out)
                                 and inp.ctypes.data == out.ctypes.data)
        key = (coll, count, dtype, opname, root, inplace, splits, None if schedule is None else id(schedule))
        prep = self._calls.get(key)
        if prep is None or (schedule is not None and prep.schedule is not schedule):
            if schedule is None:
                isz = dtype.itemsize
                nbytes = (inp.size if splits is not None else count * (self.size if coll.per_rank_sized else 1)) * isz
                schedule = self._schedule(coll, nbytes, root, isz, inplace)
            prep = self._prepare(schedule, coll, count, dtype, opname, root, inplace, splits)
            if len(self._calls) > 4096:
                self._calls.clear()
            self._calls[key] = prep
        self.last_schedule = prep.schedule
        seq = self._op_seq
        self._op_seq += 1
        ctx = CallContext(self._transport, self._waiters[LANE_COLL], prep.sig, seq, prep.desc, deadline, self.size,
                          self.rank, self._checks, self._streams)
        small = ctx.ll = prep.plan.max_xfer_bytes < self._ll_bytes
        bound = prep.bound
        if small and ident and bound is not None and bound.refs[0] is ident[0] and bound.refs[1] is ident[1] \
                and (not prep.has_scratch or bound.refs[2] is self._scratch.get(dtype)) \
                and bound.refs[3] == _data_ptr(ident[0]) and bound.refs[4] == _data_ptr(ident[1]):
            run_bound(bound, ctx, prep.ufunc)  # same user arrays as last time: reuse the binding
            return
        arrays = {Buffer.IN: out if inplace else inp, Buffer.OUT: out}
        if prep.has_scratch:
            arrays[Buffer.SCRATCH] = self._scratch_for(dtype, prep.plan.scratch_elems)
        bound = bind(prep.plan, ctx, arrays, prep.ufunc,
                     (*ident, self._scratch.get(dtype), _data_ptr(ident[0]), _data_ptr(ident[1])) if ident else ())
        prep.bound = bound if (small and ident) else None
        run_bound(bound, ctx, prep.ufunc)

    def execute(self, schedule: Schedule, x: Any, out: Any = None, op: str = "sum", *, count: int | None = None,
                timeout: float | None = None, async_op: bool = False) -> Any:
        """Run any schedule (the same one on every rank) on x -> out; used by tests and calibration."""
        if schedule.nranks != self.size:
            raise InvalidArgument(f"schedule is for {schedule.nranks} ranks, communicator has {self.size}")
        xb = Buf(x, "x")
        ob = Buf(out, "out") if out is not None and out is not x else xb   # in place: one flat view, as all_reduce
        coll = schedule.collective
        n = count if count is not None else (xb.flat.size // self.size if partitioned(coll, Buffer.IN)
                                             else xb.flat.size)
        opname = parse_op(op) if coll.is_reduction else None
        return self._run(LANE_COLL, lambda d: self._execute(schedule, coll, n, xb.flat, ob.flat, opname,
                                                            schedule.root, d, ident=(xb.orig, ob.orig)),
                         async_op, timeout,
                         f"{coll.value}/{schedule.algorithm}", out if out is not None else x)

    # ---------------------------------------------------------------- collectives
    def _coll(self, coll: Collective, x: Buf, out: Buf, count: int, opname: str | None, root: int | None,
              async_op: bool, timeout: float | None, result: Any,
              splits: tuple[tuple[int, ...], ...] | None = None) -> Any:
        def fn(deadline: float) -> None:
            if self.size == 1:
                if out.flat is not x.flat and out.flat.size:
                    copy_into(out.flat, x.flat[:out.flat.size] if x.flat.size >= out.flat.size else x.flat)
                return
            self._execute(None, Collective.ALL_TO_ALLV if splits is not None else coll, count, x.flat, out.flat,
                          opname, root, deadline, splits, (x.orig, out.orig))
            if opname == "avg" and (coll != Collective.REDUCE or self.rank == root):
                finish_avg(out.flat, self.size)
        return self._run(LANE_COLL, fn, async_op, timeout, coll.value, result)

    def _root(self, root: int) -> int:
        if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < self.size:
            raise InvalidArgument(f"root={root!r} is not a rank of this communicator (size {self.size})",
                                  "ranks are group-local: 0 .. size-1")
        return int(root)

    @staticmethod
    def _same_type(a: Buf, b: Buf, what: str) -> None:
        if a.flat.dtype != b.flat.dtype:
            raise InvalidArgument(f"{what}: input dtype {a.flat.dtype} differs from output dtype {b.flat.dtype}",
                                  "use the same dtype for both")

    def all_reduce(self, x: Any, op: Any = "sum", *, out: Any = None, async_op: bool = False,
                   timeout: float | None = None) -> Any:
        """Reduce x across ranks; the result lands in x (or `out`) on every rank."""
        xb = Buf(x, "x")
        ob = Buf(out, "out") if out is not None else xb
        self._same_type(xb, ob, "all_reduce")
        if ob.flat.size != xb.flat.size:
            raise InvalidArgument(f"all_reduce: out has {ob.flat.size} elements, x has {xb.flat.size}",
                                  "out must be the size of x")
        return self._coll(Collective.ALL_REDUCE, xb, ob, xb.flat.size, parse_op(op), None, async_op, timeout,
                          out if out is not None else x)

    def broadcast(self, x: Any, root: int, *, async_op: bool = False, timeout: float | None = None) -> Any:
        """Copy root's x into x on every rank."""
        xb = Buf(x, "x")
        return self._coll(Collective.BROADCAST, xb, xb, xb.flat.size, None, self._root(root), async_op, timeout, x)

    def reduce(self, x: Any, root: int, op: Any = "sum", *, out: Any = None, async_op: bool = False,
               timeout: float | None = None) -> Any:
        """Reduce x across ranks into root's x (or `out`); other ranks' buffers are scratch."""
        xb = Buf(x, "x")
        ob = Buf(out, "out") if out is not None else xb
        self._same_type(xb, ob, "reduce")
        if ob.flat.size != xb.flat.size:
            raise InvalidArgument(f"reduce: out has {ob.flat.size} elements, x has {xb.flat.size}")
        return self._coll(Collective.REDUCE, xb, ob, xb.flat.size, parse_op(op), self._root(root), async_op,
                          timeout, out if out is not None else x)

    def _gather_out(self, xb: Buf, out: Any, what: str) -> tuple[Buf, Any]:
        if out is None:
            shape = (self.size * xb.shape[0], *xb.shape[1:]) if xb.shape else (self.size,)
            out = np.empty(shape, dtype=xb.flat.dtype)
        ob = Buf(out, "out")
        self._same_type(xb, ob, what)
        if ob.flat.size != self.size * xb.flat.size:
            raise InvalidArgument(f"{what}: out has {ob.flat.size} elements, needs {self.size} x {xb.flat.size}",
                                  "out must be n times the size of x (concatenation on axis 0)")
        return ob, out

    def all_gather(self, x: Any, out: Any = None, *, async_op: bool = False, timeout: float | None = None) -> Any:
        """Concatenate every rank's x on axis 0, on every rank."""
        xb = Buf(x, "x")
        ob, out = self._gather_out(xb, out, "all_gather")
        return self._coll(Collective.ALL_GATHER, xb, ob, xb.flat.size, None, None, async_op, timeout, out)

    def gather(self, x: Any, root: int, out: Any = None, *, async_op: bool = False,
               timeout: float | None = None) -> Any:
        """Concatenate every rank's x on axis 0, at root (other ranks may pass out=None)."""
        xb = Buf(x, "x")
        root = self._root(root)
        ob, out = self._gather_out(xb, out, "gather")
        return self._coll(Collective.GATHER, xb, ob, xb.flat.size, None, root, async_op, timeout, out)

    def _split_out(self, xb: Buf, out: Any, what: str) -> tuple[Buf, Any, int]:
        if xb.shape and xb.shape[0] % self.size:
            raise InvalidArgument(f"{what}: x.shape[0]={xb.shape[0]} is not divisible by {self.size} ranks",
                                  "pad x so its first dimension is a multiple of the communicator size")
        count = xb.flat.size // self.size
        if out is None:
            shape = (xb.shape[0] // self.size, *xb.shape[1:]) if xb.shape else (count,)
            out = np.empty(shape, dtype=xb.flat.dtype)
        ob = Buf(out, "out")
        self._same_type(xb, ob, what)
        if ob.flat.size != count:
            raise InvalidArgument(f"{what}: out has {ob.flat.size} elements, needs {count}",
                                  "out holds x.shape[0] // n rows")
        return ob, out, count

    def reduce_scatter(self, x: Any, op: Any = "sum", out: Any = None, *, async_op: bool = False,
                       timeout: float | None = None) -> Any:
        """Reduce x across ranks and give rank r the r-th 1/n of the result (rows of axis 0)."""
        xb = Buf(x, "x")
        ob, out, count = self._split_out(xb, out, "reduce_scatter")
        return self._coll(Collective.REDUCE_SCATTER, xb, ob, count, parse_op(op), None, async_op, timeout, out)

    def scatter(self, x: Any, root: int, out: Any = None, *, async_op: bool = False,
                timeout: float | None = None) -> Any:
        """Give rank r the r-th 1/n of root's x (other ranks pass an x of the same shape)."""
        xb = Buf(x, "x")
        root = self._root(root)
        ob, out, count = self._split_out(xb, out, "scatter")
        return self._coll(Collective.SCATTER, xb, ob, count, None, root, async_op, timeout, out)

    def all_to_all(self, x: Any, out: Any = None, *, send_counts: Sequence[int] | None = None,
                   recv_counts: Sequence[int] | None = None, async_op: bool = False,
                   timeout: float | None = None) -> Any:
        """Rank r sends its j-th part of x to rank j; equal parts, or counts (rows of axis 0) per rank."""
        xb = Buf(x, "x")
        n = self.size
        if send_counts is None and recv_counts is None:
            if xb.shape and xb.shape[0] % n:
                raise InvalidArgument(f"all_to_all: x.shape[0]={xb.shape[0]} is not divisible by {n}",
                                      "pass send_counts/recv_counts for uneven splits")
            if out is None:
                out = np.empty_like(xb.arr)
            ob = Buf(out, "out")
            self._same_type(xb, ob, "all_to_all")
            if ob.flat.size != xb.flat.size:
                raise InvalidArgument("all_to_all: out must have the size of x")
            return self._coll(Collective.ALL_TO_ALL, xb, ob, xb.flat.size // n, None, None, async_op, timeout, out)
        row = int(np.prod(xb.shape[1:])) if len(xb.shape) > 1 else 1
        sc = self._counts(send_counts, "send_counts")
        if sum(sc) * row != xb.flat.size:
            raise InvalidArgument(f"send_counts sum to {sum(sc)} rows but x has {xb.shape[0] if xb.shape else 0}",
                                  "send_counts[j] = rows of x for rank j")
        if recv_counts is None:
            counts = np.asarray(sc, dtype=np.int64)
            got = np.empty(n, dtype=np.int64)
            self.all_to_all(counts, got, timeout=timeout)
            rc = [int(v) for v in got]
        else:
            rc = self._counts(recv_counts, "recv_counts")
        if out is None:
            out = np.empty((sum(rc), *xb.shape[1:]), dtype=xb.flat.dtype)
        ob = Buf(out, "out")
        self._same_type(xb, ob, "all_to_all")
        if ob.flat.size != sum(rc) * row:
            raise InvalidArgument(f"all_to_all: out has {ob.flat.size} elements, recv_counts need {sum(rc) * row}")
        splits = [[0] * n for _ in range(n)]
        for j in range(n):
            splits[self.rank][j] = sc[j] * row
            splits[j][self.rank] = rc[j] * row
        if n > 1:
            splits[self.rank][self.rank] = sc[self.rank] * row
            if sc[self.rank] != rc[self.rank]:
                raise InvalidArgument(f"send_counts[{self.rank}]={sc[self.rank]} but recv_counts[{self.rank}]="
                                      f"{rc[self.rank]}", "what a rank sends itself must equal what it receives")
        tsplits = tuple(tuple(r) for r in splits)
        if n == 1:
            return self._coll(Collective.ALL_TO_ALL, xb, ob, xb.flat.size, None, None, async_op, timeout, out)
        return self._coll(Collective.ALL_TO_ALLV, xb, ob, 0, None, None, async_op, timeout, out, splits=tsplits)

    def _counts(self, counts: Sequence[int] | None, what: str) -> list[int]:
        if counts is None or len(counts) != self.size or any(int(c) < 0 for c in counts):
            raise InvalidArgument(f"{what} must list {self.size} non-negative counts", f"got {counts!r}")
        return [int(c) for c in counts]

    def barrier(self, timeout: float | None = None) -> None:
        """Wait until every rank of the communicator has reached the barrier."""
        def fn(deadline: float) -> None:
            if self.size == 1:
                return
            seq = self._op_seq
            self._op_seq += 1
            ctx = CallContext(self._transport, self._waiters[LANE_COLL], call_signature("barrier"), seq,
                              describe("barrier", 0, np.dtype("uint8"), None, None, "check"), deadline, self.size,
                              self.rank, True)
            check_exchange(ctx, [p for p in range(self.size) if p != self.rank])
        self._run(LANE_COLL, fn, False, timeout, "barrier", None)

    # ---------------------------------------------------------------- point to point
    def _peer(self, peer: int, what: str) -> int:
        if not isinstance(peer, (int, np.integer)) or not 0 <= int(peer) < self.size or int(peer) == self.rank:
            raise InvalidArgument(f"{what}={peer!r} is not another rank of this communicator (size {self.size}, "
                                  f"this rank {self.rank})", "ranks are group-local")
        return int(peer)

    @staticmethod
    def _tag(tag: int) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= int(tag) < 2**31:
            raise InvalidArgument(f"tag={tag!r}", "tags are integers in [0, 2**31)")
        return int(tag)

    def send(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send x to rank dst (matched in order by recv(src=this rank, tag=tag) there)."""
        self._p2p_send(x, dst, tag, False, timeout)

    def isend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Work:
        """Asynchronous send; do not modify x until the Work completes."""
        return self._p2p_send(x, dst, tag, True, timeout)

    def _p2p_send(self, x: Any, dst: int, tag: int, async_op: bool, timeout: float | None) -> Any:
        xb, dst, tag = Buf(x, "x"), self._peer(dst, "dst"), self._tag(tag)

        def fn(deadline: float) -> None:
            op = self._transport.out(dst, f"p{tag}", deadline).send(xb.flat.view(np.uint8), Kind.DATA, 0, 0, tag)
            drive([op], self._waiters[LANE_SEND], deadline, f"send to rank {dst}")
        return self._run(LANE_SEND, fn, async_op, timeout, f"send to {dst}", None)

    def recv(self, x: Any, src: int, tag: int = 0, timeout: float | None = None) -> Any:
        """Receive into x (in place) from rank src; the message must have x's size."""
        return self._p2p_recv(x, src, tag, False, timeout)

    def irecv(self, x: Any, src: int, tag: int = 0, timeout: float | None = None) -> Work:
        """Asynchronous recv into x."""
        return self._p2p_recv(x, src, tag, True, timeout)

    def _p2p_recv(self, x: Any, src: int, tag: int, async_op: bool, timeout: float | None) -> Any:
        xb, src, tag = Buf(x, "x"), self._peer(src, "src"), self._tag(tag)

        def fn(deadline: float) -> None:
            u8 = xb.flat.view(np.uint8)
            op = self._transport.inn(src, f"p{tag}").recv(Sink(u8), u8.shape[0], 0, check=False, op_seq=0, tag=tag)
            drive([op], self._waiters[LANE_RECV], deadline, f"recv from rank {src}")
            if op.mismatch is not None:
                raise InvalidArgument(f"recv from rank {src} (tag {tag}): message has {op.mismatch.got_nbytes} bytes, "
                                      f"the buffer {u8.shape[0]}", "send and receive buffers must have equal size")
        return self._run(LANE_RECV, fn, async_op, timeout, f"recv from {src}", x)

    # ---------------------------------------------------------------- groups
    def split(self, color: int | None, key: int = 0, timeout: float | None = None) -> "Communicator | None":
        """Collective: ranks with equal color form a new communicator, ordered by (key, rank); None: no group."""
        self._usable()
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise InvalidArgument(f"color={color!r}", "color is an int >= 0, or None to join no group")
        k = self._nsplit
        self._nsplit += 1
        t = self.timeout if timeout is None else float(timeout)
        self._store.set(f"split{k}/{self.rank}", json.dumps([None if color is None else int(color), int(key)]))
        self._store.wait([f"split{k}/{r}" for r in range(self.size)], t)
        entries = [json.loads(self._store.get(f"split{k}/{r}", t)) for r in range(self.size)]
        if color is None:
            return None
        members = sorted((e[1], r) for r, e in enumerate(entries) if e[0] == int(color))
        new_rank = [r for _, r in members].index(self.rank)
        return Communicator(self._sh, f"{self.ns}/s{k}c{int(color)}", new_rank, len(members))

    def new_group(self, ranks: Sequence[int], timeout: float | None = None) -> "Communicator | None":
        """Collective over all ranks: a communicator of `ranks` (in that order); None on non-members."""
        rs = [int(r) for r in ranks]
        if len(set(rs)) != len(rs) or any(not 0 <= r < self.size for r in rs) or not rs:
            raise InvalidArgument(f"new_group ranks {list(ranks)} must be distinct ranks of 0..{self.size - 1}")
        if self.rank in rs:
            return self.split(0, rs.index(self.rank), timeout)
        return self.split(None, 0, timeout)

    def shrink(self, exclude: Sequence[int] = (), timeout: float | None = None) -> "Communicator":
        """Collective over the survivors: a new communicator without dead (or excluded) ranks; destroys this one."""
        from .recovery import shrink
        return shrink(self, exclude, timeout)

    # ---------------------------------------------------------------- memory
    def alloc(self, shape: int | Sequence[int], dtype: Any = np.float32) -> np.ndarray:
        """An array in a shared-memory segment that same-host peers map: collectives send from it by
        reference (no staging copy; the receiver reduces or copies straight out of it). Its name is
        removed when the communicator is destroyed; the array itself stays valid."""
        self._usable()
        dt = np.dtype(dtype)
        shp = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        count = int(np.prod(shp)) if shp else 1
        nbytes = count * dt.itemsize
        regions = self._transport.regions
        rid, mm = regions.create(nbytes)
        arr = np.frombuffer(mm, dtype=dt, count=count).reshape(shp)
        if nbytes:
            regions.register(rid, arr.ctypes.data, nbytes)
        return arr

    # ---------------------------------------------------------------- lifetime
    def abort(self) -> None:
        """Abort: every pending and future operation raises Aborted; peers learn it. Thread-safe."""
        if self._failure is None or not isinstance(self._failure, Aborted):
            self._failure = Aborted(f"communicator aborted by rank {self.rank}",
                                    "create a new communicator (or shrink) to continue")
        for b in self._bells:
            doorbell.ring(b.address)
        self._watchdog.broadcast(Kind.ABORT)

    def destroy(self) -> None:
        """Release sockets, shared memory and threads. Idempotent."""
        if self._destroyed:
            return
        try:
            for ln in self._lanes:
                try:
                    ln.quiesce(time.monotonic() + min(self.timeout, 30.0))
                except Timeout:
                    self.abort()
            if self._failure is None:
                dead = set(self._watchdog.dead) | set(self._watchdog.departed)
                self._transport.flush(time.monotonic() + min(self.timeout, 10.0), dead)
        finally:
            self._destroyed = True
            self._watchdog.broadcast(Kind.BYE)
            self._teardown()
            with self._sh.lock:
                self._sh.users -= 1
                last = self._sh.users <= 0
            if last:
                self._sh.store.close()
                if self._sh.server is not None:
                    self._sh.server.close()

    def _teardown(self) -> None:
        for ln in getattr(self, "_lanes", []):
            ln.close()
        if hasattr(self, "_transport"):
            try:
                self._transport.close()
            except RingflowSystemError:
                pass
        for obj in ("_listener", "_watchdog"):
            o = getattr(self, obj, None)
            if o is not None:
                o.close()
        for b in getattr(self, "_bells", []):
            b.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and not isinstance(exc, (InvalidArgument, InvalidUsage)):
            self.abort()
        self.destroy()

    def __repr__(self) -> str:
        return f"<ringflow.Communicator rank {self.rank}/{self.size} ns={self.ns}>"


def init(rank: int | None = None, world_size: int | None = None, store_addr: str | None = None, *,
         timeout: float | None = None, traffic_class: int | None = None, secret: str | None = None) -> Communicator:
    """Join (or start) a job and return the world communicator; arguments default to the launcher's env."""
    info = detect(rank, world_size, store_addr, secret)
    logs.setup(info.rank)
    timeout_s = float(config.get("TIMEOUT") if timeout is None else timeout)
    tos = config.get("TRAFFIC_CLASS") if traffic_class is None else int(traffic_class)
    if tos is not None and not -1 <= tos <= 255:
        raise InvalidArgument(f"traffic_class={tos}", "an IP TOS byte 0..255 (DSCP << 2), or -1 for unset")
    tos = None if tos is None or tos < 0 else tos
    sec = auth.secret_bytes(info.secret)
    server = None
    host, port = info.store_host, info.store_port
    if info.rank == 0 and port == 0:
        server = StoreServer(host, port, sec)
        host, port = server.address
    elif info.rank == 0:
        try:
            server = StoreServer(host, port, sec)
        except RingflowSystemError:
            server = None  # somebody (the launcher, `ringflow store`) already serves it
    store = Store(host, port, sec, timeout=timeout_s)
    try:
        arrivals = store.add(f"ringflow/{info.job_id}/arrivals", 1)
    except RingflowError:
        store.close()
        raise
    gen = (arrivals - 1) // info.world_size
    shared = _Shared(store, server, info.job_id, sec, timeout_s, tos)
    try:
        return Communicator(shared, f"{info.job_id}.g{gen}", info.rank, info.world_size)
    except BaseException:
        store.close()
        if server is not None:
            server.close()
        raise
