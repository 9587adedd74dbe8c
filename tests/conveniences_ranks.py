"""One rank of tests/test_runtime_conveniences.py (under `ringflow run -n N`): prints a JSON line of failures."""
from __future__ import annotations

import json
import sys

import numpy as np

import ringflow

FAILS: list[str] = []


def check(what: str, ok: bool) -> None:
    """Record a failed check."""
    if not ok:
        FAILS.append(what)


def main() -> None:
    """Identity, bitwise and bool reductions, object collectives, tensor in -> tensor out."""
    env_rank, env_size = ringflow.get_rank(), ringflow.get_world_size()
    comm = ringflow.init()
    r, n = comm.rank, comm.size
    check("get_rank", env_rank == r == ringflow.get_rank())
    check("get_world_size", env_size == n == ringflow.get_world_size())
    check("local_rank", ringflow.local_rank() == r)   # one host
    rows = [[q + 1, 6, 1 << q, 127 - q] for q in range(n)]
    for dt in (np.int8, np.uint8, np.int32, np.uint32, np.int64):
        for op, f in (("band", np.bitwise_and), ("bor", np.bitwise_or), ("bxor", np.bitwise_xor)):
            x = np.array(rows[r], dtype=dt)
            comm.all_reduce(x, op)
            check(f"all_reduce {op} {np.dtype(dt)}", (x == f.reduce(np.array(rows, dtype=dt), axis=0)).all())
    x = np.array(rows[r] * n, dtype=np.int32)
    got = comm.reduce_scatter(x, "bxor")
    check("reduce_scatter bxor", (got == np.bitwise_xor.reduce(np.array(rows, dtype=np.int32), axis=0)).all())
    flags = [r == 0, True, False, r % 2 == 1]
    for op, want in (("bor", [True, True, False, n > 1]), ("band", [n == 1, True, False, False]),
                     ("bxor", [True, n % 2 == 1, False, (n // 2) % 2 == 1]), ("max", [True, True, False, n > 1]),
                     ("min", [n == 1, True, False, False])):
        b = np.array(flags)
        comm.all_reduce(b, op)
        check(f"bool {op}", b.tolist() == want)
    for bad, op in ((np.ones(3), "band"), (np.ones(3, dtype=bool), "avg")):
        try:
            comm.all_reduce(bad, op)
            check(f"{op} on {bad.dtype} raised", False)
        except ringflow.InvalidArgument as exc:
            check(f"{op} on {bad.dtype} hint", bool(exc.hint))
    objs = comm.all_gather_object({"rank": r, "pad": "x" * (r * 100)})
    check("all_gather_object", objs == [{"rank": q, "pad": "x" * (q * 100)} for q in range(n)])
    check("broadcast_object", comm.broadcast_object(("from", r) if r == n - 1 else None, n - 1) == ("from", n - 1))
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        t = torch.arange(2 * n, dtype=torch.float32) + r
        outs = {"all_reduce": comm.all_reduce(t.clone()), "broadcast": comm.broadcast(t.clone(), 0),
                "reduce": comm.reduce(t.clone(), 0), "all_gather": comm.all_gather(t), "gather": comm.gather(t, 0),
                "reduce_scatter": comm.reduce_scatter(t), "scatter": comm.scatter(t, 0),
                "all_to_all": comm.all_to_all(t),
                "all_to_all counts": comm.all_to_all(t, send_counts=[2] * n, recv_counts=[2] * n)}
        for name, o in outs.items():
            check(f"{name} returns a tensor", isinstance(o, torch.Tensor) and o.dtype == torch.float32)
        check("all_gather values", torch.equal(outs["all_gather"], torch.cat(
            [torch.arange(2 * n, dtype=torch.float32) + q for q in range(n)])))
        bf = comm.all_gather(torch.ones(3, dtype=torch.bfloat16))
        check("bfloat16 all_gather", isinstance(bf, torch.Tensor) and bf.dtype == torch.bfloat16
              and bool((bf == 1).all()))
        tb = torch.tensor([r == 0, False])
        comm.all_reduce(tb, "bor")
        check("torch bool bor", tb.tolist() == [True, False])
    comm.destroy()
    print(json.dumps({"rank": r, "fails": FAILS}), flush=True)
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
