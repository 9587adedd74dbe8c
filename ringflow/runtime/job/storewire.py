"""The store's wire format (after the handshake).

A message is ``u32 length`` then ``u8 code`` then a list of byte strings (``u32 count`` then
``u32 len + bytes`` each). A message above MAX_MSG_BYTES (64 MiB) is refused: the client raises
InvalidArgument before sending it, the server answers a declared length above it with an error and
closes the connection. A message is read in slices (64 KiB doubling to 1 MiB), so the reader's memory
grows with the bytes that arrive, not with the length the sender declares.
"""
from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterable

from ...errors import ProtocolError
from . import auth

MAX_MSG_BYTES = 64 * 2**20
READ_SLICE_BYTES = 2**20
FIRST_SLICE_BYTES = 64 * 2**10
CONTEXT = b"ringflow-store-v1"   # separates store proofs from transport ones
REPLY_TIMEOUT_S = 30.0   # the longest a request waits for its reply beyond what it asks the store to wait for

SET, GET, ADD, CAS, DELETE, WAIT, CHECK, NKEYS = range(1, 9)
OK, TIMEOUT, ERR, GONE = 0, 1, 2, 3   # GONE: unasked, before the server closes an idle connection
U32 = struct.Struct("<I")


def encode(code: int, args: Iterable[bytes]) -> bytes:
    """One message: length, code, byte-string arguments."""
    args = list(args)
    parts = [bytes([code]), U32.pack(len(args))]
    for a in args:
        parts.append(U32.pack(len(a)))
        parts.append(a)
    body = b"".join(parts)
    return U32.pack(len(body)) + body


def decode(body: bytes) -> tuple[int, list[bytes]]:
    """Parse a message body (without its length prefix); ProtocolError on anything malformed."""
    if len(body) < 5:
        raise ProtocolError(f"store message too short ({len(body)} bytes)")
    code = body[0]
    (count,) = U32.unpack_from(body, 1)
    off, args = 5, []
    if count > len(body):
        raise ProtocolError(f"store message claims {count} arguments in {len(body)} bytes")
    for _ in range(count):
        if off + 4 > len(body):
            raise ProtocolError("store message truncated in an argument length")
        (n,) = U32.unpack_from(body, off)
        off += 4
        if off + n > len(body):
            raise ProtocolError(f"store message argument of {n} bytes overruns the message")
        args.append(body[off:off + n])
        off += n
    if off != len(body):
        raise ProtocolError(f"{len(body) - off} trailing bytes in a store message")
    return code, args


def read_msg(sock: socket.socket, deadline: float, what: str,
              body_s: float | None = None) -> tuple[int, list[bytes]]:
    """One message, its length by `deadline` and the rest by then (or within `body_s` of the length)."""
    (n,) = U32.unpack(auth.recv_exact(sock, 4, deadline, what))
    deadline = deadline if body_s is None else time.monotonic() + body_s
    if n > MAX_MSG_BYTES:
        raise ProtocolError(f"{what}: message of {n} bytes exceeds the store's limit of {MAX_MSG_BYTES} bytes",
                            "the store holds small metadata; send bulk data through a communicator")
    # read in slices of 64 KiB doubling to 1 MiB: memory grows with the bytes that arrive, not with the length
    # a client declares
    parts: list[bytes] = []
    got, step = 0, FIRST_SLICE_BYTES
    while got < n:
        parts.append(auth.recv_exact(sock, min(step, n - got), deadline, what))
        got += len(parts[-1])
        step = min(2 * step, READ_SLICE_BYTES)
    return decode(b"".join(parts))
