"""torch.distributed on backend ringflow versus gloo, in the same run: time per call by operation and size.

    python benchmarks/torch_backend.py --ranks 2 4 --min 8 --max 64MiB [-o out.json]

Each rank process initialises gloo as the default group and a ringflow group over the same ranks
(`new_group(backend="ringflow")`), then times all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
broadcast and all_to_all_single on float32 tensors of each size on both groups, alternating. Rank 0
reports the median time per call (max over ranks) and the algorithm bandwidth (bytes / time).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single"]


def _size(text: str) -> int:
    units = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "K": 2**10, "M": 2**20}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    return int(float(num) * units[t[len(num):]])


def _call(op: str, n: int, nbytes: int, group: Any) -> Any:
    """A closure running one call of op on `group` with a message of nbytes (per rank)."""
    import torch
    import torch.distributed as dist
    k = max(n, nbytes // 4 // n * n)
    x = torch.ones(k)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather_into_tensor":
        out, inp = torch.empty(k), torch.ones(k // n)
        return lambda: dist.all_gather_into_tensor(out, inp, group=group)
    if op == "reduce_scatter_tensor":
        out = torch.empty(k // n)
        return lambda: dist.reduce_scatter_tensor(out, x, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(x, 0, group=group)
    out = torch.empty(k)
    return lambda: dist.all_to_all_single(out, x, group=group)


def rank_main(rank: int, n: int, init: str, sizes: list[int], out_path: str) -> None:
    """One rank: time every op and size on both groups; rank 0 writes the results."""
    import warnings

    import torch
    import torch.distributed as dist

    import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=n)
    groups = {"gloo": dist.group.WORLD, "ringflow": dist.new_group(list(range(n)), backend="ringflow")}
    rows = []
    for op in OPS:
        for nbytes in sizes:
            iters = max(3, min(50, int(2e8 // max(nbytes, 1) // 8)))
            row: dict[str, Any] = {"op": op, "bytes": nbytes, "ranks": n}
            for _ in range(2):                 # alternate the backends twice; keep the second round
                for name, g in groups.items():
                    fn = _call(op, n, nbytes, g)
                    fn()
                    dist.barrier(group=g)
                    ts = []
                    for _ in range(iters):
                        t0 = time.perf_counter()
                        fn()
                        ts.append(time.perf_counter() - t0)
                    med = torch.tensor(sorted(ts)[len(ts) // 2], dtype=torch.float64)
                    dist.all_reduce(med, dist.ReduceOp.MAX)
                    row[f"{name}_us"] = med.item() * 1e6
            rows.append(row)
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(rows, fh)
    dist.destroy_process_group()


def main() -> None:
    """Launch the rank processes for each world size and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--min", default="8")
    ap.add_argument("--max", default="64MiB")
    ap.add_argument("--factor", type=int, default=8, help="size step")
    ap.add_argument("-o", "--output", default="", help="write the rows as JSON")
    ap.add_argument("--rank-args", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes, s = [], _size(args.min)
    while s <= _size(args.max):
        sizes.append(s)
        s *= args.factor
    if args.rank_args:
        r, n, init, out = args.rank_args
        rank_main(int(r), int(n), init, sizes, out)
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            out = os.path.join(tmp, f"rows.{n}.json")
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            procs = [subprocess.Popen([sys.executable, __file__, "--min", args.min, "--max", args.max, "--factor",
                                       str(args.factor), "--rank-args", str(r), str(n), os.path.join(tmp, f"i{n}"),
                                       out], env=env) for r in range(n)]
            if any(p.wait() != 0 for p in procs):
                sys.exit(f"a rank of the {n}-rank run failed")
            with open(out) as fh:
                rows.extend(json.load(fh))
    print(f"{'op':<24}{'ranks':>6}{'bytes':>12}{'gloo us':>12}{'ringflow us':>13}{'speed-up':>10}")
    for r in rows:
        print(f"{r['op']:<24}{r['ranks']:>6}{r['bytes']:>12}{r['gloo_us']:>12.1f}{r['ringflow_us']:>13.1f}"
              f"{r['gloo_us'] / r['ringflow_us']:>9.2f}x")
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
