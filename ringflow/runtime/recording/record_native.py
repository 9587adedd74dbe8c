"""The recorder a new communicator gets (`attach`), and its per-call path in C where it was built
(native/_record.c): `recorder_class()` is the one place that picks it or record.py's `Recorder`, whose Python
`call` and `pack_rows` stay the reference (used with RINGFLOW_NATIVE=0 or when no compiler built the module). Both
make the same entries and rows. The C recorder keeps its last calls in a C ring (`calls`, `_record.Ring`): in
memory, and in the flight ring file once one is opened; a synchronous collective is kept there as fields, its
entry list made only when read (`ring`, `last`). The C side remembers ringflow's own code (record._internal) in a
table keyed by the code object's address, filling and reading record._internal where its table has no answer."""
from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import config
from ..native import _record, record_native
from . import flightring, record
from .record import Recorder


class NativeRecorder(Recorder):
    """A Recorder whose `call` (call site, entry, ring and pending, the guarded call and its times) runs in C, its
    last calls kept in a C ring (`calls`)."""

    if _record is not None:
        call = _record.call
        run = _record.run
        pack_rows = staticmethod(_record.pack)

    def __init__(self, comm: Any, ring_n: int, record_dir: str) -> None:
        self.calls = _record.Ring(None, 0, max(1, ring_n), None, comm=weakref.proxy(comm), size=int(comm.size))
        super().__init__(comm, ring_n, record_dir)

    @property   # type: ignore[override]
    def ring(self) -> list[list[Any]]:
        """The last calls' entries, oldest first."""
        return self.calls.entries()

    @ring.setter
    def ring(self, value: Any) -> None:   # Recorder's own (the Python recorder's, were the class switched)
        self.__dict__["ring"] = value

    @property
    def last(self) -> list[Any] | None:
        """The latest collective's entry."""
        return self.calls.last()

    @last.setter
    def last(self, value: Any) -> None:
        self.__dict__["last"] = value

    @property
    def coll_seq(self) -> int:
        """The next collective's sequence number."""
        return int(self.calls.coll_seq)

    @coll_seq.setter
    def coll_seq(self, value: int) -> None:
        self.calls.coll_seq = self.__dict__["coll_seq"] = value

    def open_ring(self, directory: Path, nslots: int) -> None:
        """Create this communicator's ring file in `directory`: the C ring writes every call into it from now on."""
        mm, slots_at = self.ring_file(directory, nslots)
        self.calls.attach(mm, slots_at, flightring.Names(mm))
        self.fring_map, self.fring = mm, self.calls

    def keep(self, e: list[Any]) -> None:
        """Keep a new entry in the C ring (and its file)."""
        self.calls.enter(e)


def term_handler() -> Callable[[], bool] | None:
    """The C module's install_term_handler (SIGTERM marks the rings ended) where it is built and picked."""
    mod = record_native()
    return None if mod is None else mod.install_term_handler


def recorder_class() -> type[Recorder]:
    """NativeRecorder when the C module is built and RINGFLOW_NATIVE is on, else Recorder; hands the C side
    record.py's caches and knobs as they are now."""
    mod = record_native()
    if mod is None:
        return Recorder
    mod.setup(record._internal, record._queued, record._is_internal, record.MAX_WALK, record.FLUSH_EVERY)
    return NativeRecorder


def attach(comm: Any) -> Recorder | None:
    """The recorder of a new communicator (None when both the flight recorder and recording are off).

    Recording aligns clocks: every rank passes a barrier and notes when it left it."""
    record_dir = str(config.get("RECORD") or "")
    # the ring costs every call some time: kept only where its records can be written
    ring_n = int(config.get("FLIGHT_RECORDER")) if record.dump_dir() is not None else 0
    if ring_n <= 0 and not record_dir:
        return None
    rec = recorder_class()(comm, ring_n, record_dir)
    d = record.dump_dir()
    if ring_n > 0 and d is not None:
        try:
            rec.open_ring(d, ring_n)
        except OSError as exc:   # the flight recorder must not stop the job: it keeps its records in memory
            record.log.warning("ringflow: no flight ring in %s (%s): records stay in memory", d, exc)
    if record_dir:
        comm.barrier()
        rec.barrier_ns = record._now()
        record._proc.open_record(record_dir, rec.grank)
        record._proc.write([rec.info()])
        if "/" not in comm.ns and comm.rank == 0:
            record._write_manifest(Path(record_dir), comm)
    wd = getattr(comm, "_watchdog", None)
    if wd is not None:   # a peer's death (or abort) seen by the watchdog: write the flight record once
        told = wd.on_failure

        def on_failure(exc: Any) -> None:
            told(exc)
            if not rec.reason:
                rec.reason = f"{type(exc).__name__}: {exc}"
                record.dump_all(rec.reason)
        wd.on_failure = on_failure
    record._proc.rank = rec.grank if record._proc.rank is None else record._proc.rank
    record._proc.recorders.add(rec)
    record._proc.hook_signals(term_handler())
    return rec
