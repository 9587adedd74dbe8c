"""The schedule type, its builder, JSON round trip and the chunk layout."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringflow.algorithms import (
    Buffer,
    BufferLayout,
    CallShape,
    ChunkRef,
    Collective,
    Schedule,
    ScheduleBuilder,
    chunk_bounds,
    split_counts,
)
from ringflow.errors import InvalidArgument, InvalidUsage


def _ring_reduce_scatter(n: int) -> Schedule:
    lay = {Buffer.IN: BufferLayout(n), Buffer.OUT: BufferLayout(n)}
    b = ScheduleBuilder(Collective.ALL_REDUCE, n, "test-ring", layouts=lay)
    for i in range(n - 1):
        for j in range(n):
            b.transfer(i, j, (j + 1) % n, ChunkRef(Buffer.OUT, (j - i) % n), ChunkRef(Buffer.OUT, (j - i - 1) % n),
                       reduce=True)
    return b.build()


def test_builder_freezes_and_pads_steps():
    s = _ring_reduce_scatter(4)
    assert s.nsteps == 3 and all(len(p) == 3 for p in s.programs)
    assert len(list(s.ops())) == 3 * 4 * 2
    b = ScheduleBuilder(Collective.BARRIER, 2, "x", layouts={Buffer.IN: BufferLayout(1)})
    b.build()
    with pytest.raises(InvalidUsage, match="already built"):
        b.send(0, 0, 1, ChunkRef(Buffer.IN, 0))


def test_json_round_trip_and_version_check():
    s = _ring_reduce_scatter(5)
    assert Schedule.from_json(s.dumps()) == s
    bad = s.to_json() | {"version": 99}
    with pytest.raises(InvalidArgument, match="version"):
        Schedule.from_json(bad)


def test_table_names_every_rank():
    text = _ring_reduce_scatter(3).table()
    assert "r0:" in text and "r2:" in text and "recv+" in text


def test_builder_rejects_bad_rank_and_root():
    with pytest.raises(InvalidArgument):
        ScheduleBuilder(Collective.BROADCAST, 4, "x", layouts={}, root=4)
    b = ScheduleBuilder(Collective.ALL_REDUCE, 2, "x", layouts={Buffer.OUT: BufferLayout(2)})
    with pytest.raises(InvalidArgument):
        b.send(0, 0, 2, ChunkRef(Buffer.OUT, 0))
    with pytest.raises(InvalidArgument, match="no layout"):
        b.send(0, 0, 1, ChunkRef(Buffer.SCRATCH, 0))


@given(total=st.integers(0, 10_000), parts=st.integers(1, 64))
def test_split_counts_sums_and_balances(total, parts):
    c = split_counts(total, parts)
    assert sum(c) == total and max(c) - min(c) <= 1 and list(c) == sorted(c, reverse=True)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), count=st.integers(0, 50), nsegs=st.integers(1, 4))
def test_chunk_bounds_tile_the_buffer(n, count, nsegs):
    lay = {Buffer.IN: BufferLayout(1, nsegs), Buffer.OUT: BufferLayout(n, nsegs),
           Buffer.SCRATCH: BufferLayout(n, nsegs, like=Buffer.OUT, copies=2)}
    s = ScheduleBuilder(Collective.ALL_GATHER, n, "x", layouts=lay).build()
    shape = CallShape(Collective.ALL_GATHER, n, count)
    for buf, total in ((Buffer.IN, count), (Buffer.OUT, n * count), (Buffer.SCRATCH, 2 * n * count)):
        bounds = chunk_bounds(shape, s, buf, 0)
        assert len(bounds) == lay[buf].nchunks
        off = 0
        for o, length in bounds:
            assert o == off
            off += length
        assert off == total
    # output chunk (block b, seg s) has the size of input chunk s: gathers move whole segments
    ins, outs = chunk_bounds(shape, s, Buffer.IN, 0), chunk_bounds(shape, s, Buffer.OUT, 0)
    for b in range(n):
        for g in range(nsegs):
            assert outs[lay[Buffer.OUT].chunk(b, g)][1] == ins[g][1]


def test_all_to_allv_layout_uses_the_split_matrix():
    splits = ((1, 2, 3), (4, 5, 6), (0, 0, 7))
    lay = {Buffer.IN: BufferLayout(3), Buffer.OUT: BufferLayout(3)}
    s = ScheduleBuilder(Collective.ALL_TO_ALLV, 3, "x", layouts=lay).build()
    shape = CallShape(Collective.ALL_TO_ALLV, 3, 0, splits=splits)
    assert [n for _, n in chunk_bounds(shape, s, Buffer.IN, 1)] == [4, 5, 6]
    assert [n for _, n in chunk_bounds(shape, s, Buffer.OUT, 2)] == [3, 6, 7]
    with pytest.raises(InvalidArgument):
        CallShape(Collective.ALL_TO_ALLV, 3, 0, splits=((1, 2), (3, 4)))
