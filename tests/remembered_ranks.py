"""Rank side of the remembered-call property test: runs the steps a driver sends over a connection and answers
each with the rank's result or the type of the typed error it raised.

Usage: ringflow run -n 2 -- python tests/remembered_ranks.py HOST:PORT AUTHKEY_HEX
Buffers live in slots; a step may mutate a slot (dtype, size, storage, flags, offset, reallocation) between
collectives, or call on a fresh array made like the slot's (another dtype, strided, 2-D, read-only, unaligned), so
the communicator's remembered calls and call shapes are held to the full path's results.
"""
from __future__ import annotations

import sys
import traceback
from multiprocessing.connection import Client
from typing import Any

import numpy as np

import ringflow
from ringflow.errors import RingflowError

try:
    import torch
except ImportError:  # pragma: no cover - the driver sends no torch steps then
    torch = None

RETYPE = {np.dtype(np.float32): np.int32, np.dtype(np.int32): np.float32,
          np.dtype(np.float64): np.int64, np.dtype(np.int64): np.float64}


def values(n: int, rank: int, gen: int) -> np.ndarray:
    """This rank's input for a call of n elements (small integers: every dtype reduces them exactly)."""
    return (np.arange(n) % 7 + rank + gen).astype(np.int64)


class Rank:
    """The rank's slots and its current communicator (a split of the world, replaced after a failure)."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.comm = world.split(0)
        self.slots: dict[int, Any] = {}
        self.bases: dict[int, Any] = {}   # slot -> the larger array a view slot lives in
        self.outs: dict[tuple, Any] = {}   # kept output buffers (kept_out)

    def fill(self, x: Any, gen: int) -> None:
        v = values(int(x.numel() if hasattr(x, "numel") else x.size), self.world.rank, gen)
        if isinstance(x, np.ndarray):
            w = x.flags.writeable
            x.flags.writeable = True
            x[...] = v.astype(x.dtype).reshape(x.shape)   # x may be strided: reshape(-1) would be a copy
            x.flags.writeable = w
        else:
            x.view(-1).copy_(torch.from_numpy(v).to(x.dtype))

    def new(self, s: int, kind: str, dtype: str, n: int) -> None:
        if kind == "torch":
            self.slots[s] = torch.zeros(n, dtype=getattr(torch, dtype))
        else:
            self.slots[s] = np.zeros(n, dtype)
        self.bases.pop(s, None)

    def step(self, st: dict[str, Any]) -> Any:
        op, s = st["op"], st.get("slot")
        x = self.slots.get(s)
        c = self.comm
        if op == "reset":
            self.slots.clear()
            self.bases.clear()
            self.resplit()
            return None
        if op == "new":
            self.new(s, st["kind"], st["dtype"], st["n"])
            return None
        if op == "retype":
            x.dtype = RETYPE[x.dtype]
            return None
        if op == "writeable":
            x.flags.writeable = st["flag"]
            return None
        if op == "resize":
            if st.get("rank") in (None, self.world.rank):
                try:
                    x.resize_(st["n"])
                except RuntimeError:   # torch cannot grow a storage that a NumPy view was taken of: swap it
                    x.set_(torch.zeros(st["n"], dtype=x.dtype))
            return None
        if op == "set_":
            x.set_(torch.zeros(st["n"], dtype=x.dtype))
            return None
        if op == "data":
            x.data = torch.zeros(st["n"], dtype=x.dtype)
            return None
        if op == "realloc":
            old = self.slots.pop(s)
            shape, dt, numpy = old.shape, old.dtype, isinstance(old, np.ndarray)
            del old, x
            self.slots[s] = np.zeros(shape, dt) if numpy else torch.zeros(shape, dtype=dt)
            return None
        if op == "view":
            base = self.bases.get(s)
            if base is None or base.size < st["n"] + st["off"] or base.dtype != np.dtype(st["dtype"]):
                base = self.bases[s] = np.zeros(st["n"] + 64, st["dtype"])
            self.slots[s] = base[st["off"]:st["off"] + st["n"]]
            return None
        if op == "tune":
            c.tune_with(None)
            return None
        if op == "resplit":
            self.resplit()
            return None
        return self.collective(op, x, st, c)

    def resplit(self) -> None:
        try:
            self.comm.destroy()
        except RingflowError:
            pass
        self.comm = self.world.split(0)

    @staticmethod
    def fresh(x: np.ndarray, how: str) -> np.ndarray:
        """A new array for one call, made like slot array x: the same dtype and shape ("copy"), another dtype
        ("retyped"), strided, 2-D, read-only (once filled) or at an address not aligned for its dtype."""
        if how == "retyped":
            return np.empty(x.shape, RETYPE[x.dtype])
        if how == "strided":
            return np.empty(2 * x.size, x.dtype)[::2]
        if how == "2d":
            return np.empty((x.size, 1), x.dtype)
        if how == "unaligned":
            return np.empty(x.nbytes + 1, np.uint8)[1:].view(x.dtype)
        return np.empty_like(x)   # copy, readonly

    def collective(self, op: str, x: Any, st: dict[str, Any], c: Any) -> Any:
        if op == "pattern":   # the argument check's log-depth rounds (0: the pairs pattern)
            return np.array([c._pattern()[1]])
        if op == "doors":   # how many call shapes the communicator's doors hold
            return np.array([sum(getattr(c, "_door_" + d).shapes() for d in
                                 ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"))])
        gen = st["gen"]
        how = st.get("fresh")
        if how is not None:
            x = self.fresh(x, how)
        self.fill(x, gen)
        if how == "readonly":
            x.flags.writeable = False
        if op == "all_reduce":
            mode = st["out"]
            if mode == "none":
                return c.all_reduce(x, st["red"])
            if mode == "self":
                return c.all_reduce(x, st["red"], out=x)
            if mode == "fresh":
                return c.all_reduce(x, st["red"], out=np.empty_like(x) if isinstance(x, np.ndarray)
                                    else torch.empty_like(x))
            n, off = x.size, st["off"]   # overlap: x and out are windows of one array
            b = np.zeros(n + off, x.dtype)
            b[:n] = x.reshape(-1)
            return c.all_reduce(b[:n], st["red"], out=b[off:off + n])
        if op == "broadcast":
            return c.broadcast(x, st["root"])
        out = self.kept_out(op, st["slot"], x) if st.get("out") == "kept" else None
        if st.get("out") == "fresh":
            out = np.empty_like(self.kept_out(op, st["slot"], x))
        if op == "all_gather":
            if st.get("out") == "overlap":   # x is this rank's part of out (torch's in-place all-gather)
                b = np.empty(x.size * self.comm.size, x.dtype)
                part = b[self.world.rank * x.size:(self.world.rank + 1) * x.size]
                part[...] = x.reshape(-1)
                return c.all_gather(part, out=b)
            return c.all_gather(x, out=out)
        if op == "reduce_scatter":
            return c.reduce_scatter(x, "sum", out=out)
        if op == "all_to_all":
            return c.all_to_all(x, out=out)
        raise ValueError(op)

    def kept_out(self, op: str, slot: int, x: Any) -> Any:
        """The output buffer this rank keeps for `op` on `slot` (a new one when x's kind, dtype or size changed):
        repeated calls on it run through the collective's door."""
        n = x.shape[0] if x.ndim else 1
        count = {"all_gather": n * self.comm.size, "reduce_scatter": n // self.comm.size, "all_to_all": n}[op]
        key = (op, slot, isinstance(x, np.ndarray), str(x.dtype), count)
        out = self.outs.get(key)
        if out is None:
            out = self.outs[key] = np.zeros(count, x.dtype) if isinstance(x, np.ndarray) \
                else torch.zeros(count, dtype=x.dtype)
        return out


def main() -> int:
    host, port = sys.argv[1].rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(sys.argv[2]))
    world = ringflow.init(timeout=60.0)
    rank = Rank(world)
    conn.send(world.rank)
    while True:
        st = conn.recv()
        if st is None:
            break
        try:
            r = rank.step(st)
            if r is None:
                conn.send(("ok", None))
            else:
                a = r.numpy() if not isinstance(r, np.ndarray) else r
                conn.send(("ok", np.array(a, copy=True)))
        except RingflowError as e:
            conn.send(("err", type(e).__name__, str(e)[:300]))
        except Exception:   # noqa: BLE001 - a bug of the test or of ringflow: the driver fails with it
            conn.send(("crash", traceback.format_exc()[-6000:]))
    rank.comm.destroy()
    world.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
