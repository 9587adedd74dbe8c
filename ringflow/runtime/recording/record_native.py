"""The recorder a new communicator gets (`attach`), and its per-call path in C where it was built
(native/_record.c): `recorder_class()` is the one
place that picks it or record.py's `Recorder`, whose Python `call` and `pack_rows` stay the reference (used
with RINGFLOW_NATIVE=0 or when no compiler built the module). Both make the same entries and rows; the C side
remembers call-site depths and ringflow's own code (record._sites, record._internal) in tables keyed by the code
object's address, filling and reading record._internal where its table has no answer."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import config
from ..native import _record, record_native
from . import record
from .record import Recorder


class NativeRecorder(Recorder):
    """A Recorder whose `call` (call site, entry, rings and pending, the guarded call and its times) runs in C."""

    if _record is not None:
        call = _record.call
        pack_rows = staticmethod(_record.pack)
        ring_class = _record.Ring


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
    # the ring costs every call about a microsecond: kept only where its records can be written
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
