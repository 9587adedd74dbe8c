"""The verifier catches deliberately broken schedules with a message naming rank, step and chunk."""
from __future__ import annotations

import dataclasses

import pytest

from ringflow.algorithms import registry, verifier
from ringflow.algorithms.layout import CallShape
from ringflow.algorithms.schedule import (
    Buffer,
    BufferLayout,
    ChunkRef,
    Collective,
    Op,
    OpKind,
    Schedule,
    ScheduleBuilder,
)
from ringflow.errors import VerificationError

IN, OUT, SCR = Buffer.IN, Buffer.OUT, Buffer.SCRATCH


def _edit(s: Schedule, rank: int, step: int, fn) -> Schedule:
    """A copy of `s` with rank's ops in `step` replaced by fn(list of ops)."""
    progs = [list(p) for p in s.programs]
    progs[rank][step] = tuple(fn(list(progs[rank][step])))
    return dataclasses.replace(s, programs=tuple(tuple(p) for p in progs))


def test_correct_schedules_pass_and_report() -> None:
    rep = verifier.verify(registry.get_schedule("all_reduce", "ring", 5), [CallShape(Collective.ALL_REDUCE, 5, 13)])
    assert rep.in_place_checked and rep.transfers == 2 * 4 * 5 and rep.nsteps == 8


def test_dropped_send_is_caught() -> None:
    s = registry.get_schedule("all_reduce", "ring", 4)
    broken = _edit(s, 2, 1, lambda ops: [o for o in ops if o.kind != OpKind.SEND])
    with pytest.raises(VerificationError, match="dropped send") as ei:
        verifier.verify(broken)
    assert ei.value.rank == 3 and ei.value.step == 1


def test_block_reduced_twice_is_caught() -> None:
    s = registry.get_schedule("all_reduce", "ring", 4)
    # rank 1 adds its own input again to the block it just received in step 0
    recv = next(o for o in s.programs[1][0] if o.kind == OpKind.RECV_REDUCE)
    broken = _edit(s, 1, 0, lambda ops: ops + [Op(OpKind.REDUCE, src=recv.src, dst=recv.dst)])
    with pytest.raises(VerificationError, match="reduced twice") as ei:
        verifier.verify(broken)
    assert ei.value.rank == 1 and ei.value.step == 0 and ei.value.chunk == ChunkRef(OUT, recv.dst.index)


def test_wrong_index_is_caught() -> None:
    s = registry.get_schedule("all_reduce", "ring", 4)
    # rank 2 reduces the incoming block into the wrong place in step 0
    def wrong(ops: list[Op]) -> list[Op]:
        out = []
        for o in ops:
            if o.kind == OpKind.RECV_REDUCE:
                bad = ChunkRef(o.dst.buffer, (o.dst.index + 1) % 4)
                o = Op(OpKind.RECV_REDUCE, src=ChunkRef(IN, bad.index), dst=bad, peer=o.peer)
            out.append(o)
        return out
    with pytest.raises(VerificationError, match="wrong index") as ei:
        verifier.verify(_edit(s, 2, 0, wrong))
    assert ei.value.rank == 2 and ei.value.step == 0


def test_wrong_final_placement_names_expected_and_found() -> None:
    s = registry.get_schedule("all_gather", "ring", 3)
    # rank 0 stores the last block it receives in the wrong output slot
    last = s.nsteps - 1
    def misplace(ops: list[Op]) -> list[Op]:
        return [Op(o.kind, o.src, ChunkRef(OUT, 0), o.peer, o.channel) if o.kind == OpKind.RECV else o for o in ops]
    with pytest.raises(VerificationError, match="expected position 0 from ranks") as ei:
        verifier.verify(_edit(s, 0, last, misplace))
    assert ei.value.rank == 0


def test_reading_undefined_output_is_caught() -> None:
    b = ScheduleBuilder("all_reduce", 2, "bad", layouts={IN: BufferLayout(2), OUT: BufferLayout(2)})
    b.transfer(0, 0, 1, ChunkRef(OUT, 0), ChunkRef(OUT, 0), reduce=True, local=ChunkRef(IN, 0))
    with pytest.raises(VerificationError, match="undefined") as ei:
        verifier.verify(b.build())
    assert ei.value.rank == 0 and ei.value.step == 0 and ei.value.chunk == ChunkRef(OUT, 0)


def test_arrival_order_reduction_is_not_bitwise_identical() -> None:
    # 3 ranks each receive the other two inputs and sum "own first": (x_r + x_a) + x_b differs per rank
    n = 3
    b = ScheduleBuilder("all_reduce", n, "arrival", layouts={IN: BufferLayout(1), OUT: BufferLayout(1),
                                                             SCR: BufferLayout(1, like=IN, copies=n)})
    for r in range(n):
        for q in range(n):
            if q != r:
                b.transfer(0, q, r, ChunkRef(IN, 0), ChunkRef(SCR, q))
        b.copy(r, 0, ChunkRef(OUT, 0), ChunkRef(IN, 0))
        for q in range(n):
            if q != r:
                b.reduce(r, 0, ChunkRef(OUT, 0), ChunkRef(SCR, q))
    with pytest.raises(VerificationError, match="bitwise identical"):
        verifier.verify(b.build(), in_place=False)


def test_in_place_hazard_is_caught() -> None:
    # one-shot without saving its own input first: OUT := scratch[0] clobbers IN when aliased
    n = 3
    b = ScheduleBuilder("all_reduce", n, "unsafe", layouts={IN: BufferLayout(1), OUT: BufferLayout(1),
                                                            SCR: BufferLayout(1, like=IN, copies=n)})
    for r in range(n):
        for q in range(n):
            if q != r:
                b.transfer(0, q, r, ChunkRef(IN, 0), ChunkRef(SCR, q))
    for r in range(n):
        first = ChunkRef(IN, 0) if r == 0 else ChunkRef(SCR, 0)
        b.copy(r, 0, ChunkRef(OUT, 0), first)
        for q in range(1, n):
            b.reduce(r, 0, ChunkRef(OUT, 0), ChunkRef(IN, 0) if q == r else ChunkRef(SCR, q))
    s = b.build()
    verifier.verify(s, in_place=False)  # correct out of place
    with pytest.raises(VerificationError, match="in place") as ei:
        verifier.verify(s)
    assert ei.value.rank == 1


def test_barrier_without_transitive_contact_is_caught() -> None:
    s = registry.get_schedule("barrier", "dissemination", 5)
    broken = dataclasses.replace(s, programs=tuple(p[:-1] for p in s.programs))  # drop the last round
    with pytest.raises(VerificationError, match="without hearing from rank"):
        verifier.verify(broken)


def test_mismatched_sizes_under_uneven_counts_are_caught() -> None:
    # all_to_allv through scratch shaped like the receiver's input: sizes differ when splits differ
    n = 2
    lay = {IN: BufferLayout(2), OUT: BufferLayout(2), SCR: BufferLayout(2, like=IN)}
    b = ScheduleBuilder("all_to_allv", n, "bad_v", layouts=lay)
    for r in range(n):
        b.copy(r, 0, ChunkRef(OUT, r), ChunkRef(IN, r))
        b.transfer(0, r, 1 - r, ChunkRef(IN, 1 - r), ChunkRef(SCR, r))
        b.copy(1 - r, 0, ChunkRef(OUT, r), ChunkRef(SCR, r))
    s = b.build()
    verifier.verify(s, [CallShape(Collective.ALL_TO_ALLV, 2, 0, splits=((1, 1), (1, 1)))])
    with pytest.raises(VerificationError, match="elements"):
        verifier.verify(s, [CallShape(Collective.ALL_TO_ALLV, 2, 0, splits=((1, 3), (2, 1)))])


def test_writing_input_and_double_receive_are_caught() -> None:
    b = ScheduleBuilder("all_gather", 2, "bad", layouts={IN: BufferLayout(1), OUT: BufferLayout(2)})
    b.transfer(0, 0, 1, ChunkRef(IN, 0), ChunkRef(IN, 0))
    with pytest.raises(VerificationError, match="IN buffer"):
        verifier.verify(b.build())
    b = ScheduleBuilder("all_gather", 3, "bad", layouts={IN: BufferLayout(1), OUT: BufferLayout(3)})
    b.transfer(0, 0, 2, ChunkRef(IN, 0), ChunkRef(OUT, 0))
    b.transfer(0, 1, 2, ChunkRef(IN, 0), ChunkRef(OUT, 0))
    with pytest.raises(VerificationError, match="two receives"):
        verifier.verify(b.build())


def test_closed_form_mismatch_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    a = registry.info("ring")
    forms = dict(a.closed_forms)
    forms[Collective.ALL_REDUCE] = lambda n, s, ch: registry.ClosedForm(n - 1, registry.F(2 * (n - 1), n))
    monkeypatch.setitem(registry.ALGORITHMS, "ring", dataclasses.replace(a, closed_forms=forms))
    with pytest.raises(VerificationError, match="closed form"):
        verifier.check_algorithm("all_reduce", "ring", 4)


def test_ambiguous_receive_reduce_source_is_caught() -> None:
    # rank 2 receives into out[0] and, in the same step, reduces another message on top of out[0] into out[1]
    lay = {IN: BufferLayout(2), OUT: BufferLayout(2)}
    b = ScheduleBuilder("all_reduce", 3, "ambiguous", layouts=lay)
    b.transfer(0, 0, 2, ChunkRef(IN, 0), ChunkRef(OUT, 0))
    b.transfer(0, 1, 2, ChunkRef(IN, 1), ChunkRef(OUT, 1), reduce=True, local=ChunkRef(OUT, 0))
    with pytest.raises(VerificationError, match="ambiguous order") as ei:
        verifier.verify(b.build())
    assert ei.value.rank == 2 and ei.value.chunk == ChunkRef(OUT, 0)
