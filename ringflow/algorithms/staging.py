"""Staged first steps: the receiver-verified argument check for schedules of more than two ranks.

With verify messages (`verify_messages`) every rank hears from every peer in step 0, so disagreeing ranks all
raise there. That keeps "no data is delivered on a mismatch" only if no step-0 receive lands in the user's
arrays: with three or more ranks, data from one peer could land before another peer's message shows the
mismatch. `staged(schedule)` rewrites step 0 so that those receives land in scratch instead, and adds a step
after it that copies them to their destinations (then runs step 0's local ops, which read them). The copy
runs only once step 0 is complete, so every peer's message has been checked; the result is the same
schedule's, which the verifier checks. The price is one copy of step 0's received bytes instead of a CHECK
exchange before the data: which one a call pays is the cost model's to say (`selection`).
"""
from __future__ import annotations

from dataclasses import replace

from .. import config
from . import check_rounds
from .schedule import Buffer, BufferLayout, ChunkRef, Op, OpKind, Schedule, Step, is_self_checking, per_schedule
from .verify_messages import first_step_pairs_complete, verifiable

USER = (Buffer.IN, Buffer.OUT)
STAGED_PARAM = "staged_check"   # Schedule.params key marking a staged schedule



def _user_receives(schedule: Schedule) -> list[Op]:
    return [op for r in range(schedule.nranks) for op in schedule.steps(r)[0]
            if op.kind.is_recv and op.dst is not None and op.dst.buffer in USER]


def _overlap(schedule: Schedule, a: ChunkRef, b: ChunkRef) -> bool:
    """True if two chunk references may name the same elements (in place, IN aliases OUT: where the two are cut
    differently their chunk numbers do not compare, so they may)."""
    if a.buffer != b.buffer:
        if a.buffer not in USER or b.buffer not in USER:
            return False
        if schedule.layouts[a.buffer] != schedule.layouts[b.buffer]:
            return True
    return a.index < b.index + b.span and b.index < a.index + a.span


def _stageable(schedule: Schedule, target: Buffer) -> bool:
    """True if step 0's user-array receives (all into `target`) can move to scratch without changing a value:
    scratch (if any) copies `target`'s chunking, and no other step-0 receive of the rank reads or writes their
    destinations. (Sends read start-of-step values either way, and step 0's local ops move after the copies,
    so they see what they saw.)"""
    lay = schedule.layouts.get(Buffer.SCRATCH)
    tl = schedule.layouts[target]
    if lay is not None and (lay.like != target or lay.own_block or (lay.nblocks, lay.nsegs) !=
                            (tl.nblocks, tl.nsegs)):
        return False
    for r in range(schedule.nranks):
        recvs = [op for op in schedule.steps(r)[0] if op.kind.is_recv and op.dst is not None]
        for i, op in enumerate(recvs):
            dst = op.dst
            if dst is None or dst.buffer not in USER:
                continue
            others = [x for j, q in enumerate(recvs) if j != i for x in (q.src, q.dst) if x is not None]
            if any(_overlap(schedule, dst, x) for x in others):
                return False
    return True


@per_schedule
def _build(schedule: Schedule) -> Schedule | None:
    n = schedule.nranks
    if n < 3 or schedule.nswitches or schedule.nsteps == 0 or is_self_checking(schedule) or verifiable(schedule):
        return None
    if not first_step_pairs_complete(schedule):
        return None
    recvs = _user_receives(schedule)
    targets = {op.dst.buffer for op in recvs if op.dst is not None}
    if len(targets) != 1:
        return None
    target = targets.pop()
    if not _stageable(schedule, target):
        return None
    tl = schedule.layouts[target]
    old = schedule.layouts.get(Buffer.SCRATCH)
    copy = old.copies if old is not None else 0
    scratch = BufferLayout(tl.nblocks, tl.nsegs, like=target, copies=copy + 1)
    base = copy * tl.nchunks   # chunks of the added scratch copy start here

    def stage(ref: ChunkRef) -> ChunkRef:
        return ChunkRef(Buffer.SCRATCH, base + ref.index, ref.span)

    programs: list[tuple[Step, ...]] = []
    for r in range(n):
        prog = schedule.steps(r)
        first: list[Op] = []
        after: list[Op] = []
        for op in prog[0]:
            if op.kind.is_recv and op.dst is not None and op.dst.buffer in USER:
                first.append(replace(op, dst=stage(op.dst)))
                after.append(Op(OpKind.COPY, src=stage(op.dst), dst=op.dst))
            elif op.kind.is_transfer:
                first.append(op)
        after += [op for op in prog[0] if not op.kind.is_transfer]
        programs.append((tuple(first), tuple(after)) + tuple(prog[1:]))
    layouts = {**schedule.layouts, Buffer.SCRATCH: scratch}
    params = {**schedule.params, STAGED_PARAM: True}
    staged_schedule = Schedule(schedule.collective, schedule.algorithm, n, layouts, tuple(programs), schedule.root,
                               schedule.nchannels, params, schedule.nswitches)
    return staged_schedule if verifiable(staged_schedule) else None


def staged(schedule: Schedule) -> Schedule | None:
    """The schedule with step 0's receives into IN/OUT staged in scratch, so that the receiver-verified check
    keeps data undelivered on a mismatch (module docstring); None where it does not apply or is not needed
    (2 ranks, a schedule that checks itself or is verifiable already, RINGFLOW_RECEIVER_CHECK=0). The same
    object for the same schedule."""
    if not config.get("RECEIVER_CHECK") or check_rounds.log_depth(schedule.nranks):
        return None
    return _build(schedule)


def is_staged(schedule: Schedule) -> bool:
    """True if `schedule` is a staged rewrite (`staged`)."""
    return bool(schedule.params.get(STAGED_PARAM))
