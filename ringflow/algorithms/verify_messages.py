"""Verify messages: the argument check carried by a plan's first step instead of a CHECK exchange before it.

Every message carries the call signature and its receiver compares it with its own before a byte of the
payload is used (a message of another call is drained, not delivered). A plan whose first step moves exactly
one channel-0 message each way between every pair of ranks therefore checks every pair in that step
(`schedule.is_self_checking`). A schedule whose first step lacks some of those messages gets them as
*verify messages*: zero-byte messages on channel 0, posted with the step's data. Then every rank hears from
every peer in step 0, so ranks that disagree all raise InvalidArgument in step 0, every message posted is
consumed, and the communicator stays usable; ranks that agree pay no round trip before the data moves.

That keeps the guarantee "on a mismatch no data is delivered" only where no rank could take data from one
peer before another peer's message shows the mismatch: 2 ranks (each hears from one peer), or no first-step
receive that lands in the user's arrays (IN or OUT); `staging.staged` rewrites a schedule so that its first
step's receives land in scratch. Other schedules keep the CHECK exchange.
RINGFLOW_RECEIVER_CHECK=0 turns verify messages off (every rank must use the same setting). Under the log-depth
check (`check_rounds`) there are no verify messages: calls open with its rounds unless their schedule carries them.
"""
from __future__ import annotations

from .. import config
from . import check_rounds
from .schedule import Buffer, OpKind, Schedule, Step, is_self_checking, per_schedule


def _pairs(step: Step, kind_is_send: bool) -> list[tuple[int, int]]:
    return [(op.peer, op.channel) for op in step if op.peer is not None
            and (op.kind == OpKind.SEND if kind_is_send else op.kind.is_recv)]


@per_schedule
def first_step_pairs_complete(schedule: Schedule) -> bool:
    """True if verify messages can complete every rank's first step: it moves at most one message each way per
    peer, all on channel 0 (more, or another channel, is more than verify messages can match)."""
    for r in range(schedule.nranks):
        prog = schedule.steps(r)
        if not prog:
            return False
        sends, recvs = _pairs(prog[0], True), _pairs(prog[0], False)
        for got in (sends, recvs):
            if any(ch != 0 for _, ch in got) or len(set(got)) != len(got):
                return False
    return True


def verifiable(schedule: Schedule) -> bool:
    """True if this schedule's first step, completed by verify messages, checks every pair of ranks and no rank
    can take data into IN or OUT from one peer before a mismatch with another shows (the module docstring)."""
    n = schedule.nranks
    if n < 2 or schedule.nswitches or not config.get("RECEIVER_CHECK") or is_self_checking(schedule) or \
            check_rounds.log_depth(n):
        return False
    return first_step_pairs_complete(schedule) and (n == 2 or not _first_step_fills_user_arrays(schedule))


@per_schedule
def _first_step_fills_user_arrays(schedule: Schedule) -> bool:
    return any(op.kind.is_recv and op.dst is not None and op.dst.buffer != Buffer.SCRATCH
               for r in range(schedule.nranks) for op in schedule.steps(r)[0])


def opens_with_check(schedule: Schedule) -> bool:
    """True if a call of `schedule` opens with the CHECK exchange (argument checks on): under the pairs pattern
    where its first step neither checks every pair (`schedule.is_self_checking`) nor does once completed by verify
    messages, under the log-depth one where its own steps do not carry the rounds (`check_rounds.disseminates`)."""
    n = schedule.nranks
    if n < 2 or config.get("CHECKS_DISABLE"):
        return False
    if check_rounds.log_depth(n):
        return not check_rounds.disseminates(schedule)
    return not (is_self_checking(schedule) or verifiable(schedule))


def missing(schedule: Schedule, rank: int) -> tuple[list[int], list[int]]:
    """(peers to send a verify message to, peers to receive one from) in step 0 of `rank` (a verifiable schedule)."""
    step = schedule.steps(rank)[0]
    to = {p for p, _ in _pairs(step, True)}
    frm = {p for p, _ in _pairs(step, False)}
    peers = [p for p in range(schedule.nranks) if p != rank]
    return [p for p in peers if p not in to], [p for p in peers if p not in frm]
