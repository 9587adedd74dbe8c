"""The call recorder's per-call path in C where it was built (native/_record.c): `recorder_class()` is the one
place that picks it or record.py's `Recorder`, whose Python `call` and `pack_rows` stay the reference (used
with RINGFLOW_NATIVE=0 or when no compiler built the module). Both make the same entries and rows; the C side
remembers call-site depths and ringflow's own code (record._sites, record._internal) in tables keyed by the code
object's address, filling and reading record._internal where its table has no answer."""
from __future__ import annotations

from collections.abc import Callable

from . import record
from .native import _record, record_native
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
