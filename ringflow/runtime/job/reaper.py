"""Removes a process's shared-memory names when it dies without cleaning up, SIGKILL included.

Names that must outlive the call that created them (the `comm.alloc` regions, which peers map on
demand while the communicator lives) are registered with one small helper process per rank. The
helper reads names from a pipe; when the pipe closes (the rank exited, normally or killed) it
unlinks every name still registered. The kernel closes the pipe, so no signal handler is needed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

_HELPER = (
    "import os,sys\n"
    "names=set()\n"
    "for line in sys.stdin:\n"
    "    op,name=line[0],line[1:].rstrip('\\n')\n"
    "    (names.add if op=='+' else names.discard)(name)\n"
    "for name in names:\n"
    "    try: os.unlink(name)\n"
    "    except OSError: pass\n"
)

_lock = threading.Lock()
_proc: subprocess.Popen | None = None
_owner_pid = -1


def _helper() -> subprocess.Popen:
    global _proc, _owner_pid
    if _proc is None or _owner_pid != os.getpid():  # a forked child gets its own helper
        # own session: a signal sent to the rank's process group does not take the helper with it
        _proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HELPER], stdin=subprocess.PIPE,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                 start_new_session=True)
        _owner_pid = os.getpid()
    return _proc


def guard(path: str) -> None:
    """Unlink `path` when this process dies, unless `release(path)` came first."""
    _send("+", path)


def release(path: str) -> None:
    """Forget `path` (the caller removed it itself)."""
    if _proc is not None and _owner_pid == os.getpid():
        _send("-", path)


def _send(op: str, path: str) -> None:
    if "\n" in path:
        raise ValueError(f"shared-memory path with a newline: {path!r}")
    with _lock:
        proc = _helper()
        assert proc.stdin is not None
        proc.stdin.write(f"{op}{path}\n")
        proc.stdin.flush()
