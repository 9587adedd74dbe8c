"""The log-depth argument check on real ranks (`algorithms.check_rounds`): its rounds, a mismatch relayed, the error.

A call under the log-depth pattern opens with its rounds (`run_rounds`, CHECK frames with this call's
description) unless its plan's own first steps are the rounds (`Plan.check_rounds`). Either way, a rank that
finds a message not of its call, in round k, runs rounds k+1 .. K-1 here, sending RELAY frames that say who
found what instead of its own messages and draining what it receives; after the last round every rank raises.
The native executor runs the clean rounds; only a call that found a mismatch comes here for the rest.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from ...algorithms.check_rounds import round_peers
from ...errors import InvalidArgument
from ..transport.base import Mismatch
from ..transport.frames import Kind
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


def run_rounds(ctx: CallContext, start: int, finding: Finding | None) -> None:
    """Rounds `start` .. K-1 of the check on the Python transport; the finding's error, on every rank, after the
    last (`finding`: what an earlier round found, or None)."""
    from .executor import drive  # the executor runs the check's first rounds through this module

    t = ctx.transport
    desc = np.frombuffer(ctx.description.encode(), dtype=np.uint8)
    for k in range(start, ctx.check_rounds):
        to, frm = round_peers(ctx.nranks, ctx.rank, k)
        out = t.out(to, "c0", ctx.deadline)
        send = out.send(desc, Kind.CHECK, ctx.sig, ctx.op_seq, 0) if finding is None else \
            out.send(finding.payload(), Kind.RELAY, ctx.sig, ctx.op_seq, 0)
        recv = t.inn(frm, "c0").recv(None, -1, ctx.sig, check=True, op_seq=ctx.op_seq, tag=0)
        drive([send, recv], ctx.waiter, ctx.deadline, "argument check", ctx.ll)
        if recv.mismatch is not None and finding is None:
            finding = finding_of(recv.mismatch, ctx)
    if finding is not None:
        raise finding.error(ctx)


def after_mismatch(ctx: CallContext, step: int, mismatch: Mismatch) -> InvalidArgument:
    """The error of a call whose check round `step` (0-based) received `mismatch`: the rounds after it relay the
    finding, then every rank raises (returned here for the caller to raise)."""
    try:
        run_rounds(ctx, step + 1, finding_of(mismatch, ctx))
    except InvalidArgument as exc:
        return exc
    raise AssertionError("run_rounds returns only without a finding")   # pragma: no cover
