"""Point-to-point send/recv as a schedule.

``p2p`` (sendrecv): rank ``root`` (the sender, default 0) sends its IN to rank ``peer``
(default root+1), which receives it into OUT; one step, S bytes.
"""
from __future__ import annotations

from ..errors import InvalidArgument
from ._common import blk, need_root, new_builder, std_layouts
from .schedule import Buffer, Collective, Schedule

IN, OUT = Buffer.IN, Buffer.OUT


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
