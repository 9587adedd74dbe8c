"""The flight recorder's file-backed ring: a communicator's last calls in a memory-mapped file of the dump directory.

Each call is written into the mapping as it is entered (before it runs) and again when it starts and ends, so
the records are in the page cache, and so on disk, when the rank is SIGKILLed or blocked in a native wait.
``ring-rank<R>-<K>.bin`` (R: the global rank, K: the process's K-th communicator) holds:

- a header page: magic, version, slot count, ``head`` (slots written so far), how the ring ended (``state``,
  ``end_ns``, the signal), ``taken`` (calls written then taken back, their slots left empty: a remembered call
  that ran nothing and went to the full path, which writes it again), and a JSON text of the communicator and
  process (comm, rank, size, global_rank, pid, hostname, mono0_ns, wall0_ns);
- a names area: each text a call refers to (operation, dtype, reduction, status, call site) once, as a
  little-endian uint16 length and its UTF-8 bytes; a call refers to a text by its offset there;
- ``nslots`` slots of 16 little-endian int64: GEN (the call's number + 1; 0 while it is being written), lane
  (+ 256 if asynchronous), seq, enq_ns, start_ns, end_ns, op, dtype, count, root or peer (INT64_MIN: none),
  reduction (a text) or tag, site (a text ``file<TAB>function``), line, status (a text; -1: none yet), the waited
  call's lane (a text, waits only), and one spare.

`PyRing` writes it in Python; the C recorder (native/_record.c, `Ring`) writes the same bytes. `read_ring` reads
either back into the call dicts of record_rows.row().
"""
from __future__ import annotations

import itertools
import json
import mmap
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from types import CodeType
from typing import Any

import numpy as np

from ...errors import InvalidArgument
from .record_rows import ASYNC, CODE, DESC, LANE, LANES, LINE, META, SEQ, STATUS, T_END, T_ENQ, T_START, WAIT

MAGIC = b"RFRING01"
VERSION = 1
HEADER_BYTES = 4096
INFO_OFFSET = 256
NAMES_BYTES = 32768
SLOT_WORDS = 16
SLOT_BYTES = SLOT_WORDS * 8
NONE = -(1 << 63)   # root or peer: none

# header words (int64, byte offset / 8)
H_VERSION, H_NSLOTS, H_HEAD, H_STATE, H_END_NS, H_SIGNAL, H_SLOTS_AT, H_NAMES_AT, H_NAMES_CAP, H_NAMES_USED, \
    H_INFO_LEN, H_TAKEN = range(1, 13)
# slot words
S_GEN, S_LANE, S_SEQ, S_ENQ, S_START, S_END, S_OP, S_DTYPE, S_COUNT, S_ROOT, S_REDOP, S_SITE, S_LINE, S_STATUS, \
    S_OF, S_SPARE = range(SLOT_WORDS)
# how a ring ended
RUNNING, DESTROYED, EXITED, SIGNALLED = 0, 1, 2, 3
STATES = {RUNNING: "not marked ended", DESTROYED: "communicator destroyed", EXITED: "process exited",
          SIGNALLED: "signal"}


def name_text(obj: Any) -> str:
    """The text a ring keeps for an object a call refers to: a call site's code, an operation, a dtype."""
    if isinstance(obj, CodeType):
        return f"{obj.co_filename}\t{obj.co_name}"
    if isinstance(obj, str):
        return obj
    v = getattr(obj, "value", None)
    if isinstance(v, str):
        return v
    try:
        return str(np.dtype(obj).name)
    except TypeError:
        return str(obj)


class Names:
    """The names area of one ring: text -> offset, appended as texts first appear."""

    def __init__(self, mm: mmap.mmap) -> None:
        self.mm = mm
        self.at = int(_word(mm, H_NAMES_AT))
        self.cap = int(_word(mm, H_NAMES_CAP))
        self.used = 0
        self.ids: dict[str, int] = {}

    def __call__(self, obj: Any) -> int:
        """The offset of obj's text (written now if new); -1 when the area is full."""
        text = name_text(obj)
        i = self.ids.get(text)
        if i is not None:
            return i
        raw = text.encode("utf-8", "replace")[:1024]
        if self.used + 2 + len(raw) > self.cap:
            return -1
        i = self.used
        self.mm[self.at + i:self.at + i + 2 + len(raw)] = struct.pack("<H", len(raw)) + raw
        self.used = i + 2 + len(raw)
        _set(self.mm, H_NAMES_USED, self.used)
        self.ids[text] = i
        return i


def _word(mm: Any, w: int) -> int:
    return int(struct.unpack_from("<q", mm, w * 8)[0])


def _set(mm: Any, w: int, v: int) -> None:
    struct.pack_into("<q", mm, w * 8, v)


def create(path: Path, nslots: int, info: dict[str, Any]) -> tuple[mmap.mmap, int]:
    """A new ring file of `nslots` slots with its header and info; (its mapping, the slots' byte offset)."""
    if nslots < 1:
        raise InvalidArgument(f"a flight ring of {nslots} slots", "give RINGFLOW_FLIGHT_RECORDER >= 1 (0: off)")
    text = json.dumps(info, separators=(",", ":")).encode()
    if len(text) > HEADER_BYTES - INFO_OFFSET:
        text = json.dumps({k: v for k, v in info.items() if k != "argv"}, separators=(",", ":")).encode()
    slots_at = HEADER_BYTES + NAMES_BYTES
    nbytes = slots_at + nslots * SLOT_BYTES
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, nbytes)
        try:   # the file's blocks now, not in the page faults of the calls that first write each slot
            os.posix_fallocate(fd, 0, nbytes)
        except OSError:   # a file system without it: the faults stay on the calls
            pass
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    mm[:] = bytes(nbytes)   # each page's first-write fault taken here, not by the call that first writes a slot on it
    for w, v in ((H_VERSION, VERSION), (H_NSLOTS, nslots), (H_SLOTS_AT, slots_at), (H_NAMES_AT, HEADER_BYTES),
                 (H_NAMES_CAP, NAMES_BYTES), (H_INFO_LEN, len(text))):
        _set(mm, w, v)
    mm[INFO_OFFSET:INFO_OFFSET + len(text)] = text
    mm[0:8] = MAGIC   # last: a reader takes a file without it for one still being made (or whose maker died)
    return mm, slots_at


def process_info(comm_info: dict[str, Any], pid: int, mono0: int, wall0: int) -> dict[str, Any]:
    """The JSON a ring's header carries: its communicator's line and its process's."""
    return {**comm_info, "pid": pid, "hostname": socket.gethostname(), "mono0_ns": mono0, "wall0_ns": wall0}


def mark_ended(mm: Any, state: int, end_ns: int, signum: int = 0) -> None:
    """Note in a ring's header how (and when) it ended, unless it already says."""
    if _word(mm, H_STATE) == RUNNING:
        _set(mm, H_END_NS, end_ns)
        _set(mm, H_SIGNAL, signum)
        _set(mm, H_STATE, state)


class PyRing:
    """The ring's writer in Python (the C recorder has its own, `_record.Ring`, writing the same bytes)."""

    def __init__(self, mm: Any, slots_at: int, nslots: int, namer: Callable[[Any], int]) -> None:
        self.mm, self.at, self.n, self.namer = mm, slots_at, nslots, namer
        self.head = 0
        self.next = itertools.count()   # positions, each taken once even by threads that interleave
        self.fmt = struct.Struct(f"<{SLOT_WORDS}q")
        self.ids: dict[int, tuple[Any, int]] = {}   # id(obj) -> (obj, its text's offset), as the C side caches

    def name(self, obj: Any) -> int:
        """The offset of obj's text, asking the names area only for an object not seen before."""
        if obj is None:
            return -1
        hit = self.ids.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        if len(self.ids) >= 1024:
            self.ids.clear()
        i = self.namer(obj)
        self.ids[id(obj)] = (obj, i)
        return i

    def enter(self, e: list[Any]) -> int:
        """Write a new call's slot (before it runs); its position, for `start` and `exit`."""
        if self.mm is None:
            return -1
        pos = next(self.next)
        self.head = max(self.head, pos + 1)
        off = self.at + (pos % self.n) * SLOT_BYTES
        m, name = e[META], self.name
        lane = int(e[LANE])
        if m:
            op, dtype, count = name(m[0]), name(m[1]), int(m[2])
            root = _int_or(m[3], NONE)
            red = name(m[4]) if lane == 0 else _int_or(m[4], -1)
        else:
            op, dtype, count, root, red = name(e[DESC]), -1, 0, NONE, -1
        struct.pack_into("<q", self.mm, off, 0)
        self.fmt.pack_into(self.mm, off, 0, lane | (256 if e[ASYNC] else 0), int(e[SEQ]), int(e[T_ENQ]),
                           int(e[T_START]), int(e[T_END]), op, dtype, count, root, red, name(e[CODE]), int(e[LINE]),
                           name(e[STATUS]) if e[STATUS] else -1, name(e[DESC]) if lane == WAIT else -1, 0)
        struct.pack_into("<q", self.mm, off, pos + 1)
        _set(self.mm, H_HEAD, self.head)
        return pos

    def start(self, pos: int, e: list[Any]) -> None:
        """The call at `pos` started."""
        if pos >= 0 and self.mm is not None:
            struct.pack_into("<q", self.mm, self.at + (pos % self.n) * SLOT_BYTES + S_START * 8, int(e[T_START]))

    def exit(self, pos: int, e: list[Any]) -> None:
        """The call at `pos` ended (its end time and status)."""
        if pos < 0 or self.mm is None:
            return
        off = self.at + (pos % self.n) * SLOT_BYTES
        if _word_at(self.mm, off) != pos + 1:
            return   # overwritten since
        struct.pack_into("<q", self.mm, off + S_START * 8, int(e[T_START]))
        struct.pack_into("<q", self.mm, off + S_STATUS * 8, self.name(e[STATUS]) if e[STATUS] else -1)
        struct.pack_into("<q", self.mm, off + S_END * 8, int(e[T_END]))

    def cancel(self, pos: int) -> None:
        """Leave the slot of the call at `pos` empty (a call taken back: it did not run)."""
        if pos >= 0 and self.mm is not None and _word_at(self.mm, self.at + (pos % self.n) * SLOT_BYTES) == pos + 1:
            struct.pack_into("<q", self.mm, self.at + (pos % self.n) * SLOT_BYTES, 0)
            _set(self.mm, H_TAKEN, _word(self.mm, H_TAKEN) + 1)

    def find(self, e: list[Any]) -> int:
        """The position of an entry written earlier (an asynchronous call run later), -1 if overwritten."""
        if self.mm is None:
            return -1
        for pos in range(self.head - 1, max(-1, self.head - 1 - self.n), -1):
            off = self.at + (pos % self.n) * SLOT_BYTES
            w = struct.unpack_from("<4q", self.mm, off)
            if w[0] == pos + 1 and (w[1] & 255) == e[LANE] and w[2] == e[SEQ] and w[3] == e[T_ENQ]:
                return pos
        return -1

    def release(self) -> None:
        """Stop writing (the mapping may be closed after)."""
        self.mm = None


def _int_or(v: Any, default: int) -> int:
    """v as an int64 as C's i64_or reads it: `default` for None or what is not an integer."""
    if type(v) is int:
        return v
    if v is None:
        return default
    try:
        return int(v.__index__())
    except (AttributeError, TypeError):
        return default


def _word_at(mm: Any, off: int) -> int:
    return int(struct.unpack_from("<q", mm, off)[0])


# ------------------------------------------------------------------ reading
def read_ring(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A ring file: ``info`` (its header's JSON), ``head`` (calls written, less those taken back), ``nslots``,
    ``state`` (how it ended, in words), ``end_ns``, ``signal``, ``calls`` (the kept calls, oldest first, as
    record_rows.row() dicts) and ``kept`` (how many)."""
    raw = Path(path).read_bytes()
    if len(raw) < HEADER_BYTES or raw[:8] != MAGIC:
        raise InvalidArgument(f"{path} is not a ringflow flight ring (or its rank died while making it)",
                              "give a directory the ranks wrote into")
    def word(w: int) -> int:
        return int(struct.unpack_from("<q", raw, w * 8)[0])
    info = json.loads(raw[INFO_OFFSET:INFO_OFFSET + word(H_INFO_LEN)].decode())
    nslots, head, at = word(H_NSLOTS), word(H_HEAD), word(H_SLOTS_AT)
    names_at, names_used = word(H_NAMES_AT), word(H_NAMES_USED)
    cache: dict[int, str] = {}

    def text(i: int) -> str | None:
        if i < 0 or i + 2 > names_used:
            return None
        t = cache.get(i)
        if t is None:
            (n,) = struct.unpack_from("<H", raw, names_at + i)
            t = cache[i] = raw[names_at + i + 2:names_at + i + 2 + n].decode("utf-8", "replace")
        return t
    slots = np.frombuffer(raw, dtype="<i8", count=nslots * SLOT_WORDS, offset=at).reshape(nslots, SLOT_WORDS)
    kept = [s for i, s in enumerate(slots.tolist()) if s[S_GEN] > 0 and (s[S_GEN] - 1) % nslots == i]
    kept.sort(key=lambda s: s[S_GEN])
    comm = str(info.get("comm"))
    calls = [_call(comm, s, text) for s in kept]
    state = word(H_STATE)
    return {"info": info, "head": head - word(H_TAKEN), "nslots": nslots, "state": STATES.get(state, str(state)),
            "state_code": state, "end_ns": word(H_END_NS), "signal": word(H_SIGNAL), "kept": len(calls),
            "calls": calls}


def _call(comm: str, s: list[int], text: Callable[[int], str | None]) -> dict[str, Any]:
    """One slot as record_rows.row() makes a call dict."""
    lane = s[S_LANE] & 255
    site = text(s[S_SITE])
    if site is None:
        site_s = "?"
    else:
        fname, _, func = site.partition("\t")
        site_s = f"{fname}:{s[S_LINE]} ({func})"
    status = text(s[S_STATUS]) or ("ok" if s[S_END] else "in_flight")
    r: dict[str, Any] = {"kind": "call", "comm": comm, "lane": LANES[lane] if lane < len(LANES) else str(lane),
                         "seq": s[S_SEQ], "op": text(s[S_OP]) or "?", "enq_ns": s[S_ENQ], "start_ns": s[S_START],
                         "end_ns": s[S_END], "site": site_s, "status": status, "async": bool(s[S_LANE] & 256),
                         "source": "ring"}
    peer = None if s[S_ROOT] == NONE else s[S_ROOT]
    if lane == WAIT:
        of = text(s[S_OF]) or "coll"
        r.update({"op": "wait", "of": of})
        if of != "coll" and peer is not None:
            r.update({"peer": peer, "tag": s[S_REDOP]})
        return r
    dtype = text(s[S_DTYPE])
    try:
        itemsize = np.dtype(dtype).itemsize if dtype else 0
    except TypeError:
        itemsize = 0
    r.update({"dtype": dtype, "count": s[S_COUNT], "nbytes": s[S_COUNT] * itemsize})
    if lane == 0:
        r.update({"root": peer, "redop": text(s[S_REDOP]), "algo": None})
    else:
        r.update({"peer": peer, "tag": s[S_REDOP]})
    return r
