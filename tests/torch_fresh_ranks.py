"""Rank side of tests/test_torch_fresh_tensors.py: random steps, the same on every rank (one seed), each a
collective through torch.distributed on backend "ringflow" whose tensor was replaced or mutated since the
group last saw it, checked exactly against the result computed from every rank's inputs. Prints one JSON line.

    python tests/torch_fresh_ranks.py SEED STEPS RANK WORLD_SIZE INIT_FILE
"""
from __future__ import annotations

import json
import random
import sys
import warnings
from typing import Any

import torch
import torch.distributed as dist

import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"

warnings.filterwarnings("ignore")
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
SIZES = [1, 2, 6, 64, 1000]
MUTATIONS = ["same", "fresh", "refill", "set_", "data", "resize_", "narrow", "transpose", "grad", "pool"]
OPS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"]


def values(rank: int, step: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank `rank`'s input at `step`: small integers, exact in every dtype and in sums over a few ranks."""
    return ((torch.arange(n) * 7 + 3 * rank + step) % 11 - 5).to(dtype)


class Slots:
    """Tensors held across steps, each replaced or mutated as a step's mutation says."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.t: dict[int, torch.Tensor] = {}
        self.shape: dict[int, tuple[str, torch.dtype, int]] = {}   # slot -> (collective, dtype, count)
        self.pool: list[torch.Tensor] = []

    def get(self, slot: int, n: int, dtype: torch.dtype, how: str) -> torch.Tensor:
        """The slot's tensor with n elements of dtype after mutation `how` (its values are set by the caller)."""
        old = self.t.get(slot)
        if old is None or how == "fresh" or old.requires_grad:
            t = torch.empty(n, dtype=dtype)
        elif how == "same" or how == "refill":
            t = old if old.dtype == dtype and old.numel() == n and old.is_contiguous() else torch.empty(n, dtype=dtype)
        elif how == "set_":
            t = old if old.dtype == dtype else torch.empty(n, dtype=dtype)
            t.set_(torch.empty(n, dtype=dtype).untyped_storage(), 0, (n,), (1,))
        elif how == "data":
            t = old.detach()
            t.data = torch.empty(n, dtype=dtype)
        elif how == "resize_":   # shrinks in place (same object and address, new shape); a storage NumPy has
            # viewed cannot grow
            t = old if old.dtype == dtype and old.is_contiguous() and old.numel() >= n else torch.empty(n, dtype=dtype)
            t.resize_(n)
        elif how == "narrow":
            off = self.rng.randrange(0, 5)
            t = torch.empty(n + 8, dtype=dtype)[off:off + n]
        elif how == "transpose":   # a non-contiguous tensor with n elements: staged, results copied back
            t = torch.empty(2 * n, dtype=dtype).view(n, 2).t()[0]
        elif how == "grad" and dtype.is_floating_point:
            t = torch.empty(n, dtype=dtype).requires_grad_()
        else:   # "pool" (DDP-like: a few persistent tensors in turn), or "grad" on an integer dtype
            found = [p for p in self.pool if p.dtype == dtype and p.numel() == n and p.is_contiguous()]
            t = self.rng.choice(found) if found else torch.empty(n, dtype=dtype)
            if not found:
                self.pool = [*self.pool[-7:], t]
        self.t[slot] = t
        return t


def fill(t: torch.Tensor, v: torch.Tensor) -> None:
    with torch.no_grad():
        t.copy_(v.view(t.shape))


def step(rank: int, n: int, i: int, rng: random.Random, slots: Slots,
         rf: Any) -> tuple[str, torch.Tensor, torch.Tensor]:
    """One collective on mutated tensors: (what it was, the result, the exact expected result)."""
    how, slot = rng.choice(MUTATIONS), rng.randrange(3)
    if slot not in slots.shape or rng.random() < 0.15:   # a slot keeps its call shape for a while, as loops do
        slots.shape[slot] = (rng.choice(OPS), rng.choice(DTYPES), rng.choice(SIZES))
    op, dtype, k = slots.shape[slot]
    what = f"step {i}: {op} {dtype} x{k} after {how} in slot {slot}"
    ins = [values(r, i, k * (n if op in ("reduce_scatter", "all_to_all") else 1), dtype) for r in range(n)]
    x = slots.get(slot, ins[rank].numel(), dtype, how)
    fill(x, ins[rank])
    if op == "all_reduce":
        red = rng.choice(["sum", "max", "min"] + (["avg"] if dtype.is_floating_point else []))
        dist.all_reduce(x, getattr(dist.ReduceOp, {"sum": "SUM", "max": "MAX", "min": "MIN", "avg": "AVG"}[red]),
                        group=rf)
        stack = torch.stack([v.double() for v in ins])
        want = {"sum": stack.sum(0), "max": stack.max(0).values, "min": stack.min(0).values,
                "avg": stack.sum(0) / n}[red].to(dtype)
        return f"{what} ({red})", x.detach().clone(), want
    if op == "broadcast":
        root = rng.randrange(n)
        dist.broadcast(x, root, group=rf)
        return f"{what} (root {root})", x.detach().clone(), ins[root]
    if op == "all_gather":
        out = slots.get(3 + slot, k * n, dtype, rng.choice(["same", "fresh", "narrow", "pool"]))
        dist.all_gather_into_tensor(out, x.detach(), group=rf)
        return what, out.clone(), torch.cat(ins)
    if op == "reduce_scatter":
        out = slots.get(3 + slot, k, dtype, rng.choice(["same", "fresh", "narrow", "pool"]))
        dist.reduce_scatter_tensor(out, x.detach(), group=rf)
        total = torch.stack([v.double() for v in ins]).sum(0).to(dtype)
        return what, out.clone(), total[rank * k:(rank + 1) * k]
    out = slots.get(3 + slot, k * n, dtype, rng.choice(["same", "fresh", "narrow", "pool"]))
    dist.all_to_all_single(out, x.detach(), group=rf)
    return what, out.clone(), torch.cat([v[rank * k:(rank + 1) * k] for v in ins])


def main() -> None:
    seed, steps, rank, n, init = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("ringflow", init_method=f"file://{init}", rank=rank, world_size=n)
    rf = dist.group.WORLD
    rng, slots, fails = random.Random(seed), Slots(random.Random(seed + 1)), []
    for i in range(steps):
        what, got, want = step(rank, n, i, rng, slots, rf)
        if got.dtype != want.dtype or not torch.equal(got.reshape(-1), want.reshape(-1)):
            fails.append(f"{what}: got {got.reshape(-1)[:6].tolist()} want {want.reshape(-1)[:6].tolist()}")
    shapes = len(rf.comm._mem.by_shape)   # call shapes remembered: the path fresh tensors take
    print(json.dumps({"rank": rank, "steps": steps, "fails": fails[:10], "shapes": shapes}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
