"""The log-depth argument check: ceil(log2 n) dissemination rounds instead of one exchange with every peer.

Every message carries its call's signature, and its receiver compares it with its own before it uses a byte
(`verify_messages`). Under the *pairs* pattern every rank hears from every peer in one step (a CHECK exchange, or
a first step completed by verify messages): 2(n-1) messages per rank. Under the *log* pattern (3 or more ranks)
a call opens with K = ceil(log2 n) rounds in which rank r sends one message to (r+2^k)%n and receives one from
(r-2^k)%n, the dissemination barrier's pattern. A rank that received a message not of its call, or a relayed
mismatch, sends MISMATCH frames carrying what was found in its remaining rounds instead of its own messages.
Every rank reaches every other through a chain of rounds, so after round K-1 either every signature was equal or
every rank has seen a mismatch: all raise InvalidArgument, each having sent and received exactly one message per
round whatever schedule its own arguments chose, so no channel holds a stray message and the communicator stays
usable.

The rounds carry the call's description (CHECK frames, before the schedule's own steps) or, for a schedule that
*disseminates* (`disseminates`: its first K steps move at most one message to and from those peers, on channel
0, and nothing reaches IN or OUT before the last round; `dissemination`'s schedules), its own data, completed by
zero-byte fillers (`fillers`) where a rank has nothing to send or receive in a round: the check costs no step.

The pattern must be the same for every call of a communicator (a mismatched call may run another schedule), so
a communicator picks it once, by its cost model (`selection.pattern_for`), or RINGFLOW_CHECK_ROUNDS forces it;
`using(pattern)` sets what the tuner and the plan compiler see while a communicator picks and compiles.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from .. import config
from ._common import ceil_log2
from .schedule import Buffer, OpKind, Schedule, per_schedule

PATTERNS = ("pairs", "log")
MIN_RANKS = 3   # with 2 ranks both patterns are the same single exchange

_PATTERN: contextvars.ContextVar[str] = contextvars.ContextVar("ringflow_check_pattern", default="pairs")


@contextlib.contextmanager
def using(pattern: str) -> Iterator[None]:
    """Run the block with `pattern` ('pairs' or 'log') as the argument check's pattern (this thread only)."""
    if pattern not in PATTERNS:
        raise ValueError(f"check pattern {pattern!r}: use one of {PATTERNS}")
    token = _PATTERN.set(pattern)
    try:
        yield
    finally:
        _PATTERN.reset(token)


def current() -> str:
    """The pattern set by `using` ('pairs' outside one)."""
    return _PATTERN.get()


def log_depth(nranks: int) -> bool:
    """True if calls on `nranks` ranks check their arguments in log-depth rounds now (`using`, checks on)."""
    return nranks >= MIN_RANKS and _PATTERN.get() == "log" and not config.get("CHECKS_DISABLE")


def rounds(nranks: int) -> int:
    """K = ceil(log2 n): the rounds of the log-depth check."""
    return ceil_log2(nranks)


def round_peers(nranks: int, rank: int, k: int) -> tuple[int, int]:
    """(the rank `rank` sends to, the rank it receives from) in round k."""
    d = 1 << k
    return (rank + d) % nranks, (rank - d) % nranks


@per_schedule
def disseminates(schedule: Schedule) -> bool:
    """True if the schedule's own first K steps are the check's rounds (module docstring): per rank and round at
    most one send, to the round's peer, and one receive, from its peer, both on channel 0; before the last round
    every receive and local op writes scratch only. (The last round's header checks complete the verdict before
    its payload lands.)"""
    n = schedule.nranks
    if n < MIN_RANKS or schedule.nswitches:
        return False
    K = rounds(n)
    if schedule.nsteps < K:
        return False
    for r in range(n):
        prog = schedule.steps(r)
        for k in range(K):
            to, frm = round_peers(n, r, k)
            sends = [op for op in prog[k] if op.kind == OpKind.SEND]
            recvs = [op for op in prog[k] if op.kind.is_recv]
            if len(sends) > 1 or len(recvs) > 1:
                return False
            if any(op.peer != to or op.channel != 0 for op in sends) or \
                    any(op.peer != frm or op.channel != 0 for op in recvs):
                return False
            if k < K - 1 and any(op.kind != OpKind.SEND and op.dst is not None and op.dst.buffer != Buffer.SCRATCH
                                 for op in prog[k]):
                return False
    return True


def fillers(schedule: Schedule, rank: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """([(round, peer)] zero-byte sends, [(round, peer)] zero-byte receives) that complete `rank`'s rounds of a
    disseminating schedule."""
    n = schedule.nranks
    prog = schedule.steps(rank)
    sends: list[tuple[int, int]] = []
    recvs: list[tuple[int, int]] = []
    for k in range(rounds(n)):
        to, frm = round_peers(n, rank, k)
        if not any(op.kind == OpKind.SEND for op in prog[k]):
            sends.append((k, to))
        if not any(op.kind.is_recv for op in prog[k]):
            recvs.append((k, frm))
    return sends, recvs


def check_cost(schedule: Schedule) -> tuple[int, int]:
    """(steps, messages) the log-depth check adds to a call of `schedule` (`log_depth` holds): none but the
    fillers for a disseminating schedule, else K rounds of one send and one receive."""
    n = schedule.nranks
    if disseminates(schedule):
        return 0, max(sum(map(len, fillers(schedule, r))) for r in range(n))
    k = rounds(n)
    return k, 2 * k
