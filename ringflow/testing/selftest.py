"""A matrix of collective cases checked against NumPy references, run inside real ranks.

    ringflow run -n 4 -m ringflow.testing.selftest --suite core --out /tmp/results

Every rank runs the same ordered list of cases (so collectives match), compares its output with a
NumPy reference built from the inputs of all ranks (inputs are a pure function of rank, element
and case, so every rank can build every other rank's input), and writes
``<out>/rank<r>.json``: the number of cases and the failures. The test suite launches one job per
world size and transport and runs hundreds of cases inside it.

Values are unique per rank and element as far as the dtype allows, and small enough that sums
and products are exact in every dtype (so any reduction order gives the same bits).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import InvalidArgument, Timeout
from ..runtime import native
from ..runtime.call.ops import BFLOAT16, UFUNCS, finish_avg

DTYPES = ["int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
OPS = ["sum", "prod", "min", "max", "avg"]
# value range per dtype so that sums over 4 ranks stay exact (bfloat16 has 8 significant bits)
_RANGE = {"int8": 1 << 20, "uint8": 1 << 20, "int32": 1 << 20, "int64": 1 << 20, "float16": 512, "bfloat16": 64,
          "float32": 1 << 20, "float64": 1 << 20}


def dt(name: str) -> np.dtype:
    """dtype by name (bfloat16 from ml_dtypes)."""
    if name == "bfloat16" and BFLOAT16 is not None:
        return BFLOAT16
    return np.dtype(name)


def values(rank: int, n: int, count: int, dtype: str, op: str = "sum", salt: int = 0) -> np.ndarray:
    """Input of `rank` for one case: unique per (rank, element) within the dtype's exact range."""
    i = np.arange(count, dtype=np.int64)
    if op == "prod":
        if dt(dtype).kind == "f":
            return np.exp2(((i * n + rank + salt) % 3) - 1).astype(dt(dtype))
        return (((i * n + rank + salt) % 5) + 1).astype(dt(dtype))
    v = (i * n + rank + salt * 7) % _RANGE[dtype] + 1
    if dt(dtype).kind == "f" and op in ("min", "max"):
        v = np.where(i % 2 == 0, v, -v)
    return v.astype(dt(dtype))


def reduce_ref(xs: list[np.ndarray], op: str) -> np.ndarray:
    """Reference reduction in the dtype (exact for our values)."""
    out = functools.reduce(lambda a, b: UFUNCS[op](a, b), xs).copy()
    if op == "avg":
        finish_avg(out, len(xs))
    return out


class Runner:
    """Runs cases on one communicator and collects failures."""

    def __init__(self, comm: Any, label: str = "") -> None:
        self.comm, self.label = comm, label
        self.cases = 0
        self.failures: list[str] = []

    def check(self, name: str, fn: Callable[[], None]) -> None:
        """Run one case; record an exception or wrong result as a failure."""
        self.cases += 1
        try:
            fn()
        except AssertionError as exc:
            self.failures.append(f"{self.label}{name}: {exc}")
        except Exception as exc:  # noqa: BLE001 - reported, not swallowed
            self.failures.append(f"{self.label}{name}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")


def _eq(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got, want = np.asarray(got).reshape(-1), np.asarray(want).reshape(-1)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if got.dtype.kind == "f" or got.dtype == BFLOAT16:
        same = np.array_equal(got.astype(np.float64), want.astype(np.float64))
    else:
        same = np.array_equal(got, want)
    if not same:
        bad = np.nonzero(got.astype(np.float64) != want.astype(np.float64))[0]
        raise AssertionError(f"{what}: {bad.size} wrong elements, first at {bad[0]}: got "
                             f"{got[bad[0]]} want {want[bad[0]]}")


def counts_for(n: int) -> list[int]:
    """0, 1, n-1 and a count not divisible by n."""
    return sorted({0, 1, max(n - 1, 0), 7 * n + 3})


def core_cases(r: Runner, dtypes: list[str], ops: list[str], full: bool = True) -> None:
    """Every collective x dtype x op x count, in place and out of place."""
    n = r.comm.size
    for dtype in dtypes:
        for op in ops:
            for count in counts_for(n):
                _reduction_cases(r, dtype, op, count)
                if not full:
                    break
        for count in counts_for(n):
            _movement_cases(r, dtype, count)


def _reduction_cases(r: Runner, dtype: str, op: str, count: int) -> None:
    """all_reduce (in place and out of place), reduce and reduce_scatter for one dtype, op and count."""
    comm = r.comm
    n, me = comm.size, comm.rank
    xs = [values(q, n, count, dtype, op) for q in range(n)]
    ref = reduce_ref(xs, op)

    def ar_in() -> None:
        x = xs[me].copy()
        comm.all_reduce(x, op)
        _eq(x, ref, "all_reduce in place")
    r.check(f"all_reduce {dtype} {op} count={count} in-place", ar_in)

    def ar_out() -> None:
        x = xs[me].copy()
        out = np.zeros_like(x)
        comm.all_reduce(x, op, out=out)
        _eq(out, ref, "all_reduce out")
        _eq(x, xs[me], "all_reduce input untouched")
    r.check(f"all_reduce {dtype} {op} count={count} out-of-place", ar_out)

    root = (count + 1) % n

    def red() -> None:
        x = xs[me].copy()
        out = np.zeros_like(x)
        comm.reduce(x, root, op, out=out)
        if me == root:
            _eq(out, ref, f"reduce root {root}")
    r.check(f"reduce {dtype} {op} count={count} root={root}", red)

    per = [values(q, n, count * n, dtype, op, salt=1) for q in range(n)]
    rs_ref = reduce_ref(per, op)[me * count:(me + 1) * count]

    def rs() -> None:
        out = comm.reduce_scatter(per[me].copy(), op)
        _eq(out, rs_ref, "reduce_scatter")
    r.check(f"reduce_scatter {dtype} {op} count={count}", rs)


def _movement_cases(r: Runner, dtype: str, count: int) -> None:
    """broadcast, all_gather, gather, scatter and all_to_all for one dtype and count."""
    comm = r.comm
    n, me = comm.size, comm.rank
    xs = [values(q, n, count, dtype) for q in range(n)]
    root = count % n

    def bc() -> None:
        x = xs[me].copy()
        comm.broadcast(x, root)
        _eq(x, xs[root], f"broadcast root {root}")
    r.check(f"broadcast {dtype} count={count} root={root}", bc)

    def ag() -> None:
        out = comm.all_gather(xs[me])
        _eq(out, np.concatenate(xs), "all_gather")
        out2 = np.zeros(n * count, dtype=xs[me].dtype)
        comm.all_gather(xs[me], out=out2)
        _eq(out2, np.concatenate(xs), "all_gather into out")
    r.check(f"all_gather {dtype} count={count}", ag)

    def ga() -> None:
        out = np.zeros(n * count, dtype=xs[me].dtype)
        comm.gather(xs[me], root, out=out)
        if me == root:
            _eq(out, np.concatenate(xs), f"gather root {root}")
    r.check(f"gather {dtype} count={count} root={root}", ga)

    big = [values(q, n, count * n, dtype, salt=2) for q in range(n)]

    def sc() -> None:
        out = comm.scatter(big[me].copy(), root)
        _eq(out, big[root][me * count:(me + 1) * count], f"scatter root {root}")
    r.check(f"scatter {dtype} count={count} root={root}", sc)

    def a2a() -> None:
        out = comm.all_to_all(big[me].copy())
        want = np.concatenate([big[q][me * count:(me + 1) * count] for q in range(n)])
        _eq(out, want, "all_to_all")
    r.check(f"all_to_all {dtype} count={count}", a2a)


def uneven_all_to_all(r: Runner) -> None:
    """all_to_all with per-rank counts (v), with and without recv_counts, 2-D rows."""
    comm = r.comm
    n, me = comm.size, comm.rank
    sc = lambda q: [(q + 2 * j) % 3 for j in range(n)]  # noqa: E731 - rows rank q sends to j
    xs = [values(q, n, sum(sc(q)) * 2, "float32").reshape(-1, 2) for q in range(n)]

    def part(q: int, j: int) -> np.ndarray:
        off = sum(sc(q)[:j])
        return xs[q][off:off + sc(q)[j]]

    want = np.concatenate([part(q, me) for q in range(n)])

    def with_counts() -> None:
        out = comm.all_to_all(xs[me].copy(), send_counts=sc(me), recv_counts=[sc(q)[me] for q in range(n)])
        _eq(out, want, "all_to_allv")
    r.check("all_to_allv with recv_counts", with_counts)

    def exchange() -> None:
        out = comm.all_to_all(xs[me].copy(), send_counts=sc(me))
        _eq(out, want, "all_to_allv (counts exchanged)")
    r.check("all_to_allv counts exchanged", exchange)


def p2p_and_async(r: Runner) -> None:
    """send/recv around a ring, overlapping isend/irecv both ways, overlapping async collectives."""
    comm = r.comm
    n, me = comm.size, comm.rank
    if n == 1:
        return
    nxt, prv = (me + 1) % n, (me - 1) % n
    for count in (0, 1, 1000, 300_000):
        def ring(count=count) -> None:
            x = values(me, n, count, "float64")
            y = np.zeros(count, np.float64)
            if me % 2 == 0:
                comm.send(x, nxt, tag=3)
                comm.recv(y, prv, tag=3)
            else:
                comm.recv(y, prv, tag=3)
                comm.send(x, nxt, tag=3)
            _eq(y, values(prv, n, count, "float64"), "recv from previous rank")
        r.check(f"send/recv ring count={count}", ring)

        def overlap(count=count) -> None:
            x = values(me, n, count, "int32")
            y = np.zeros(count, np.int32)
            ws = comm.isend(x, nxt, tag=5)
            wr = comm.irecv(y, prv, tag=5)
            wr.wait(timeout=60)
            ws.wait(timeout=60)
            assert ws.is_completed() and wr.exception() is None
            _eq(y, values(prv, n, count, "int32"), "irecv")
        r.check(f"isend/irecv overlapping count={count}", overlap)

    def many_tags() -> None:
        xs = [np.full(10, me * 100 + t, np.int64) for t in range(4)]
        ys = [np.zeros(10, np.int64) for _ in range(4)]
        recvs = [comm.irecv(ys[t], prv, tag=t) for t in reversed(range(4))]
        sends = [comm.isend(xs[t], nxt, tag=t) for t in range(4)]
        for w in recvs + sends:
            w.wait(timeout=60)
        for t in range(4):
            _eq(ys[t], np.full(10, prv * 100 + t, np.int64), f"tag {t}")
    r.check("p2p tags matched independently", many_tags)

    def async_colls() -> None:
        xs = [values(me, n, c, "float32") for c in (10, 5000, 200_000)]
        refs = [reduce_ref([values(q, n, c, "float32") for q in range(n)], "sum") for c in (10, 5000, 200_000)]
        works = [comm.all_reduce(x, async_op=True) for x in xs]
        g = comm.all_gather(np.full(3, me, np.int32), async_op=True)
        for w in works:
            assert not isinstance(w, np.ndarray)
        for w, x, ref in zip(works, xs, refs, strict=True):
            w.wait(timeout=60)
            _eq(x, ref, "async all_reduce")
        _eq(g.wait(timeout=60), np.repeat(np.arange(n, dtype=np.int32), 3), "async all_gather")
        assert all(w.is_completed() for w in works)
    r.check("async collectives overlapping", async_colls)

    def recv_timeout() -> None:
        y = np.zeros(1)
        try:
            comm.recv(y, prv, tag=99, timeout=0.2)
        except Timeout:
            return
        raise AssertionError("recv with no sender did not time out")
    r.check("per-call timeout on recv", recv_timeout)
    comm.barrier()


def every_algorithm(r: Runner) -> None:
    """Every registered algorithm of every collective, run by the executor (comm.execute)."""
    from ..algorithms import registry
    from ..algorithms.schedule import Collective
    comm = r.comm
    n, me = comm.size, comm.rank
    count = 2 * n + 1
    for c in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST, Collective.ALL_GATHER,
              Collective.GATHER, Collective.REDUCE_SCATTER, Collective.SCATTER, Collective.ALL_TO_ALL):
        for algo in registry.algorithms_for(c):
            if algo == "hierarchical":
                continue
            root = n - 1 if c.has_root else None

            def case(c=c, algo=algo, root=root) -> None:
                kw = {"root": root} if root is not None else {}
                sched = registry.get_schedule(c, algo, n, **kw)
                if c in (Collective.ALL_REDUCE, Collective.REDUCE, Collective.BROADCAST):
                    xs = [values(q, n, count, "float32") for q in range(n)]
                    x = xs[me].copy()
                    out = np.zeros_like(x)
                    comm.execute(sched, x, out)
                    if c == Collective.ALL_REDUCE or (c == Collective.REDUCE and me == root):
                        _eq(out, reduce_ref(xs, "sum"), f"{c.value}/{algo}")
                    elif c == Collective.BROADCAST:
                        _eq(out if me != root else x, xs[root], f"broadcast/{algo}")
                elif c in (Collective.ALL_GATHER, Collective.GATHER):
                    xs = [values(q, n, count, "float32") for q in range(n)]
                    out = np.zeros(n * count, np.float32)
                    comm.execute(sched, xs[me].copy(), out, count=count)
                    if c == Collective.ALL_GATHER or me == root:
                        _eq(out, np.concatenate(xs), f"{c.value}/{algo}")
                else:
                    big = [values(q, n, count * n, "float32", salt=3) for q in range(n)]
                    out = np.zeros(count * (n if c == Collective.ALL_TO_ALL else 1), np.float32)
                    comm.execute(sched, big[me].copy(), out, count=count)
                    if c == Collective.REDUCE_SCATTER:
                        want = reduce_ref(big, "sum")[me * count:(me + 1) * count]
                    elif c == Collective.SCATTER:
                        want = big[root][me * count:(me + 1) * count]
                    else:
                        want = np.concatenate([big[q][me * count:(me + 1) * count] for q in range(n)])
                    _eq(out, want, f"{c.value}/{algo}")
            r.check(f"algorithm {c.value}/{algo}", case)


def groups(r: Runner) -> None:
    """split by parity and new_group: collectives with group-local ranks."""
    comm = r.comm
    n, me = comm.size, comm.rank

    def split_case() -> None:
        sub = comm.split(me % 2, key=-me)
        try:
            members = sorted([q for q in range(n) if q % 2 == me % 2], key=lambda q: -q)
            assert sub.size == len(members), f"group size {sub.size}"
            assert sub.rank == members.index(me), f"group rank {sub.rank}"
            x = np.array([me + 1.0, 10.0 * me])
            sub.all_reduce(x)
            _eq(x, np.array([sum(q + 1.0 for q in members), sum(10.0 * q for q in members)]), "split all_reduce")
            g = sub.all_gather(np.array([me], np.int64))
            _eq(g, np.array(members, np.int64), "split all_gather order")
        finally:
            sub.destroy()
    r.check("split by parity", split_case)

    def group_case() -> None:
        ranks = list(range(n - 1, -1, -2))
        g = comm.new_group(ranks)
        if me not in ranks:
            assert g is None, "non-member got a communicator"
            return
        try:
            assert g.rank == ranks.index(me)
            x = np.full(4, me, np.int32)
            g.broadcast(x, 0)
            _eq(x, np.full(4, ranks[0], np.int32), "group broadcast from group rank 0")
        finally:
            g.destroy()
    r.check("new_group", group_case)

    def mismatch_case() -> None:
        if n == 1:
            return
        x = np.ones(5 if me == 0 else 6, np.float32)
        try:
            comm.all_reduce(x)
        except InvalidArgument:
            pass
        else:
            raise AssertionError("mismatched counts did not raise InvalidArgument")
        y = np.ones(3, np.float32)
        comm.all_reduce(y)
        _eq(y, np.full(3, n, np.float32), "all_reduce after a caught mismatch")
    r.check("mismatched counts raise InvalidArgument on every rank", mismatch_case)

    def alloc_case() -> None:
        x = comm.alloc((3, 5), np.float32)
        x[...] = values(me, n, 15, "float32").reshape(3, 5)
        comm.all_reduce(x)
        _eq(x, reduce_ref([values(q, n, 15, "float32") for q in range(n)], "sum"), "all_reduce on alloc()")
    r.check("alloc buffer", alloc_case)

    def zero_copy_case() -> None:
        # big enough to travel by reference between same-host ranks; out of place and in place, several algorithms
        from ..algorithms import registry
        c = 100_003
        before = comm._transport.regions.zero_copy_sends
        xs = [values(q, n, c, "float32") for q in range(n)]
        ref = reduce_ref(xs, "sum")
        x, out = comm.alloc(c, np.float32), comm.alloc(c, np.float32)
        for algo in registry.algorithms_for("all_reduce"):
            if algo == "hierarchical":
                continue
            x[...] = xs[me]
            out[...] = 0
            comm.execute(registry.get_schedule("all_reduce", algo, n), x, out)
            _eq(out, ref, f"zero-copy all_reduce/{algo} out of place")
            _eq(x, xs[me], f"zero-copy all_reduce/{algo} input untouched")
            comm.execute(registry.get_schedule("all_reduce", algo, n), x)
            _eq(x, ref, f"zero-copy all_reduce/{algo} in place")
        g = comm.alloc(c * n, np.float32)
        x[...] = xs[me]
        comm.all_gather(x, out=g)
        _eq(g, np.concatenate(xs), "zero-copy all_gather")
        y = comm.alloc(c, np.float32)
        y[...] = xs[me]
        comm.broadcast(y, n - 1)
        _eq(y, xs[n - 1], "zero-copy broadcast")
        if n > 1 and comm._transport.shm_peers:
            assert comm._transport.regions.zero_copy_sends > before, "no send went by reference"
    r.check("alloc buffers travel by reference", zero_copy_case)


def torch_cases(r: Runner) -> None:
    """CPU torch tensors (float32, bfloat16, int64) in place and out of place."""
    import torch
    comm = r.comm
    n, me = comm.size, comm.rank
    for tdt, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16"), (torch.int64, "int64")):
        def case(tdt=tdt, name=name) -> None:
            t = torch.arange(6, dtype=torch.float32).to(tdt) + me
            comm.all_reduce(t)
            want = (torch.arange(6, dtype=torch.float32) * n + sum(range(n))).to(tdt)
            assert torch.equal(t, want), f"{t} != {want}"
            out = torch.zeros(n * 6, dtype=tdt)
            comm.all_gather(t, out=out)
            assert torch.equal(out, want.repeat(n)), "all_gather tensor"
        r.check(f"torch {name}", case)

    def same_tensor() -> None:
        t = torch.zeros(4)
        for k in range(3):
            t.fill_(me + k)
            comm.all_reduce(t)
            assert torch.equal(t, torch.full((4,), float(sum(q + k for q in range(n))))), f"repeat {k}: {t}"
        t.data = torch.full((4,), float(me))  # new storage under the same tensor object
        comm.all_reduce(t)
        assert torch.equal(t, torch.full((4,), float(sum(range(n))))), f"after storage swap: {t}"
    r.check("torch tensor reused, then its storage swapped", same_tensor)


def repeated_buffers(r: Runner) -> None:
    """The same arrays called again (the cached binding) with new contents, then other arrays."""
    comm = r.comm
    n, me = comm.size, comm.rank

    def case() -> None:
        x = np.zeros(6, np.float32)
        out = np.zeros(6, np.float32)
        for k in range(4):
            x[...] = values(me, n, 6, "float32", salt=k)
            ref = reduce_ref([values(q, n, 6, "float32", salt=k) for q in range(n)], "sum")
            if k % 2:
                comm.all_reduce(x, out=out)
                _eq(out, ref, f"repeat {k} out of place")
            else:
                comm.all_reduce(x)
                _eq(x, ref, f"repeat {k} in place")
        y = values(me, n, 6, "float32", salt=9)
        comm.all_reduce(y)
        _eq(y, reduce_ref([values(q, n, 6, "float32", salt=9) for q in range(n)], "sum"), "other array")
    r.check("repeated calls on the same arrays", case)

    def fresh() -> None:
        runs = native.hot_stats()["runs"]
        for k in range(6):   # a new array of one shape each call: the remembered call shape, at each one's address
            op = "avg" if k >= 3 else "sum"
            x = values(me, n, 6, "float32", salt=20 + k)
            comm.all_reduce(x, op=op)
            _eq(x, reduce_ref([values(q, n, 6, "float32", salt=20 + k) for q in range(n)], op), f"fresh {op} {k}")
            b = values(me, n, 6, "float32", salt=30 + k)
            comm.broadcast(b, root=n - 1)
            _eq(b, values(n - 1, n, 6, "float32", salt=30 + k), f"fresh broadcast {k}")
            xs = [values(q, n, 2 * n, "float32", salt=50 + k) for q in range(n)]
            out = comm.all_reduce(xs[me].copy(), op=op, out=np.full(2 * n, -1, np.float32))
            _eq(out, reduce_ref(xs, op), f"fresh out-of-place {op} {k}")
            _eq(comm.all_gather(xs[me].copy()), np.concatenate(xs), f"fresh all_gather {k}")
            _eq(comm.all_gather(xs[me].copy(), out=np.zeros(2 * n * n, np.float32)), np.concatenate(xs),
                f"fresh all_gather into out {k}")
            _eq(comm.reduce_scatter(xs[me].copy(), op=op), reduce_ref(xs, op)[2 * me:2 * me + 2],
                f"fresh reduce_scatter {op} {k}")
            _eq(comm.all_to_all(xs[me].copy()), np.concatenate([x[2 * me:2 * me + 2] for x in xs]),
                f"fresh all_to_all {k}")
        if native.hot_stats()["runs"] > runs:   # they ran natively: from remembered call shapes after the first
            assert len(comm._mem.by_shape) >= 8, f"call shapes remembered: {list(comm._mem.by_shape)}"
        big = values(me, n, 12, "float32", salt=40)
        for what, bad in (("not contiguous", big[::2]), ("read-only", big[:6].copy())):
            if what == "read-only":
                bad.flags.writeable = False
            try:
                comm.all_reduce(bad)
            except InvalidArgument as exc:
                assert what in str(exc), exc
            else:
                raise AssertionError(f"a {what} array of a remembered call shape was accepted")
    r.check("a fresh array of one shape each call", fresh)


def large_cases(r: Runner) -> None:
    """Messages of several MiB: many shared-memory slots, striped TCP streams, odd counts."""
    comm = r.comm
    n, me = comm.size, comm.rank
    count = 1_500_001  # 6 MB of float32, not divisible by n

    def ar() -> None:
        xs = [values(q, n, count, "float32") for q in range(n)]
        x = xs[me].copy()
        comm.all_reduce(x)
        _eq(x, reduce_ref(xs, "sum"), "large all_reduce")
    r.check("large all_reduce", ar)

    def ar_huge() -> None:   # reductions of 16 MiB and more read a peer 1 MiB per syscall (cma.chunk_bytes)
        big = 9_000_001
        xs = [values(q, n, big, "float32") for q in range(n)]
        x = xs[me].copy()
        comm.all_reduce(x)
        _eq(x, reduce_ref(xs, "sum"), "36 MB all_reduce")
    r.check("36 MB all_reduce", ar_huge)

    def ag() -> None:
        c = count // n
        xs = [values(q, n, c, "int32", salt=4) for q in range(n)]
        _eq(comm.all_gather(xs[me]), np.concatenate(xs), "large all_gather")
    r.check("large all_gather", ag)

    def scatter_tree() -> None:
        # binomial scatter sends several blocks to one child in one step: they must not interleave
        from ..algorithms import registry
        c = 1_200_001
        root = n - 1
        big = [values(q, n, c * n, "float32", salt=5) for q in range(n)]
        out = np.zeros(c, np.float32)
        comm.execute(registry.get_schedule("scatter", "binomial", n, root=root), big[me].copy(), out, count=c)
        _eq(out, big[root][me * c:(me + 1) * c], "large binomial scatter")
    r.check("large binomial scatter", scatter_tree)

    def lone_send() -> None:
        # a 2-rank broadcast is one send the root has nothing else to do during: with a core per
        # local rank it goes through the slots (both ranks copy), otherwise by single copy
        from ..runtime.transport import cma, shm
        if n != 2 or comm._transport.kind(1 - me) != "shm":
            return
        c = shm.PIPELINE_MIN_BYTES // 4 + 3
        x = values(0, n, c, "float32", salt=6) if me == 0 else np.zeros(c, np.float32)
        before = cma.reads
        comm.broadcast(x, 0)
        _eq(x, values(0, n, c, "float32", salt=6), "lone-send broadcast")
        if me == 1 and comm._transport.cma_links():
            spare = not shm.doorbell.oversubscribed(comm._transport.local_ranks)
            assert (cma.reads == before) == spare, \
                f"single-copy reads {cma.reads - before} with a spare core {spare}"
    r.check("lone-send broadcast", lone_send)

    def one_slot_slices() -> None:
        # a message that fits one slot is cut into slices (the receiver drains one while the sender
        # fills the next): every byte arrives, and the sender used as many slots as slices
        from ..runtime.transport import shm
        if n != 2 or comm._transport.kind(1 - me) != "shm":
            return
        slot = comm._transport.slot_bytes

        def slots_sent() -> int:   # slots rank 0 has filled towards rank 1 on every connection
            return sum(o.head for (p, _), o in comm._transport._out.items() if p == 1 and isinstance(o, shm.ShmOut))
        wrong = []
        # below the single-copy size of plain receives (larger ones go by reference when the pair can)
        for k, nbytes in enumerate((2 * shm.MIN_SLICE_BYTES + 4, 200_004, min(slot, shm.CMA_COPY_MIN_BYTES) - 4)):
            c = nbytes // 4
            want = values(0, n, c, "int32", salt=10 + k)
            if me == 0:
                heads = slots_sent()
                comm.send(want, 1)
                per, used = shm.slice_bytes(c * 4, slot), slots_sent() - heads
                if not used == -(-c * 4 // per) > 1:
                    wrong.append(f"{c * 4} bytes took {used} slots, slices of {per}")
            else:
                got = np.zeros(c, np.int32)
                comm.recv(got, 0)
                _eq(got, want, f"one-slot message of {c * 4} bytes")
        assert not wrong, "; ".join(wrong)
    r.check("one-slot messages in slices", one_slot_slices)


def traffic_class(r: Runner) -> None:
    """With a traffic class set, every TCP data and control socket carries it in IP_TOS."""
    import socket
    comm = r.comm
    tos = comm._sh.tos
    if tos is None or comm.size == 1:
        return

    def case() -> None:
        from ..runtime.transport.tcp import TcpOut
        outs = [c for c in comm._transport._out.values() if isinstance(c, TcpOut)]
        ctrl = list(comm._watchdog._socks.values())
        assert outs and ctrl, "no TCP sockets to check"
        for s in [c.sock for c in outs] + ctrl:
            got = s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)
            assert got == tos, f"IP_TOS {got} != {tos}"
    r.check("traffic class sets IP_TOS", case)


def core_suite(r: Runner) -> None:
    """The full dtype x op matrix and every other case group."""
    core_cases(r, DTYPES, OPS)
    uneven_all_to_all(r)
    p2p_and_async(r)
    groups(r)
    every_algorithm(r)
    large_cases(r)
    repeated_buffers(r)


def tcp_suite(r: Runner) -> None:
    """A smaller dtype x op matrix, the other case groups and the traffic-class check."""
    core_cases(r, ["int32", "float32", "bfloat16"], ["sum", "max"], full=False)
    uneven_all_to_all(r)
    p2p_and_async(r)
    every_algorithm(r)
    traffic_class(r)
    large_cases(r)


def torch_suite(r: Runner) -> None:
    """Torch tensors, and buffers reused across calls."""
    torch_cases(r)
    repeated_buffers(r)


def quick_suite(r: Runner) -> None:
    """Every collective for one dtype and op."""
    core_cases(r, ["float32"], ["sum"], full=False)


SUITES: dict[str, Callable[[Runner], None]] = {
    "core": core_suite,
    "tcp": tcp_suite,
    "torch": torch_suite,
    "quick": quick_suite,
}


def main(argv: list[str] | None = None) -> int:
    """Run a suite in this rank; write <out>/rank<r>.json."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="quick", choices=sorted(SUITES))
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    import ringflow
    comm = ringflow.init(timeout=args.timeout)
    r = Runner(comm)
    try:
        SUITES[args.suite](r)
        comm.barrier()
    finally:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{comm.rank}.json"), "w") as fh:
            transports = {str(p): comm._transport.kind(p) for p in range(comm.size) if p != comm.rank}
            from ..runtime.transport import cma
            hot = native.hot_stats()
            json.dump({"rank": comm.rank, "size": comm.size, "cases": r.cases, "failures": r.failures,
                       "transports": transports, "cma_reads": cma.reads + hot["cma_reads"],
                       "native_runs": hot["runs"], "native": native.hot_available(),
                       "cma_links": comm._transport.cma_links()}, fh)
        comm.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
