"""Rank side of tests/test_torch_backend.py: every torch.distributed operation on backend "ringflow" against a
reference computed locally from every rank's (deterministic) inputs. Prints one JSON line; exit 1 on failures.

    python tests/torch_backend_ranks.py RANK WORLD_SIZE INIT_FILE
"""
from __future__ import annotations

import datetime
import json
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"

warnings.filterwarnings("ignore", category=FutureWarning)
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64]
FAILS: list[str] = []
COUNT = [0]


def data(rank: int, n: int, dtype: torch.dtype, salt: int, lo: int = -8, hi: int = 9) -> torch.Tensor:
    """Rank r's input: small integers (exact in every dtype), the same on every process that asks."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    x = torch.randint(lo, hi, (n,), generator=g)
    return x.to(torch.bool) if dtype == torch.bool else x.to(dtype)


def check(name: str, got: torch.Tensor, want: torch.Tensor, tol: float = 0.0) -> None:
    """Record a failure unless got equals want (within tol)."""
    COUNT[0] += 1
    ok = got.shape == want.shape and got.dtype == want.dtype and (
        torch.equal(got, want) if tol == 0 else torch.allclose(got.double(), want.double(), atol=tol, rtol=tol))
    if not ok:
        FAILS.append(f"{name}: got {got.flatten()[:6].tolist()} want {want.flatten()[:6].tolist()}")


def run(async_op: bool, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Run fn(*args, async_op=...) synchronously, or asynchronously and wait on the Work and its future."""
    w = fn(*args, async_op=async_op, **kwargs)
    if async_op:
        assert w is not None, "async_op=True returned no Work"
        if isinstance(w, torch._C.Future):      # all_reduce_coalesced returns the Work's future
            w.wait()
            return
        w.wait()
        assert w.is_completed()
        w.get_future().wait()


def collectives(rank: int, n: int, a: bool) -> None:
    """The collective matrix for one sync/async mode."""
    tag = "async" if a else "sync"
    R = dist.ReduceOp
    for s, dt in enumerate(DTYPES):
        ins = [data(r, 10, dt, s) for r in range(n)]
        ops = [("sum", R.SUM, lambda xs: sum(xs[1:], xs[0].clone())),
               ("min", R.MIN, lambda xs: torch.stack(xs).min(0).values),
               ("max", R.MAX, lambda xs: torch.stack(xs).max(0).values)]
        if dt.is_floating_point:
            ops.append(("avg", R.AVG, lambda xs, dt=dt: (torch.stack(xs).double().sum(0) / n).to(dt)))
        else:
            ops += [("band", R.BAND, lambda xs: _fold(torch.bitwise_and, xs)),
                    ("bor", R.BOR, lambda xs: _fold(torch.bitwise_or, xs)),
                    ("bxor", R.BXOR, lambda xs: _fold(torch.bitwise_xor, xs))]
        for name, rop, ref in ops:
            x = ins[rank].clone()
            run(a, dist.all_reduce, x, rop)
            check(f"all_reduce {name} {dt} {tag}", x, ref(ins), 1e-2 if name == "avg" else 0.0)
        pin = [data(r, 6, dt, s + 50, 1, 3) for r in range(n)]
        x = pin[rank].clone()
        run(a, dist.all_reduce, x, R.PRODUCT)
        check(f"all_reduce prod {dt} {tag}", x, _fold(torch.mul, pin))
        root = n - 1
        x = ins[rank].clone()
        run(a, dist.broadcast, x, root)
        check(f"broadcast {dt} {tag}", x, ins[root])
        x = ins[rank].clone()
        run(a, dist.reduce, x, root, R.SUM)
        if rank == root:
            check(f"reduce {dt} {tag}", x, sum(ins[1:], ins[0].clone()))
        outs = [torch.empty(10, dtype=dt) for _ in range(n)]
        run(a, dist.all_gather, outs, ins[rank])
        check(f"all_gather {dt} {tag}", torch.cat(outs), torch.cat(ins))
        out = torch.empty(10 * n, dtype=dt)
        run(a, dist.all_gather_into_tensor, out, ins[rank])
        check(f"all_gather_into_tensor {dt} {tag}", out, torch.cat(ins))
        big = [data(r, 4 * n, dt, s + 7) for r in range(n)]
        total = sum(big[1:], big[0].clone())
        o = torch.empty(4, dtype=dt)
        run(a, dist.reduce_scatter_tensor, o, big[rank])
        check(f"reduce_scatter_tensor {dt} {tag}", o, total[4 * rank:4 * rank + 4])
        o = torch.empty(4, dtype=dt)
        run(a, dist.reduce_scatter, o, list(big[rank].chunk(n)))
        check(f"reduce_scatter {dt} {tag}", o, total[4 * rank:4 * rank + 4])
        o = torch.empty(4 * n, dtype=dt)
        run(a, dist.all_to_all_single, o, big[rank])
        check(f"all_to_all_single {dt} {tag}", o, torch.cat([big[r][4 * rank:4 * rank + 4] for r in range(n)]))
        _gather_scatter(rank, n, dt, s, a, tag)
    _uneven(rank, n, a, tag)


def _fold(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], xs: list[torch.Tensor]) -> torch.Tensor:
    acc = xs[0].clone()
    for x in xs[1:]:
        acc = fn(acc, x)
    return acc


def _gather_scatter(rank: int, n: int, dt: torch.dtype, s: int, a: bool, tag: str) -> None:
    ins = [data(r, 5, dt, s + 11) for r in range(n)]
    root = n // 2
    outs = [torch.empty(5, dtype=dt) for _ in range(n)] if rank == root else None
    run(a, dist.gather, ins[rank], outs, dst=root)
    if outs is not None:
        check(f"gather {dt} {tag}", torch.cat(outs), torch.cat(ins))
    o = torch.empty(5, dtype=dt)
    run(a, dist.scatter, o, list(ins) if rank == root else None, src=root)
    check(f"scatter {dt} {tag}", o, ins[rank])
    parts = [data(100 * rank + j, 3, dt, s) for j in range(n)]
    got = [torch.empty(3, dtype=dt) for _ in range(n)]
    run(a, dist.all_to_all, got, parts)
    check(f"all_to_all {dt} {tag}", torch.cat(got), torch.cat([data(100 * r + rank, 3, dt, s) for r in range(n)]))


def _uneven(rank: int, n: int, a: bool, tag: str) -> None:
    """all_to_all_single with split sizes (rows of a 2-D tensor), coalesced calls, non-contiguous, complex, bool."""
    def rows(r: int, j: int) -> int:
        return (r + 2 * j) % 3 + 1
    x = torch.cat([torch.full((rows(rank, j), 2), float(100 * rank + j)) for j in range(n)])
    want = torch.cat([torch.full((rows(r, rank), 2), float(100 * r + rank)) for r in range(n)])
    out = torch.empty_like(want)
    run(a, dist.all_to_all_single, out, x, [rows(r, rank) for r in range(n)], [rows(rank, j) for j in range(n)])
    check(f"all_to_all_single splits {tag}", out, want)
    base = [data(r, 12, torch.float64, 77).view(3, 4) for r in range(n)]
    x = base[rank].clone().t()                       # non-contiguous
    run(a, dist.all_reduce, x)
    check(f"all_reduce non-contiguous {tag}", x, sum(b.t() for b in base))
    c = [torch.complex(data(r, 4, torch.float32, 3), data(r, 4, torch.float32, 4)) for r in range(n)]
    x = c[rank].clone()
    run(a, dist.all_reduce, x)
    check(f"all_reduce complex64 {tag}", x, sum(c[1:], c[0].clone()))
    b = [data(r, 9, torch.bool, 5) for r in range(n)]
    x = b[rank].clone()
    run(a, dist.all_reduce, x, dist.ReduceOp.MAX)
    check(f"all_reduce bool max {tag}", x, torch.stack(b).any(0))
    ts = [[data(r, k + 2, torch.float32, 20 + k) for k in range(3)] for r in range(n)]
    mine = [t.clone() for t in ts[rank]]
    run(a, dist.all_reduce_coalesced, mine)
    for k in range(3):
        check(f"all_reduce_coalesced {k} {tag}", mine[k], sum(ts[r][k] for r in range(n)))
    premul = dist._make_nccl_premul_sum(2.0)
    x = ts[rank][0].clone()
    run(a, dist.all_reduce, x, premul)
    check(f"all_reduce premul_sum {tag}", x, 2 * sum(ts[r][0] for r in range(n)))
    ins = [[data(r, 4, torch.float64, 30 + k) for k in range(2)] for r in range(n)]
    outs = [torch.empty(4 * n, dtype=torch.float64) for _ in range(2)]
    with dist._coalescing_manager(async_ops=a) as cm:
        for k in range(2):
            dist.all_gather_into_tensor(outs[k], ins[rank][k])
    if a:
        cm.wait()
    for k in range(2):
        check(f"all_gather_into_tensor coalesced {k} {tag}", outs[k], torch.cat([ins[r][k] for r in range(n)]))
    rsi = [[data(r, 2 * n, torch.float64, 40 + k) for k in range(2)] for r in range(n)]
    rso = [torch.empty(2, dtype=torch.float64) for _ in range(2)]
    with dist._coalescing_manager(async_ops=a) as cm:
        for k in range(2):
            dist.reduce_scatter_tensor(rso[k], rsi[rank][k])
    if a:
        cm.wait()
    for k in range(2):
        check(f"reduce_scatter_tensor coalesced {k} {tag}", rso[k],
              sum(rsi[r][k] for r in range(n))[2 * rank:2 * rank + 2])


def p2p(rank: int, n: int) -> None:
    """send/recv with tags around the ring, batch_isend_irecv, and a timed-out wait that later completes."""
    if n == 1:
        return
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    x = torch.full((5,), float(rank))
    y = torch.empty(5)
    z = torch.empty(5)
    ws = [dist.irecv(z, prv, tag=3), dist.irecv(y, prv, tag=1),
          dist.isend(x + 10, nxt, tag=1), dist.isend(x, nxt, tag=3)]
    for w in ws:
        w.wait()
    check("isend/irecv tag 1", y, torch.full((5,), float(prv) + 10))
    check("isend/irecv tag 3", z, torch.full((5,), float(prv)))
    got = torch.empty(3, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, torch.arange(3) + rank, nxt), dist.P2POp(dist.irecv, got, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("batch_isend_irecv", got, torch.arange(3) + prv)
    late = torch.empty(2)
    w = dist.irecv(late, prv, tag=9)
    try:
        w.wait(datetime.timedelta(seconds=0.2))
        FAILS.append("wait(timeout) on a recv nobody sent did not raise")
    except dist.DistBackendError as exc:
        COUNT[0] += 1
        if "Timeout" not in str(exc):
            FAILS.append(f"timed-out wait says {exc}")
    dist.barrier()   # no rank sends before every rank's timed wait ended
    dist.send(torch.ones(2) * rank, nxt, tag=9)
    w.wait()
    check("recv after timed-out wait", late, torch.ones(2) * prv)


def groups_and_errors(rank: int, n: int) -> None:
    """A subgroup of the last and first rank (reversed order), and a failing call's error type."""
    members = sorted({n - 1, 0})
    g = dist.new_group(members)
    if rank in members:
        x = torch.full((4,), float(rank + 1))
        dist.all_reduce(x, group=g)
        check("subgroup all_reduce", x, torch.full((4,), float(sum(m + 1 for m in members))))
        assert g.group_name and dist.get_backend(g) == "ringflow"
    try:
        dist.all_gather_into_tensor(torch.empty(3), torch.ones(2))
        FAILS.append("all_gather_into_tensor with a bad output size did not raise")
    except dist.DistBackendError as exc:
        COUNT[0] += 1
        if "InvalidArgument" not in str(exc) or "fix:" not in str(exc):
            FAILS.append(f"bad-size error says {exc}")
    dist.barrier()


def main() -> None:
    """Run the matrix; print {"rank", "checks", "fails"}."""
    rank, n, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("ringflow", init_method=f"file://{init}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=60))
    assert dist.get_backend() == "ringflow"
    for a in (False, True):
        collectives(rank, n, a)
    p2p(rank, n)
    groups_and_errors(rank, n)
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "checks": COUNT[0], "fails": FAILS}))
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
