"""Shared-memory transport: one ring of slots per (sender, receiver, connection key).

A connection segment (``/dev/shm/ringflow-<job>-<uid>-<src>-<dst>-<key>``, mode 0600) is created by
the sender and unlinked by the receiver as soon as it has mapped it; until then the sender's reaper
(runtime/reaper.py) holds the name, so a rank killed at any moment leaves nothing behind. Its layout,
flag words and the size thresholds below are the numbers of `protocol.py`, shared with the native
executor (native/_hotpath.c, which includes the header generated from them) and the host model.

A message of N bytes is cut into slices of at most slot_bytes (a message that fits one slot into a
few slices of at least MIN_SLICE_BYTES, `slice_bytes`, the rule both ends and both executors follow); the
sender copies a slice into a free slot (one copy), writes the slot's header and then publishes its flag;
the receiver copies or reduces it straight from the slot into the destination
(``np.add(src, slot, out=dst)``) and then publishes `tail`. Small messages ride with their flag in one
slot (the LL idea). With `nslots` slots in flight, copy and reduce of consecutive slices overlap across
the two processes.

Every publish is a release store and every read of a published word an acquire load (`_Mapped.load`,
`_Mapped.store`: the native module's `store_release` / `load_acquire`), so the protocol holds on weakly ordered
CPUs (aarch64) too. Without the native module, plain stores are correct only under x86's total store
order; on other CPUs this module then refuses to use shared memory (`check_ordering`).

Messages from ZERO_COPY_MIN_BYTES up travel by reference in one slot instead: (region, offset)
when the source lies in a `comm.alloc` buffer, else (address) when the receiver proved at connect
time that it can read the sender's memory (`cma`, Open MPI's single-copy mechanism); the receiver
then copies or reduces straight from the source and the send completes when it has.
"""
from __future__ import annotations

import mmap
import os
import platform
from collections import deque

import numpy as np

from ...errors import ProtocolError, RingflowSystemError
from .. import native
from . import cma, doorbell
from .base import Mismatch, Sink, XferOp
from .frames import Kind
from .protocol import (  # noqa: F401 - re-exported: the transport's numbers, for its users
    CMA_COPY_MIN_BYTES,
    CMA_MIN_BYTES,
    DATA_OFF,
    DETAIL_MAX,
    HDR_WORDS,
    MAGIC_WORD,
    MAX_SLOTS,
    MIN_SLICE_BYTES,
    PIPELINE_MIN_BYTES,
    REF_CMA,
    SLICES_PER_SLOT_MESSAGE,
    SLOT_HDR_WORD,
    W_ADDR,
    W_CMA,
    W_MAGIC,
    W_NSLOTS,
    W_PID,
    W_RSEQ,
    W_RWAIT,
    W_SHEAD,
    W_SLOTB,
    W_SSEQ,
    W_SWAIT,
    W_TAIL,
    ZERO_COPY_MIN_BYTES,
    slice_bytes,
)
from .segments import SHM_DIR, Regions, create, remove, segment_name, unlink_quiet  # noqa: F401 - re-exported

_X86 = ("x86_64", "amd64", "i386", "i486", "i586", "i686", "x86")
MACHINE = platform.machine().lower()
if native._hotpath is not None:
    _load_acquire, _store_release = native._hotpath.load_acquire, native._hotpath.store_release
    ORDERING = "release/acquire (native)"
else:
    ORDERING = "plain stores (x86 total store order only)"


def check_ordering() -> None:
    """Refuse shared memory where plain stores do not publish in order (a non-x86 CPU without the native module)."""
    if native._hotpath is None and MACHINE not in _X86:
        raise RingflowSystemError(f"shared memory between ranks needs the native module on this {MACHINE} CPU: without "
                                  "it the transport publishes with plain stores, ordered only on x86",
                                  "reinstall ringflow where a C compiler and Python's headers exist, or set "
                                  "RINGFLOW_SHM_DISABLE=1 (TCP between same-host ranks)")



class _Mapped:
    def __init__(self, mm: mmap.mmap, nslots: int, slot_bytes: int) -> None:
        self.mm = mm
        self.ctl = memoryview(mm).cast("B")[:DATA_OFF].cast("Q")
        self.nslots, self.slot_bytes = nslots, slot_bytes
        arr = np.frombuffer(mm, dtype=np.uint8)
        self.addr = arr.ctypes.data
        self.slots = [arr[DATA_OFF + i * slot_bytes: DATA_OFF + (i + 1) * slot_bytes] for i in range(nslots)]

    if native._hotpath is not None:
        def load(self, word: int) -> int:
            """Control word `word`, read with acquire ordering (what was written before its publish is visible)."""
            return _load_acquire(self.addr + 8 * word)

        def store(self, word: int, value: int) -> None:
            """Publish `value` in control word `word` with release ordering (after everything written before)."""
            _store_release(self.addr + 8 * word, value)
    else:
        def load(self, word: int) -> int:
            """Control word `word` (a plain load: ordered as acquire under x86's total store order only)."""
            return int(self.ctl[word])

        def store(self, word: int, value: int) -> None:
            """Control word `word` = value (a plain store: ordered as release under x86's total store order only)."""
            self.ctl[word] = value

    def close(self) -> None:
        try:
            self.ctl.release()
        except Exception:  # noqa: BLE001 - exported numpy views may still exist; the GC unmaps later
            pass
        self.slots = []
        try:
            self.mm.close()
        except BufferError:
            pass


class ShmOut:
    """The sending side of one connection (creates the segment)."""

    def __init__(self, name: str, nslots: int, slot_bytes: int, peer: int, peer_bell: bytes,
                 regions: Regions | None = None, spare_core: bool = False) -> None:
        nslots = max(2, min(nslots, MAX_SLOTS))
        slot_bytes = max(64, slot_bytes - slot_bytes % 64)
        check_ordering()
        self.name, self.peer, self.peer_bell = name, peer, peer_bell
        mm = create(name, DATA_OFF + nslots * slot_bytes)
        self.m = _Mapped(mm, nslots, slot_bytes)
        c = self.m.ctl
        c[W_NSLOTS], c[W_SLOTB] = nslots, slot_bytes
        c[W_ADDR], c[W_PID] = self.m.addr, os.getpid()
        self.m.store(W_MAGIC, MAGIC_WORD)
        self.tail = 0
        self.queue: deque = deque()
        self.regions = regions
        self.spare_core = spare_core  # the host has a core per local rank: an idle sender may copy

    @property
    def head(self) -> int:
        return int(self.m.ctl[W_SHEAD])

    @head.setter
    def head(self, v: int) -> None:
        self.m.ctl[W_SHEAD] = v

    @property
    def msg_seq(self) -> int:
        return int(self.m.ctl[W_SSEQ])

    @msg_seq.setter
    def msg_seq(self, v: int) -> None:
        self.m.ctl[W_SSEQ] = v

    def send(self, src_u8: np.ndarray, kind: Kind, sig: int, op_seq: int, tag: int, lone: bool = False,
             copied: bool = True) -> ShmSend:
        """Start sending one message; `lone`: the sender has nothing else to do until it is taken;
        `copied`: the receiver copies it and the source is not freshly written (algorithms.plan.Xfer.cold_copy)."""
        op = ShmSend(self, src_u8, kind, sig, op_seq, tag, lone and self.spare_core,
                     CMA_COPY_MIN_BYTES if copied else CMA_MIN_BYTES)
        op._post(self)
        return op

    def close(self) -> None:
        """Unmap (and unlink, in case the receiver never opened it)."""
        remove(self.name)
        self.m.close()


class ShmSend(XferOp):
    """One outgoing message on shared memory."""

    is_shm = True

    def __init__(self, o: ShmOut, src_u8: np.ndarray, kind: Kind, sig: int, op_seq: int, tag: int,
                 pipelined: bool = False, cma_min_bytes: int = CMA_MIN_BYTES) -> None:
        self.o, self.src, self.total = o, src_u8, int(src_u8.shape[0])
        self.off, self.kind, self.sig, self.op_seq, self.tag = 0, int(kind), sig & 0xFFFFFFFF, op_seq, tag & 0xFFFFFFFF
        self.started, self.done, self.peer, self.moved = False, False, o.peer, False
        self.ref: tuple[int, int] | None = None  # (region id, offset): zero copy or single copy (CMA)
        self.posted = 0
        self.slice = slice_bytes(self.total, o.m.slot_bytes)
        if self.total >= ZERO_COPY_MIN_BYTES:
            if o.regions is not None:
                self.ref = o.regions.find(src_u8)
            pipelined = pipelined and self.total >= PIPELINE_MIN_BYTES
            if self.ref is None and self.total >= cma_min_bytes and o.m.ctl[W_CMA] == 1 \
                    and src_u8.flags.c_contiguous and not pipelined:
                self.ref = (REF_CMA - 1, src_u8.ctypes.data)

    def _progress_ref(self, ref: tuple[int, int]) -> bool:
        """Zero copy: post one slot naming (region, offset); done once the receiver consumed it."""
        o = self.o
        c = o.m.ctl
        moved = False
        if not self.posted:
            h = o.head
            if h - o.tail >= o.m.nslots:
                o.tail = o.m.load(W_TAIL)
                if h - o.tail >= o.m.nslots:
                    return False
            rid, off = ref
            b = SLOT_HDR_WORD + (h % o.m.nslots) * HDR_WORDS
            c[b + 1] = o.msg_seq
            c[b + 2] = self.total
            c[b + 3] = off
            c[b + 4] = self.sig
            c[b + 5] = self.kind | ((rid + 1) << 32)
            c[b + 6] = self.op_seq
            c[b + 7] = self.tag
            o.m.store(b, h + 1)
            o.head = self.posted = h + 1
            if o.regions is not None:
                o.regions.zero_copy_sends += 1
            moved = self.moved = True
            if c[W_RWAIT]:
                doorbell.ring(o.peer_bell)
        if o.m.load(W_TAIL) >= self.posted:  # acquire: the receiver is done reading the source
            self.done = True
            o.msg_seq += 1
            o.queue.popleft()
            return True
        return moved

    def progress(self) -> bool:
        o = self.o
        if o.queue[0] is not self:
            return False
        if self.ref is not None:
            return self._progress_ref(self.ref)
        m = o.m
        c, nslots = m.ctl, m.nslots
        moved = False
        while not self.done:
            h = o.head
            if h - o.tail >= nslots:
                o.tail = m.load(W_TAIL)  # acquire: the receiver is done reading the slots it released
                if h - o.tail >= nslots:
                    return moved
            i = h % nslots
            off = self.off
            n = min(self.slice, self.total - off)
            if n:
                m.slots[i][:n] = self.src[off:off + n]
            b = SLOT_HDR_WORD + i * HDR_WORDS
            c[b + 1] = o.msg_seq
            c[b + 2] = self.total
            c[b + 3] = off
            c[b + 4] = self.sig
            c[b + 5] = self.kind
            c[b + 6] = self.op_seq
            c[b + 7] = self.tag
            m.store(b, h + 1)  # release: the slice and the header words before the flag
            o.head = h + 1
            self.off = off + n
            moved = self.moved = True
            if self.off >= self.total:
                self.done = True
                o.msg_seq += 1
                o.queue.popleft()
            if c[W_RWAIT]:
                doorbell.ring(o.peer_bell)
        return moved

    def ready(self) -> bool:
        o = self.o
        if o.queue[0] is not self:
            return False
        if self.posted:
            return o.m.load(W_TAIL) >= self.posted
        return o.head - o.m.load(W_TAIL) < o.m.nslots

    def set_waiting(self, flag: int) -> None:
        self.o.m.ctl[W_SWAIT] = flag


class ShmIn:
    """The receiving side of one connection (maps the sender's segment when it appears)."""

    def __init__(self, name: str, peer: int, peer_bell: bytes, region_prefix: str = "") -> None:
        self.name, self.peer, self.peer_bell = name, peer, peer_bell
        self.region_prefix = region_prefix
        self.regions: dict[int, np.ndarray] = {}
        self.m: _Mapped | None = None
        self.queue: deque = deque()

    @property
    def head(self) -> int:
        """The next slot to read: the tail this receiver publishes to its sender."""
        return int(self.m.ctl[W_TAIL]) if self.m is not None else 0

    @property
    def msg_seq(self) -> int:
        return int(self.m.ctl[W_RSEQ]) if self.m is not None else 0

    @msg_seq.setter
    def msg_seq(self, v: int) -> None:
        assert self.m is not None  # only a mapped connection moves
        self.m.ctl[W_RSEQ] = v

    def try_open(self) -> bool:
        """Map the segment if the sender has created it; then unlink its name."""
        if self.m is not None:
            return True
        path = os.path.join(SHM_DIR, self.name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise RingflowSystemError(f"cannot open shared memory {path}: {exc}",
                                      "check /dev/shm permissions") from None
        try:
            size = os.fstat(fd).st_size
            if size < DATA_OFF:
                return False
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        check_ordering()
        words = np.frombuffer(mm, dtype=np.uint64, count=DATA_OFF // 8)
        if native._hotpath is not None:  # acquire: the layout words the creator wrote before publishing the magic
            ok = _load_acquire(words.ctypes.data + 8 * W_MAGIC) == MAGIC_WORD
        else:
            ok = int(words[W_MAGIC]) == MAGIC_WORD
        nslots, sb = int(words[W_NSLOTS]), int(words[W_SLOTB])
        del words  # an exported view would keep mm from closing
        if not ok:
            mm.close()
            return False
        if not (2 <= nslots <= MAX_SLOTS) or sb < 64 or sb % 64 or DATA_OFF + nslots * sb != size:
            mm.close()
            raise ProtocolError(f"shared memory {self.name} from rank {self.peer} has a bad layout "
                                f"({nslots} slots of {sb} bytes in {size} bytes)", "run one ringflow version")
        self.m = _Mapped(mm, nslots, sb)
        unlink_quiet(self.name)
        c = self.m.ctl
        if c[W_CMA] == 0 and cma.probe(int(c[W_PID]), int(c[W_ADDR]), MAGIC_WORD):
            c[W_CMA] = 1
        return True

    def region(self, rid: int) -> np.ndarray:
        """The sender's alloc region rid, mapped read-write (cached)."""
        r = self.regions.get(rid)
        if r is None:
            path = os.path.join(SHM_DIR, f"{self.region_prefix}{rid}")
            try:
                fd = os.open(path, os.O_RDWR)
            except OSError as exc:
                raise ProtocolError(f"rank {self.peer} sent a reference to its buffer {rid}, which cannot be "
                                    f"opened: {exc}", "the peer freed the buffer or is not of this job") from None
            try:
                mm = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            r = self.regions[rid] = np.frombuffer(mm, dtype=np.uint8)
        return r

    def recv(self, sink: Sink | None, nbytes: int, sig: int, *, check: bool, op_seq: int, tag: int) -> ShmRecv:
        """Start receiving one message of nbytes into sink (None: discard)."""
        op = ShmRecv(self, sink, nbytes, sig, check, op_seq, tag)
        op._post(self)
        return op

    def close(self) -> None:
        """Unmap."""
        if self.m is not None:
            self.m.close()
            self.m = None
        unlink_quiet(self.name)


class ShmRecv(XferOp):
    """One incoming message on shared memory."""

    is_shm = True

    def __init__(self, i: ShmIn, sink: Sink | None, nbytes: int, sig: int, check: bool, op_seq: int, tag: int) -> None:
        self.i, self.sink, self.want, self.sig, self.check = i, sink, nbytes, sig & 0xFFFFFFFF, check
        self.op_seq, self.tag = op_seq, tag & 0xFFFFFFFF
        self.off, self.total, self.first, self.slice = 0, -1, True, 0
        self.drain = False
        self.done, self.peer, self.mismatch, self.moved = False, i.peer, None, False
        self.detail = bytearray()

    def progress(self) -> bool:
        i = self.i
        if i.queue[0] is not self:
            return False
        m = i.m
        if m is None:
            if not i.try_open():
                return False
            m = i.m
            assert m is not None  # try_open mapped it
        c, nslots = m.ctl, m.nslots
        moved = False
        while not self.done:
            h = i.head
            s = h % nslots
            b = SLOT_HDR_WORD + s * HDR_WORDS
            if m.load(b) != h + 1:  # acquire: the header words and the slice published before the flag
                return moved
            total, off = c[b + 2], c[b + 3]
            if self.first:
                self._first(c, b, total, m.slot_bytes)
            rid = c[b + 5] >> 32
            if rid:
                if not self.drain:
                    self._consume_reference(c, rid, off, total)
                self.off = total
                m.store(W_TAIL, h + 1)  # release: done reading the sender's source
                moved = self.moved = True
                self.done = True
                i.msg_seq += 1
                i.queue.popleft()
                if c[W_SWAIT]:
                    doorbell.ring(i.peer_bell)
                return True
            self._consume_slice(c, b, m.slots[s], off, total)
            m.store(W_TAIL, h + 1)  # release: done reading the slot, which the sender may now refill
            moved = self.moved = True
            if self.off >= total:
                self.done = True
                i.msg_seq += 1
                i.queue.popleft()
                if self.mismatch is not None:
                    self.mismatch.detail = bytes(self.detail)
            if c[W_SWAIT]:
                doorbell.ring(i.peer_bell)
        return moved

    def _consume_reference(self, c: memoryview, rid: int, off: int, total: int) -> None:
        """The message sent by reference (one slot): read it from the sender's memory into the sink."""
        i = self.i
        assert self.sink is not None  # _first drains when there is no sink
        if rid == REF_CMA:  # single copy: the data is at address `off` in the sender
            cma.consume_remote(self.sink, int(c[W_PID]), i.peer, int(off), int(total))
        else:  # zero copy: the data is in the sender's alloc region, at offset `off`
            reg = i.region(rid - 1)
            if off + total > reg.shape[0]:
                raise ProtocolError(f"rank {i.peer} referenced bytes {off}..{off + total} of a "
                                    f"{reg.shape[0]}-byte buffer", "the peer is corrupt")
            self.sink.consume(0, reg[off:off + total])

    def _consume_slice(self, c: memoryview, b: int, slot: np.ndarray, off: int, total: int) -> None:
        """One slice carried in the slot: check its place in the message, then consume (or drain) it."""
        if off != self.off or total != self.total or off > total:
            raise ProtocolError(f"shared-memory slice from rank {self.i.peer} out of order "
                                f"(offset {off} of {total}, expected {self.off} of {self.total})",
                                "a peer process is corrupt or from another ringflow version")
        n = min(self.slice, total - off)
        if self.drain:
            if c[b + 5] & 0xFFFFFFFF in (Kind.CHECK, Kind.RELAY) and len(self.detail) < DETAIL_MAX:
                self.detail += slot[:min(n, DETAIL_MAX - len(self.detail))].tobytes()
        elif n:
            assert self.sink is not None  # _first drains when there is no sink
            self.sink.consume(off, slot[:n])
        self.off = off + n

    def _first(self, c: memoryview, b: int, total: int, slot_bytes: int) -> None:
        self.first = False
        self.total = total
        self.slice = slice_bytes(total, slot_bytes)
        if c[b + 1] != self.i.msg_seq:
            raise ProtocolError(f"out-of-sequence message from rank {self.i.peer} on shared memory: "
                                f"seq {c[b + 1]}, expected {self.i.msg_seq}", "the connection cannot be trusted")
        kind, sig = c[b + 5] & 0xFFFFFFFF, c[b + 4]
        want_kind = Kind.CHECK if self.want < 0 else Kind.DATA
        bad = kind != want_kind or (self.check and sig != self.sig) or (self.want >= 0 and total != self.want)
        if bad:
            self.mismatch = Mismatch(self.i.peer, total, self.want, sig, self.sig)
        if bad or self.sink is None:
            self.drain = True

    def ready(self) -> bool:
        i = self.i
        if i.queue[0] is not self:
            return False
        if i.m is None:
            return i.try_open()
        return i.m.load(SLOT_HDR_WORD + (i.head % i.m.nslots) * HDR_WORDS) == i.head + 1

    def set_waiting(self, flag: int) -> None:
        if self.i.m is not None:
            self.i.m.ctl[W_RWAIT] = flag
