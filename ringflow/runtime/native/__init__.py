"""Optional native helpers, built from C when the package is installed (see setup.py).

Three modules: copies with streaming stores for buffers larger than the cache (`_streamcopy`),
the native executor that runs a compiled plan over shared memory (`_hotpath`, driven by
runtime/hotpath.py) and the call recorder's per-call path (`_record`, runtime/record_native.py).
Without a C compiler at install time `available()` and `hot_available()` are False and
`record_native()` None: every copy is NumPy's, every plan runs in Python, and so does the recorder.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import config

try:
    from . import _streamcopy
except ImportError:  # no compiler when the package was installed
    _streamcopy = None  # type: ignore[assignment]  # the module or None; available() tells which

try:
    from . import _hotpath
except ImportError:  # no compiler when the package was installed
    _hotpath = None  # type: ignore[assignment]  # the module or None; hot_available() tells which

try:
    from . import _record
except ImportError:  # no compiler when the package was installed
    _record = None  # type: ignore[assignment]  # the module or None; record_native() tells which


def record_native() -> Any:
    """The call recorder's per-call path in C (`_record`, runtime/record_native.py), or None when it was not
    built or RINGFLOW_NATIVE turns it off (the recorder then runs in Python)."""
    return _record if _record is not None and bool(config.get("NATIVE")) else None


def hot_available() -> bool:
    """True if the native executor was built and RINGFLOW_NATIVE does not turn it off."""
    return _hotpath is not None and bool(config.get("NATIVE"))


def hot_stats() -> dict[str, int]:
    """Plans this process completed on the native executor and messages it read by single copy there."""
    return _hotpath.stats() if _hotpath is not None else {"runs": 0, "cma_reads": 0}


# below this a copy never streams, whatever the knob says: the data is likely still in cache
_FLOOR_BYTES = 256 * 1024


def available() -> bool:
    """True if the native streaming copy was built (and the CPU has streaming stores)."""
    return _streamcopy is not None and bool(_streamcopy.STREAMING)


def stream_min_bytes() -> int:
    """Copies of at least this many bytes stream (RINGFLOW_STREAM_COPY_MIN_BYTES); 0 when they never do."""
    if not available():
        return 0
    n = int(config.get("STREAM_COPY_MIN_BYTES"))
    return max(n, _FLOOR_BYTES) if n > 0 else 0


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[...] = src; a large contiguous copy of one dtype uses streaming stores (no read of dst), a smaller one
    from `_streamcopy.ALIAS_MIN_BYTES` the native move, which avoids memcpy's slow case for a destination just after
    the source modulo 4 KiB. A read-only dst goes to NumPy, which refuses it."""
    n = dst.nbytes
    if _streamcopy is not None and n >= _streamcopy.ALIAS_MIN_BYTES and src.nbytes == n and src.dtype == dst.dtype \
            and dst.flags.c_contiguous and src.flags.c_contiguous and dst.flags.writeable:
        lo = stream_min_bytes()
        if lo and n >= lo and not np.may_share_memory(dst, src):
            _streamcopy.copy(dst.ctypes.data, src.ctypes.data, n)
        else:
            _streamcopy.move(dst.ctypes.data, src.ctypes.data, n)
        return
    np.copyto(dst, src)
