"""Named shared-memory segments: their names, creation (mode 0600, refusing a name that exists) and removal,
and a rank's `comm.alloc` regions, which peers map by name on demand.

Every name is registered with the creating process's reaper (runtime/reaper.py) before it exists, so a
process killed at any moment leaves none behind.
"""
from __future__ import annotations

import mmap
import os

import numpy as np

from ...errors import RingflowSystemError
from ..job import reaper

SHM_DIR = "/dev/shm"


def segment_name(job: str, uid: str, src: int, dst: int, key: str) -> str:
    """The per-job, per-communicator name of one connection segment."""
    return f"ringflow-{job}-{uid}-{src}-{dst}-{key}"


def create(name: str, nbytes: int) -> mmap.mmap:
    """A new segment of nbytes named `name` (mode 0600), mapped; a name that exists is an error. The name is
    registered with this process's reaper first (no moment where a kill leaves it); `remove` forgets it."""
    path = os.path.join(SHM_DIR, name)
    reaper.guard(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        reaper.release(path)  # not ours: the reaper must leave it alone
        raise RingflowSystemError(f"shared-memory name {path} already exists: another process created it "
                                  f"(owner uid {_owner_of(path)})",
                                  "the names carry a random per-communicator nonce, so only a process that read the "
                                  "job's store can collide; remove the file, or set RINGFLOW_SHM_DISABLE=1") from None
    except OSError as exc:
        raise RingflowSystemError(f"cannot create shared memory {path}: {exc}",
                          "check /dev/shm space and permissions, or set RINGFLOW_SHM_DISABLE=1") from None
    try:
        os.ftruncate(fd, nbytes)
        return mmap.mmap(fd, nbytes)
    except OSError as exc:
        os.unlink(path)
        raise RingflowSystemError(f"cannot size shared memory {path} to {nbytes} bytes: {exc}",
                          "containers need a larger /dev/shm (docker --shm-size), or lower RINGFLOW_BUFFSIZE") from None
    finally:
        os.close(fd)


def _owner_of(path: str) -> str:
    try:
        return str(os.stat(path).st_uid)
    except OSError:
        return "?"


def unlink_quiet(name: str) -> None:
    """Remove a segment name if it still exists."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except OSError:
        pass


def remove(name: str) -> None:
    """Remove a name this process created (`create`) and take it off the reaper's list."""
    unlink_quiet(name)
    reaper.release(os.path.join(SHM_DIR, name))


class Regions:
    """This rank's `comm.alloc` segments: a send whose source lies in one travels by reference."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # f"ringflow-{job}-{uid}-{rank}-a"; region r is prefix + str(r)
        self.spans: list[tuple[int, int, int]] = []  # (start address, end address, region id)
        self.packed = b""  # the spans as uint64 triples, for the native executor
        self.maps: list[mmap.mmap] = []
        self.zero_copy_sends = 0

    def create(self, nbytes: int) -> tuple[int, mmap.mmap]:
        """A new named segment of nbytes (mode 0600); (region id, mapping)."""
        rid = len(self.maps)
        mm = create(self.prefix + str(rid), max(nbytes, 1))
        self.maps.append(mm)
        return rid, mm

    def register(self, rid: int, start: int, nbytes: int) -> None:
        """Remember where region rid is mapped in this process."""
        self.spans.append((start, start + nbytes, rid))
        self.packed = np.asarray(self.spans, dtype=np.uint64).tobytes()

    def find(self, src_u8: np.ndarray) -> tuple[int, int] | None:
        """(region id, offset) if src lies inside one region, else None."""
        if not self.spans:
            return None
        a = src_u8.ctypes.data
        e = a + src_u8.shape[0]
        for start, end, rid in self.spans:
            if start <= a and e <= end:
                return rid, a - start
        return None

    def close(self) -> None:
        """Remove the names (mappings stay valid for arrays still in use)."""
        for rid in range(len(self.maps)):
            remove(self.prefix + str(rid))
