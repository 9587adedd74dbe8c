"""Point-to-point calls of a Communicator: send / recv and their asynchronous forms, matched in order per tag."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidArgument
from ..transport.base import Sink
from ..transport.frames import Kind
from ..transport.manager import LANE_RECV, LANE_SEND, Transport
from .executor import Waiter, drive
from .ops import Buf
from .work import Work


class PointToPoint:
    """Send and receive between two ranks of a communicator (a mixin of `Communicator`)."""

    if TYPE_CHECKING:
        rank: int
        size: int
        _transport: Transport
        _waiters: list[Waiter]
        _run: Callable[..., Any]

    def _peer(self, peer: int, what: str) -> int:
        if not isinstance(peer, (int, np.integer)) or not 0 <= int(peer) < self.size or int(peer) == self.rank:
            raise InvalidArgument(f"{what}={peer!r} is not another rank of this communicator (size {self.size}, "
                                  f"this rank {self.rank})", "ranks are group-local")
        return int(peer)

    @staticmethod
    def _tag(tag: int) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= int(tag) < 2**31:
            raise InvalidArgument(f"tag={tag!r}", "tags are integers in [0, 2**31)")
        return int(tag)

    def send(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> None:
        """Send x to rank dst (matched in order by recv(src=this rank, tag=tag) there)."""
        self._p2p_send(x, dst, tag, False, timeout)

    def isend(self, x: Any, dst: int, tag: int = 0, timeout: float | None = None) -> Work:
        """Asynchronous send; do not modify x until the Work completes."""
        return self._p2p_send(x, dst, tag, True, timeout)

    def _p2p_send(self, x: Any, dst: int, tag: int, async_op: bool, timeout: float | None) -> Any:
        xb, dst, tag = Buf(x, "x"), self._peer(dst, "dst"), self._tag(tag)

        def fn(deadline: float) -> None:
            op = self._transport.out(dst, f"p{tag}", deadline).send(xb.flat.view(np.uint8), Kind.DATA, 0, 0, tag)
            drive([op], self._waiters[LANE_SEND], deadline, f"send to rank {dst}")
        return self._run(LANE_SEND, fn, async_op, timeout, f"send to {dst}", None,
                         meta=("send", xb.flat.dtype, xb.flat.size, dst, tag))

    def recv(self, x: Any, src: int, tag: int = 0, timeout: float | None = None) -> Any:
        """Receive into x (in place) from rank src; the message must have x's size."""
        return self._p2p_recv(x, src, tag, False, timeout)

    def irecv(self, x: Any, src: int, tag: int = 0, timeout: float | None = None) -> Work:
        """Asynchronous recv into x."""
        return self._p2p_recv(x, src, tag, True, timeout)

    def _p2p_recv(self, x: Any, src: int, tag: int, async_op: bool, timeout: float | None) -> Any:
        xb, src, tag = Buf(x, "x"), self._peer(src, "src"), self._tag(tag)

        def fn(deadline: float) -> None:
            u8 = xb.flat.view(np.uint8)
            op = self._transport.inn(src, f"p{tag}").recv(Sink(u8), u8.shape[0], 0, check=False, op_seq=0, tag=tag)
            drive([op], self._waiters[LANE_RECV], deadline, f"recv from rank {src}")
            if op.mismatch is not None:
                raise InvalidArgument(f"recv from rank {src} (tag {tag}): message has {op.mismatch.got_nbytes} bytes, "
                                      f"the buffer {u8.shape[0]}", "send and receive buffers must have equal size")
        return self._run(LANE_RECV, fn, async_op, timeout, f"recv from {src}", x,
                         meta=("recv", xb.flat.dtype, xb.flat.size, src, tag))
