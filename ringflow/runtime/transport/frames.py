"""Frame headers of the TCP transport and the control channel, validated on every read.

Every frame starts with a fixed 48-byte header::

    magic 'RFLW' | version u16 | kind u16 | channel u32 | seq u64 | nbytes u64 | op_seq u64 |
    sig u32 | tag i32 | crc u32

- ``seq`` counts frames on one connection (0, 1, 2, ...): a gap or repeat is a ProtocolError;
- ``nbytes`` is the payload length that follows; it must not exceed what the receiver expects;
- ``op_seq`` numbers the collective calls of a communicator and ``sig`` is the call signature
  (collective, count, dtype, op, root, algorithm) so ranks that disagree are caught;
- ``crc`` is a CRC32 of the 44 bytes before it, so a corrupt header is never trusted.

The shared-memory transport stores the same fields in its slot headers.
"""
from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass

from ...errors import ProtocolError

MAGIC = b"RFLW"
VERSION = 1
_BODY = struct.Struct("<4sHHIQQQIi")
HEADER = struct.Struct("<4sHHIQQQIiI")
HEADER_BYTES = HEADER.size  # 48
MAX_CTRL_BYTES = 64 * 1024   # a control frame's payload (CHECK detail, STATUS, ERROR text)
MAX_HELLO_BYTES = 4 * 1024   # the first frame of a connection: communicator id, rank, connection key


class Kind(enum.IntEnum):
    """What a frame carries."""

    DATA = 1
    CHECK = 2       # the cross-rank argument check that opens a collective
    HELLO = 3       # first frame of a connection: who I am and what the connection is for
    HEARTBEAT = 4
    ABORT = 5       # the sender aborted its communicator
    BYE = 6         # the sender destroyed its communicator cleanly
    MISMATCH = 7    # the sender found ranks disagreeing in op `op_seq`
    ERROR = 8
    STATUS_QUERY = 9  # a rank whose call timed out asks every peer what it is doing
    STATUS = 10       # the answer: the peer's last collective (JSON: op_seq, call, in_call)
    RELAY = 11        # a mismatch relayed in the log-depth argument check's rounds (JSON: who found what)


@dataclass(frozen=True)
class Frame:
    """A parsed, validated header."""

    kind: Kind
    channel: int
    seq: int
    nbytes: int
    op_seq: int
    sig: int
    tag: int


def pack(kind: Kind, seq: int, nbytes: int, *, channel: int = 0, op_seq: int = 0, sig: int = 0,
         tag: int = 0) -> bytes:
    """Encode a header."""
    body = _BODY.pack(MAGIC, VERSION, int(kind), channel, seq, nbytes, op_seq, sig & 0xFFFFFFFF, tag)
    return body + struct.pack("<I", zlib.crc32(body))


def parse(data: bytes | bytearray | memoryview, *, peer: object, expect_seq: int | None = None,
          max_nbytes: int | None = None) -> Frame:
    """Decode and validate a header; ProtocolError names the peer and what is wrong."""
    if len(data) != HEADER_BYTES:
        raise ProtocolError(f"truncated frame header from {peer}: {len(data)} of {HEADER_BYTES} bytes",
                            "the peer closed mid-frame or is not a ringflow process")
    magic, version, kind, channel, seq, nbytes, op_seq, sig, tag, crc = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r} from {peer}",
                            "the peer is not speaking the ringflow protocol")
    if version != VERSION:
        raise ProtocolError(f"frame version {version} from {peer}, this process speaks {VERSION}",
                            "run the same ringflow version on every rank")
    if zlib.crc32(bytes(data[:_BODY.size])) != crc:
        raise ProtocolError(f"corrupt frame header from {peer} (checksum mismatch)",
                            "check the network path; the frame was dropped")
    try:
        k = Kind(kind)
    except ValueError:
        raise ProtocolError(f"unknown frame kind {kind} from {peer}", "run the same ringflow version") from None
    if expect_seq is not None and seq != expect_seq:
        raise ProtocolError(f"out-of-sequence frame from {peer}: got seq {seq}, expected {expect_seq}",
                            "a frame was lost, duplicated or injected; the connection cannot be trusted")
    if max_nbytes is not None and nbytes > max_nbytes:
        raise ProtocolError(f"oversized frame from {peer}: {nbytes} bytes, at most {max_nbytes} expected",
                            "ranks disagree on message sizes, or the peer is hostile")
    return Frame(k, channel, seq, nbytes, op_seq, sig, tag)


def call_signature(*fields: object) -> int:
    """A 32-bit signature of a call's arguments (compared across ranks)."""
    return zlib.crc32("|".join(str(f) for f in fields).encode())
