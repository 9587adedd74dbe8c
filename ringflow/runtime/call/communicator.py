"""The Communicator: collectives and point-to-point on NumPy arrays / CPU tensors between processes.

The calls live in mixins (`collectives`, `p2p`, `groups`); joining a job is `rendezvous`. This module
holds the communicator's state, its schedule cache and execution, failure handling and lifetime.
Building one (``init`` or ``split``/``new_group``): agree on a namespace in the store, open a
listener on the selected interface and the lane doorbells, publish a card (host id, address,
port), read everyone's card, connect the control sockets (watched by the Watchdog) and make
the Transport (shared memory to same-host peers, TCP to others). Collectives pick a schedule
(`algorithms.tuner` / `registry`) and run it with the executor; ranks are always group-local.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import mmap
import os
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ... import config
from ...algorithms import check_rounds
from ...algorithms.layout import CallShape, partitioned
from ...algorithms.plan import compile_plan
from ...algorithms.schedule import Buffer, Collective, Schedule
from ...algorithms.selection import CostModel, pattern_for, pick_schedule
from ...errors import Aborted, InvalidArgument, InvalidUsage, RemoteError, RingflowError, RingflowSystemError, Timeout
from .. import native
from ..job.plugins import load_cost_model
from ..job.rendezvous import SharedState, host_id, join
from ..job.store import PrefixStore
from ..logs import tracing
from ..recording.record import Recorder, dump_all
from ..recording.record_native import attach
from ..transport import doorbell
from ..transport.frames import Kind, call_signature
from ..transport.manager import LANE_COLL, PeerCard, Transport, buffsize, lane_of
from ..transport.tcp import Listener, dial, select_interface
from . import hotpath
from .callmemory import MAX_PREPARED, MAX_SCHEDULES, CallMemory, state_of
from .collectives import CollectiveCalls
from .executor import GOODBYE_GRACE_S, CallContext, Waiter, _Broken, bind, describe, run_bound
from .groups import Groups
from .identity import set_default
from .objects import ObjectCalls
from .ops import UFUNCS, Buf, parse_op, same_memory
from .p2p import PointToPoint
from .watchdog import Watchdog
from .work import LANE_THREADS, Lane, Work

log = logging.getLogger("ringflow.runtime")

TCP_STREAMS = 2  # sockets a large TCP transfer is striped over (RINGFLOW_NCHANNELS overrides)


class _Prepared:
    """Everything a repeated call needs, computed once per (collective, count, dtype, op, root, in-place)."""

    __slots__ = ("schedule", "plan", "sig", "desc", "ufunc", "has_scratch", "bound", "hot")

    def __init__(self, schedule: Schedule, plan: Any, sig: int, desc: str, ufunc: Any, has_scratch: bool) -> None:
        self.schedule, self.plan, self.sig, self.desc = schedule, plan, sig, desc
        self.ufunc, self.has_scratch = ufunc, has_scratch
        self.bound: Any = None  # the binding of the last small call, reused while its arrays are the same
        # the native plans (hotpath.Prepared); None until built, hotpath.UNSUITED where they cannot run
        self.hot: hotpath.Prepared | bool | None = None


class Communicator(CollectiveCalls, ObjectCalls, PointToPoint, Groups):
    """A group of ranks that run collectives together. Create with `ringflow.init()`."""

    def __init__(self, shared: SharedState, ns: str, rank: int, size: int) -> None:
        self._sh = shared
        self.ns, self.rank, self.size = ns, rank, size
        self.timeout = shared.timeout_s
        self._store = PrefixStore(ns, shared.store)
        self.uid = self._agree_uid(shared.job, ns)
        self._failure: RingflowError | None = None
        self._mismatch_notes: dict[int, str] = {}
        self._destroyed = False
        self._op_seq = 0
        self._last_call: tuple[int, str] = (-1, "")   # the latest collective this rank entered: (op_seq, what)
        self._in_call = False
        self._rec: Recorder | None = None   # the flight recorder / call recorder (record.py); None: both off
        self._nsplit = 0
        self._nshrink = 0  # shrinks begun on this communicator (recovery.agree: the store namespace of each)
        # made by shrink(): new rank i was rank parent_ranks[i] of the old communicator; None otherwise
        self.parent_ranks: tuple[int, ...] | None = None
        self._scratch: dict[np.dtype, np.ndarray] = {}
        self._mem = CallMemory()   # every remembered choice, plan and call: reset as a unit
        self.last_schedule: Schedule | None = None   # the schedule of the latest collective this rank ran
        self._owner = threading.current_thread()   # the thread that makes this communicator's calls
        self._owner_id = self._owner.ident
        self._allocs: list[mmap.mmap] = []
        self._lanes = [Lane("collectives"), Lane("p2p-send"), Lane("p2p-recv")]
        self._fast_doors()
        # knobs are read once, when the communicator is created (as NCCL does)
        self._checks = not config.get("CHECKS_DISABLE")
        self._check_knob = str(config.get("CHECK_ROUNDS"))
        self._algo_knob, self._nch_knob = config.get("ALGO"), config.get("NCHANNELS")
        self._streams = int(self._nch_knob) if int(self._nch_knob) > 0 else TCP_STREAMS
        self._ll_bytes = int(config.get("LL_THRESHOLD"))
        self._native = native.hot_available() and not tracing[0]   # TRACE logs every step: the Python executor
        self._single_ring_bytes = int(config.get("SINGLE_RING_THRESHOLD"))
        deadline = time.monotonic() + self.timeout
        self._bells = [doorbell.Doorbell(doorbell.address(shared.job, self.uid, rank, lane)) for lane in range(3)]
        self._watchdog = Watchdog(rank, self._fail, self._note_mismatch, self._on_departed, self._status)
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
            self._mem.reset(self._load_host_model(str(config.get("TUNER_MODEL") or ""), cards))
        except BaseException:
            self._teardown()
            raise
        self._waiters = [Waiter(b, self._transport.local_ranks, self._check_failure, self._watchdog.departed)
                         for b in self._bells]
        self.cards = cards
        with shared.lock:
            shared.users += 1
        log.info("ringflow: communicator %s rank %d/%d ready, listening on %s:%d, shm peers %s, tcp peers %s", ns,
                 rank, size, *self._listener.address, sorted(self._transport.shm_peers),
                 [p for p in range(size) if p != rank and p not in self._transport.shm_peers])
        try:
            self._rec = attach(self)
        except BaseException:
            self.destroy()
            raise

    def _agree_uid(self, job: str, ns: str) -> str:
        """This communicator's id, which names its shared-memory segments and doorbells: a hash of the job, the
        namespace and a random nonce the first rank to arrive puts in the authenticated store, so the names cannot
        be guessed (and pre-created) from a predictable job id."""
        _, nonce = self._store.compare_set("uid-nonce", None, secrets.token_hex(16).encode())
        if not nonce:
            raise RingflowSystemError("the store returned no communicator nonce", "check the rendezvous store")
        return hashlib.sha256(f"{job}|{ns}|".encode() + nonce).hexdigest()[:16]

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
        `ringflow.hostmodel.HostCostModel`; None: the flat tuner again), and check arguments in the pattern that
        model prices lower (`selection.pattern_for`). Every rank must call it with the same model before its next
        collective, as RINGFLOW_TUNER_MODEL does at creation: ranks that chose differently fail the argument
        check, or, where their check patterns differ, time out."""
        if model is not None and not model.supports(self.size):
            raise InvalidArgument(f"the cost model was not calibrated for {self.size} ranks",
                                  "calibrate with the communicator's size among --ranks")
        self._mem.reset(model)

    def _pattern(self) -> tuple[str, int]:
        """The argument check's pattern and its log-depth rounds (0 for pairs): the one the communicator's model
        prices lower (`selection.pattern_for`; RINGFLOW_CHECK_ROUNDS, read at creation, may force one), priced on
        the first call that needs it (a communicator that never runs a collective never prices it)."""
        mem = self._mem
        if mem.pattern is None:
            pattern = pattern_for(self.size, mem.model, self._check_knob) if self._checks else "pairs"
            mem.pattern, mem.rounds = pattern, (check_rounds.rounds(self.size) if pattern == "log" else 0)
        return mem.pattern, mem.rounds

    def bind_thread(self) -> None:
        """Make the calling thread the one that makes this communicator's calls from now on (a communicator serves
        one thread, as NCCL requires; its own lanes run the asynchronous calls that thread queued)."""
        if self._in_call:
            raise InvalidUsage(f"thread {self._owner.name!r} is inside a call on this communicator",
                               "hand the communicator over between calls")
        self._owner = threading.current_thread()
        self._owner_id = self._owner.ident

    def _own_thread(self, what: str) -> None:
        """InvalidUsage unless the calling thread is this communicator's (or one of the lanes running its queued
        calls): calls from two threads could pair differently on different ranks."""
        me = threading.get_ident()
        if me == self._owner_id or me in LANE_THREADS:
            return
        if not self._owner.is_alive():   # the owning thread ended: the next thread to call takes over
            self._owner = threading.current_thread()
            self._owner_id = me
            return
        cur = threading.current_thread()
        raise InvalidUsage(f"thread {cur.name!r} (id {me}) called {what} on a communicator that thread "
                           f"{self._owner.name!r} (id {self._owner_id}) uses",
                           "make every call on a communicator from one thread (NCCL's rule), queue work with "
                           "async_op=True, or hand it over with comm.bind_thread() between calls")

    # ---------------------------------------------------------------- state and failure
    def _on_data(self, peer: int, key: str) -> None:
        doorbell.ring(self._bells[lane_of(key, sending=False)].address)

    def _on_departed(self, peer: int) -> None:
        """A peer said goodbye: wake this rank's waits so a call still waiting on it can say so."""
        for b in self._bells:
            doorbell.ring(b.address)

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
            from .calltext import hint
            self._failure = InvalidArgument(f"ranks disagree on the arguments of collective #{op_seq}: {msg}",
                                            hint("broken"), detail={"reason": "out_of_step", "op_seq": op_seq})
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

    def _run(self, lane: int, fn, async_op: bool, timeout: float | None, description: str, result: Any,
             meta: tuple | None = None) -> Any:
        """Run fn(deadline) on a lane, synchronously or as a Work; `meta` describes the call to the recorder."""
        self._usable()
        self._own_thread(description)
        ln = self._lanes[lane]
        rec = self._rec
        if async_op:
            e = None if rec is None else rec.enter(lane, description, meta, True)

            def job() -> None:
                self._usable()
                if rec is None or e is None:
                    self._guard(fn, self._deadline(timeout), lane)
                else:
                    rec.call(lane, description, meta, self._guard, fn, self._deadline(timeout), entry=e)
            work = Work(description, result)
            if rec is not None and e is not None:
                work.on_wait = functools.partial(rec.waited, e)
            return ln.submit(job, work)
        deadline = self._deadline(timeout)
        if ln.busy:
            ln.quiesce(deadline)
        if rec is None:
            self._guard(fn, deadline, lane)
        else:
            rec.call(lane, description, meta, self._guard, fn, deadline)
        return result

    def _guard(self, fn, deadline: float, lane: int) -> None:
        try:
            fn(deadline)
        except _Broken as exc:
            from .calltext import both_calls, hint, parse_call
            m = exc.mismatch
            text, third, detail = both_calls(self._watchdog, self.rank, self._last_call, m.peer, parse_call(m.detail),
                                             m.got_nbytes, m.want_nbytes)
            out_of_step = "; data had moved, so the communicator's channels are out of step"
            err = InvalidArgument(text + out_of_step, hint("broken"), detail={**detail, "out_of_step": True})
            self._failure = err
            self._watchdog.broadcast(Kind.MISMATCH, json.dumps({"message": third + out_of_step}).encode(),
                                     op_seq=self._last_call[0])
            raise err from None
        except InvalidArgument as exc:
            d = exc.detail
            if lane == LANE_COLL and d is not None and "relayed_to" in d:
                self._watchdog.tell_call(*self._last_call)   # the rank that found it may wait for this rank's call
            if lane != LANE_COLL or d is None or d.get("reason") != "mismatch" or "rank" in d:
                raise
            from .calltext import both_calls
            text, _, detail = both_calls(self._watchdog, self.rank, self._last_call, int(d["peer"]), d["peer_call"],
                                         d["peer_nbytes"], d["expected_nbytes"])
            raise InvalidArgument(text, exc.hint, detail=detail) from None
        except RemoteError as exc:
            left = self._departed_name(exc.rank)
            if left is None:
                raise
            raise RemoteError(f"rank {exc.rank} left the communicator (destroy() or the end of its `with` block) "
                              f"while this rank's call needed it", rank=exc.rank, hint=left) from None
        except Timeout as exc:
            # a collective may have half-moved data: its channels can no longer be trusted
            from .calltext import hint
            if self._failure is None and lane == LANE_COLL:
                self._failure = Aborted("an earlier operation timed out mid-transfer", hint("timed_out_before"))
            if lane == LANE_COLL and self._in_call:
                text, detail = self._who_did_not_arrive(exc.detail)
                raise Timeout(text, exc.hint, detail=detail) from None
            raise
        finally:
            if lane == LANE_COLL:
                self._in_call = False

    def _status(self) -> dict[str, object]:
        """What this rank answers a peer's STATUS_QUERY with (read by the watchdog thread)."""
        seq, what = self._last_call
        st: dict[str, object] = {"op_seq": seq, "call": what, "in_call": self._in_call}
        if self._rec is not None:
            st.update(self._rec.status())
        return st

    def _who_did_not_arrive(self, detail: dict[str, Any] | None = None,
                            wait_s: float = 0.5) -> tuple[str, dict[str, Any]]:
        """Which peers have not entered this rank's current collective and what each was last doing: a sentence and
        its structured detail (`detail`: the executor's, naming the peers the call waited on)."""
        from .calltext import timeout_detail, timeout_sentence
        seq, what = self._last_call
        peers = [p for p in range(self.size) if p != self.rank and p not in self._watchdog.dead]
        answers = self._watchdog.ask_status(peers, wait_s)
        silent = [p for p in peers if p not in answers]
        waiting_on = list((detail or {}).get("waiting_on", []))
        full = {**(detail or {}), **timeout_detail(what, seq, waiting_on, answers, silent), "rank": self.rank}
        return timeout_sentence(what, seq, waiting_on, answers, silent), full

    def _departed_name(self, peer: int | None) -> str | None:
        """The fix hint for a peer that said goodbye (its closed connection may beat its goodbye by a moment:
        wait up to GOODBYE_GRACE_S for it); None if `peer` did not say goodbye."""
        if peer is None:
            return None
        end = time.monotonic() + GOODBYE_GRACE_S
        while peer not in self._watchdog.departed and peer not in self._watchdog.dead and time.monotonic() < end:
            time.sleep(0.005)
        if peer not in self._watchdog.departed:
            return None
        from .calltext import hint
        return hint("departed")

    # ---------------------------------------------------------------- schedules
    def _schedule(self, coll: Collective, nbytes: int, root: int | None, dtype_size: int,
                  inplace: bool = False) -> Schedule:
        """The tuner's schedule for this call (cached per communicator, exact size and in-place-ness)."""
        key = (coll, nbytes, root, dtype_size, inplace)
        mem = self._mem
        s = mem.schedules.get(key)
        if s is not None:
            return s
        from ... import config as _cfg
        with _cfg.override(ALGO=self._algo_knob, NCHANNELS=self._nch_knob), check_rounds.using(self._pattern()[0]):
            s = pick_schedule(coll, nbytes, self.size, root, dtype_size, inplace, self._single_ring_bytes,
                              mem.model)
        if len(mem.schedules) >= MAX_SCHEDULES:
            mem.schedules.clear()
        mem.schedules[key] = s
        return s

    def _scratch_for(self, dtype: np.dtype, n: int) -> np.ndarray:
        a = self._scratch.get(dtype)
        if a is None or a.shape[0] < n:
            a = np.empty(max(n, 1), dtype=dtype)
            self._scratch[dtype] = a
        return a[:n]

    def _prepare(self, schedule: Schedule, coll: Collective, count: int, dtype: np.dtype, opname: str | None,
                 root: int | None, inplace: bool, splits: tuple[tuple[int, ...], ...] | None) -> _Prepared:
        shape = CallShape(coll, self.size, count, dtype.itemsize, splits)
        with check_rounds.using(self._pattern()[0]):
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
        inplace = same_memory(inp, out)   # partial overlaps were copied by ops.unaliased
        key = (coll, count, dtype, opname, root, inplace, splits, None if schedule is None else id(schedule))
        calls = self._mem.prepared
        prep = calls.get(key)
        if prep is None or (schedule is not None and prep.schedule is not schedule):
            if schedule is None:
                isz = dtype.itemsize
                nbytes = (inp.size if splits is not None else count * (self.size if coll.per_rank_sized else 1)) * isz
                schedule = self._schedule(coll, nbytes, root, isz, inplace)
            prep = self._prepare(schedule, coll, count, dtype, opname, root, inplace, splits)
            if len(calls) >= MAX_PREPARED:
                calls.clear()
            calls[key] = prep
        self.last_schedule = prep.schedule
        seq = self._op_seq
        self._op_seq += 1
        self._last_call, self._in_call = (seq, prep.desc), True
        ctx = CallContext(self._transport, self._waiters[LANE_COLL], prep.sig, seq, prep.desc, deadline, self.size,
                          self.rank, self._checks, self._streams, self._pattern()[1])
        small = ctx.ll = prep.plan.max_xfer_bytes < self._ll_bytes
        if self._native:
            hot = prep.hot
            if hot is None:
                hot = prep.hot = hotpath.prepare(prep.plan, ctx, dtype, opname, inplace)
            if isinstance(hot, hotpath.Prepared):
                scratch = self._scratch_for(dtype, prep.plan.scratch_elems) if prep.has_scratch else out
                addr = hotpath.address
                o = addr(out)
                bases = (o if inplace else addr(inp), o, o if scratch is out else addr(scratch))
                hotpath.execute(hot, ctx, bases, self._transport.regions.packed)
                self._last_native = (prep, hot, ctx, bases, None if scratch is out else scratch)
                return
        bound = prep.bound
        # the binding keeps its arrays (and so their dtypes, which their states name) alive
        state = (state_of(ident[0]), state_of(ident[1])) if small and ident and ident[0] is not None else None
        if state is not None and bound is not None and bound.refs[0] is ident[0] and bound.refs[1] is ident[1] \
                and bound.refs[2] == state and (not prep.has_scratch or bound.refs[3] is self._scratch.get(dtype)):
            run_bound(bound, ctx, prep.ufunc)  # the same user arrays in the same state as last time
            return
        arrays = {Buffer.IN: out if inplace else inp, Buffer.OUT: out}
        if prep.has_scratch:
            arrays[Buffer.SCRATCH] = self._scratch_for(dtype, prep.plan.scratch_elems)
        bound = bind(prep.plan, ctx, arrays, prep.ufunc,
                     (ident[0], ident[1], state, self._scratch.get(dtype)) if state is not None else ())
        prep.bound = bound if state is not None else None
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
                         f"{coll.value}/{schedule.algorithm}", out if out is not None else x,
                         meta=(coll, xb.flat.dtype, xb.flat.size, schedule.root, opname))

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
    def dump(self, path: str | os.PathLike[str] | None = None) -> str | None:
        """Write this process's flight records (the last calls of each communicator) to `path`, default
        RINGFLOW_DUMP_DIR (or RINGFLOW_RECORD)/flight-rank<R>.json; the path written, None if nowhere."""
        if self._rec is None:
            raise InvalidUsage("the flight recorder is off", "set RINGFLOW_DUMP_DIR (where flight records go) and "
                               "RINGFLOW_FLIGHT_RECORDER to a positive count before creating the communicator")
        p = dump_all("comm.dump()", path)
        return None if p is None else str(p)

    def abort(self) -> None:
        """Abort: every pending and future operation raises Aborted; peers learn it. Thread-safe."""
        if self._failure is None or not isinstance(self._failure, Aborted):
            self._failure = Aborted(f"communicator aborted by rank {self.rank}",
                                    "create a new communicator (or shrink) to continue")
        self._mem.reset(self._mem.model, self._mem.pattern, self._mem.rounds)
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
            self._mem.reset()
            if self._rec is not None:
                self._rec.close()
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

    def __enter__(self) -> Communicator:
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
    shared, ns, rank_, size = join(rank, world_size, store_addr, timeout=timeout, traffic_class=traffic_class,
                                   secret=secret)
    try:
        comm = Communicator(shared, ns, rank_, size)
    except BaseException:
        shared.store.close()
        if shared.server is not None:
            shared.server.close()
        raise
    set_default(comm)
    return comm
