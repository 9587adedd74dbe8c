"""Point-to-point send/recv and the barrier, as schedules.

``p2p`` (sendrecv): rank ``root`` (the sender, default 0) sends its IN to rank ``peer``
(default root+1), which receives it into OUT; one step, S bytes.

``dissemination`` (barrier, Hensgen/Finkel/Manber): in round k rank r sends a zero-byte
token to (r+2^k)%n and receives one from (r-2^k)%n. After ceil(log2 n) rounds every rank has
heard, transitively, from every other rank, for any n.
"""
from __future__ import annotations

from ..errors import InvalidArgument
from ._common import blk, ceil_log2, need_root, new_builder, std_layouts
from .schedule import Buffer, BufferLayout, ChunkRef, Collective, Schedule

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def build_p2p(collective: Collective | str, nranks: int, *, root: int | None = None, peer: int | None = None,
              nsegs: int = 1, **_: object) -> Schedule:
    """One message from `root` to `peer`."""
    c = Collective.parse(collective)
    n = nranks
    src = need_root(root, n, default=0)
    dst = (src + 1) % n if peer is None else int(peer)
    if not 0 <= dst < n or (dst == src and n > 1):
        raise InvalidArgument(f"peer {dst} is not another rank of [0, {n})", "pass peer=<rank other than root>")
    lay = std_layouts(c, n, 1, nsegs)
    b = new_builder(c, n, "p2p", lay, src, peer=dst, nsegs=nsegs)
    if n == 1:
        b.copy(0, 0, blk(OUT, lay[OUT], 0), blk(IN, lay[IN], 0))
    else:
        b.transfer(0, src, dst, blk(IN, lay[IN], 0), blk(OUT, lay[OUT], 0))
    return b.build()


def build_dissemination(collective: Collective | str, nranks: int, **_: object) -> Schedule:
    """Dissemination barrier: ceil(log2 n) rounds of zero-byte tokens."""
    c = Collective.parse(collective)
    n = nranks
    lay = {IN: BufferLayout(1), OUT: BufferLayout(1), SCR: BufferLayout(1, like=IN)}
    b = new_builder(c, n, "dissemination", lay, None)
    token_in, token_scr = ChunkRef(IN, 0), ChunkRef(SCR, 0)
    for k in range(ceil_log2(n)):
        d = 1 << k
        for r in range(n):
            b.transfer(k, r, (r + d) % n, token_in, token_scr)
    return b.build()

