"""Single-copy reads from a peer process's memory (Linux cross-memory attach, process_vm_readv).

Open MPI's shared-memory BTL moves large messages this way (``smsc/cma``): the sender only posts
the address of its buffer, the receiver's kernel copies straight from it into the destination,
so each byte is copied once instead of twice through a staging slot. The kernel allows it between
processes of the same user (or with CAP_SYS_PTRACE); whether a pair of ranks may use it is probed
once per connection (`ShmIn.try_open`), and `RINGFLOW_CMA_DISABLE=1` turns it off.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

from ...errors import RemoteError, RingflowSystemError
from .protocol import CMA_CHUNK_BYTES, CMA_LARGE_CHUNK_BYTES, CMA_LARGE_CHUNK_FROM_BYTES

# Reduce path: read a chunk into a cache-resident buffer, then reduce it.  Each chunk costs a syscall
# (pinning its pages) and a NumPy call, so a message far larger than the cache takes bigger chunks:
# a 2-rank all-reduce of 64 MiB (32 MiB reductions) reaches 6.6 GB/s busbw with 1 MiB chunks against 5.4
# with 256 KiB ones, one of 16 MiB (8 MiB reductions) is fastest at 512 KiB (9.2 against 8.3), and 4 ranks
# are no slower (docs/runtime.md). The native executor's bounce buffer takes the same sizes (protocol.py).
CHUNK_BYTES = CMA_CHUNK_BYTES
LARGE_CHUNK_BYTES, LARGE_CHUNK_FROM_BYTES = CMA_LARGE_CHUNK_BYTES, CMA_LARGE_CHUNK_FROM_BYTES


def chunk_bytes(nbytes: int) -> int:
    """How much of an `nbytes` reduction to read per syscall."""
    return LARGE_CHUNK_BYTES if nbytes >= LARGE_CHUNK_FROM_BYTES else CHUNK_BYTES


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load() -> object | None:
    try:
        # the process's own symbols, libc's among them (ctypes.util.find_library would run ldconfig at import)
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                   ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


_readv = _load()


def enabled() -> bool:
    """True if this process may try single-copy reads (the call exists and the knob allows it)."""
    from ... import config
    return _readv is not None and not config.get("CMA_DISABLE")


def read_into(pid: int, remote_addr: int, dst_addr: int, nbytes: int) -> int:
    """Copy nbytes from address remote_addr of process pid to dst_addr here; bytes copied or -errno."""
    local, remote = _IoVec(dst_addr, nbytes), _IoVec(remote_addr, nbytes)
    got = 0
    while got < nbytes:  # the kernel may copy less than asked (e.g. across a partly mapped range)
        local.base, local.len = dst_addr + got, nbytes - got
        remote.base, remote.len = remote_addr + got, nbytes - got
        n = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # type: ignore[operator]
        if n <= 0:
            return -ctypes.get_errno() if n < 0 else -5
        got += n
    return got


def probe(pid: int, remote_addr: int, expect: int) -> bool:
    """True if this process can read the 8-byte word at remote_addr of pid and it equals expect."""
    if not enabled():
        return False
    word = np.zeros(1, dtype=np.uint64)
    return read_into(pid, remote_addr, word.ctypes.data, 8) == 8 and int(word[0]) == expect


def _fail(pid: int, peer: int, err: int) -> Exception:
    if err in (-3, -14):  # ESRCH: the process is gone; EFAULT: its buffer is gone
        return RemoteError(f"rank {peer} (pid {pid}) exited or freed its buffer while this rank read it",
                           rank=peer, hint="check that rank's log; the communicator must be recreated")
    return RingflowSystemError(f"single-copy read from rank {peer} (pid {pid}) failed: {os.strerror(-err)}",
                       "set RINGFLOW_CMA_DISABLE=1 to move data through shared-memory slots")


_scratch = np.empty(0, dtype=np.uint8)
reads = 0  # messages this process received by single copy (tests and benchmarks read it)


def consume_remote(sink: object, pid: int, peer: int, remote_addr: int, nbytes: int) -> None:
    """Apply a peer's nbytes at remote_addr to `sink` (a transport.base.Sink): one kernel copy."""
    global _scratch, reads
    reads += 1
    dst = sink.dst_u8  # type: ignore[attr-defined]
    if sink.ufunc is None and dst.flags.c_contiguous:  # type: ignore[attr-defined]
        r = read_into(pid, remote_addr, dst.ctypes.data, nbytes)
        if r < 0:
            raise _fail(pid, peer, r)
        return
    chunk = chunk_bytes(nbytes)
    if _scratch.shape[0] < chunk:
        _scratch = np.empty(chunk, dtype=np.uint8)
    step = chunk - chunk % max(1, sink.itemsize)  # type: ignore[attr-defined]
    for off in range(0, nbytes, step):
        n = min(step, nbytes - off)
        r = read_into(pid, remote_addr + off, _scratch.ctypes.data, n)
        if r < 0:
            raise _fail(pid, peer, r)
        sink.consume(off, _scratch[:n])  # type: ignore[attr-defined]
