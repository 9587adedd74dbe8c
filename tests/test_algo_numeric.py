"""Run schedules on real numpy data with a tiny lock-step reference executor (test-only), through
`layout.chunk_bounds`: results equal numpy's, in place too, and all-reduce results are bitwise
identical on every rank (float32, values unique per rank and element)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from ringflow.algorithms import registry
from ringflow.algorithms.layout import CallShape, buffer_elements, chunk_bounds, ref_bounds
from ringflow.algorithms.schedule import Buffer, ChunkRef, Collective, OpKind, Schedule

C = Collective


def _execute(s: Schedule, shape: CallShape, inputs: list[np.ndarray], in_place: bool) -> list[np.ndarray]:
    n = s.nranks
    bufs = []
    for r in range(n):
        d = {Buffer.IN: inputs[r].copy()}
        d[Buffer.OUT] = d[Buffer.IN] if in_place else np.full(buffer_elements(shape, s, Buffer.OUT, r), np.nan,
                                                              dtype=inputs[r].dtype)
        if Buffer.SCRATCH in s.layouts:
            d[Buffer.SCRATCH] = np.full(buffer_elements(shape, s, Buffer.SCRATCH, r), np.nan, dtype=inputs[r].dtype)
        bufs.append(d)

    def view(r: int, ref: ChunkRef) -> np.ndarray:
        off, ln = ref_bounds(chunk_bounds(shape, s, ref.buffer, r), ref.index, ref.span)
        return bufs[r][ref.buffer][off:off + ln]

    for step in range(s.nsteps):
        _execute_step(s, step, view)
    return [b[Buffer.OUT] for b in bufs]


def _execute_step(s: Schedule, step: int, view: Callable[[int, ChunkRef], np.ndarray]) -> None:
    """One lock-step step: sends snapshot their data, receives land, then local copies and reductions run."""
    n = s.nranks
    box: dict[tuple[int, int, int], list[np.ndarray]] = {}
    for r in range(n):
        for op in s.programs[r][step]:
            if op.kind == OpKind.SEND:
                box.setdefault((r, op.peer, op.channel), []).append(view(r, op.src).copy())
    writes = []
    for r in range(n):
        for op in s.programs[r][step]:
            if op.kind.is_recv:
                data = box[(op.peer, r, op.channel)].pop(0)
                if op.kind == OpKind.RECV_REDUCE:
                    data = view(r, op.src) + data
                writes.append((r, op.dst, data))
    for r, ref, data in writes:
        view(r, ref)[:] = data
    for r in range(n):
        for op in s.programs[r][step]:
            if op.kind == OpKind.COPY:
                view(r, op.dst)[:] = view(r, op.src)
            elif op.kind == OpKind.REDUCE:
                view(r, op.dst)[:] = view(r, op.dst) + view(r, op.src)


def _inputs(c: Collective, n: int, count: int, root: int, rng: np.random.Generator) -> tuple[list, CallShape]:
    shape = CallShape(c, n, count)
    ins = [rng.standard_normal(shape.buffer_count(Buffer.IN, r)).astype(np.float32) for r in range(n)]
    return ins, shape


def _expected(c: Collective, n: int, count: int, root: int, ins: list[np.ndarray]) -> list[np.ndarray | None]:
    total = np.sum(np.stack(ins).astype(np.float64), axis=0) if c.is_reduction else None
    if c == C.ALL_REDUCE:
        return [total] * n
    if c == C.REDUCE:
        return [total if r == root else None for r in range(n)]
    if c == C.BROADCAST:
        return [ins[root]] * n
    if c == C.REDUCE_SCATTER:
        return [total[r * count:(r + 1) * count] for r in range(n)]
    if c == C.ALL_GATHER:
        return [np.concatenate(ins)] * n
    if c == C.GATHER:
        return [np.concatenate(ins) if r == root else None for r in range(n)]
    if c == C.SCATTER:
        return [ins[root][r * count:(r + 1) * count] for r in range(n)]
    if c == C.ALL_TO_ALL:
        return [np.concatenate([ins[q][p * count:(p + 1) * count] for q in range(n)]) for p in range(n)]
    if c == C.SENDRECV:
        return [ins[root] if r == (root + 1) % n else None for r in range(n)]
    return [None] * n


PAIRS = [(c, a.name) for a in registry.ALGORITHMS.values() for c in a.collectives
         if c not in (C.ALL_TO_ALLV, C.BARRIER)]


@pytest.mark.parametrize("c,name", PAIRS, ids=[f"{c.value}-{a}" for c, a in PAIRS])
def test_numeric_results(c: Collective, name: str) -> None:
    rng = np.random.default_rng(7)
    for n, count, nsegs in ((1, 3, 1), (3, 7, 2), (6, 1, 1), (7, 23, 3), (8, 64, 2)):
        root = (n // 2) if (c.has_root or c == C.SENDRECV) else None
        s = registry.get_schedule(c, name, n, root=root, nsegs=nsegs)
        ins, shape = _inputs(c, n, count, root or 0, rng)
        exp = _expected(c, n, count, root or 0, ins)
        modes = [False, True] if c in (C.ALL_REDUCE, C.REDUCE, C.BROADCAST) else [False]
        for in_place in modes:
            outs = _execute(s, shape, ins, in_place)
            for r in range(n):
                if exp[r] is not None:
                    np.testing.assert_allclose(outs[r], exp[r], rtol=1e-5, atol=1e-5,
                                               err_msg=f"{c.value}/{name} n={n} rank {r} in_place={in_place}")
            if c == C.ALL_REDUCE:
                for r in range(1, n):
                    assert outs[r].tobytes() == outs[0].tobytes(), f"{name}: rank {r} differs bitwise from rank 0"


def test_numeric_all_to_allv() -> None:
    rng = np.random.default_rng(3)
    n = 5
    splits = tuple(tuple(int(x) for x in rng.integers(0, 6, n)) for _ in range(n))
    shape = CallShape(C.ALL_TO_ALLV, n, 0, splits=splits)
    ins = [rng.standard_normal(sum(splits[r])).astype(np.float32) for r in range(n)]
    outs = _execute(registry.get_schedule(C.ALL_TO_ALLV, "pairwise", n), shape, ins, False)
    for p in range(n):
        parts = []
        for q in range(n):
            off = sum(splits[q][:p])
            parts.append(ins[q][off:off + splits[q][p]])
        np.testing.assert_array_equal(outs[p], np.concatenate(parts))
