"""The log-depth argument check's findings (`algorithms.check_rounds`): what a round found, relayed, in words.

A call under the log-depth pattern opens with its rounds (`executor.check_rounds_from`, CHECK frames with this
call's description) unless its plan's own first steps are the rounds (`Plan.check_rounds`). Either way, a rank
that finds a message not of its call in round k runs rounds k+1 .. K-1 in Python, sending RELAY frames that carry
its `Finding` instead of its own messages and draining what it receives; after the last round every rank raises
`Finding.error`. The native executor runs the clean rounds; only a call that found a mismatch leaves it.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InvalidArgument
from ..transport.base import Mismatch
from .calltext import hint, mismatch_detail, mismatch_sentence, parse_call, phrase

if TYPE_CHECKING:
    from .executor import CallContext

RELAY_KEY = "relayed_mismatch"


class Finding:
    """A mismatch this rank found (`mismatch`, its own error) or was told of (`relay` only)."""

    __slots__ = ("mismatch", "relay")

    def __init__(self, mismatch: Mismatch | None, relay: dict[str, Any]) -> None:
        self.mismatch, self.relay = mismatch, relay

    def payload(self) -> np.ndarray:
        """The RELAY frame's payload."""
        return np.frombuffer(json.dumps({RELAY_KEY: self.relay}).encode(), dtype=np.uint8)

    def error(self, ctx: CallContext) -> InvalidArgument:
        """The InvalidArgument this rank raises: its own mismatch in words, or the relayed one."""
        if self.mismatch is not None:
            return self.mismatch.error(ctx.description)
        r = self.relay
        theirs, mine = r.get("theirs"), r.get("mine")
        text = mismatch_sentence(int(r["peer"]), theirs, mine, int(r["rank"]), third_person=True)
        return InvalidArgument(f"the ranks' arguments disagree: {text} (found by rank {r['rank']}, told to this rank "
                               f"({ctx.rank}), which called {phrase(ctx.description)})", hint("mismatch"),
                               detail=mismatch_detail(int(r["peer"]), theirs, mine, None, None,
                                                      rank=int(r["rank"]), relayed_to=ctx.rank))


def finding_of(mismatch: Mismatch, ctx: CallContext) -> Finding:
    """What a message not of this call says: a relayed finding (a RELAY frame), else this rank's own finding."""
    relayed = _relayed(mismatch.detail)
    if relayed is not None:
        return Finding(None, relayed)
    return Finding(mismatch, {"rank": ctx.rank, "peer": mismatch.peer, "theirs": parse_call(mismatch.detail),
                              "mine": parse_call(ctx.description)})


def _relayed(detail: bytes) -> dict[str, Any] | None:
    try:
        d = json.loads(detail)
    except (ValueError, UnicodeDecodeError):
        return None
    r = d.get(RELAY_KEY) if isinstance(d, dict) else None
    return r if isinstance(r, dict) and {"rank", "peer"} <= set(r) else None
