"""Memory handed to backend "ringflow" again under another tensor: the same bytes re-viewed with another dtype,
shape, stride, offset or the negative bit, storages shared through set_, buffers freed and allocated again (where
the allocator puts the new one where the old one was), tensors requiring grad. The backend hands ringflow a NumPy
view of a plain contiguous tensor's memory per call, which the collective's door runs at the view's address; every
result here is checked byte for byte against the exact one, over the whole buffer the tensor lives in (so a write
outside the tensor fails too).

Run as a rank: python tests/test_torch_reused_memory.py SEED STEPS RANK WORLD_SIZE INIT_FILE
"""
from __future__ import annotations

import importlib.util
import json
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch (optional extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent
NBYTES = 3 * 8 * 1024 + 128   # every buffer: room for an all-gather of 1024 float64 on 2 ranks and its input
SIZES = [1, 4, 16, 64, 1024]  # squares, so a square view and its transpose have the same shape
OFFSETS = [0, 4, 8, 16, 64]   # bytes (those a dtype's size divides)
RECIPES = ["plain", "plain", "plain", "square", "transpose", "strided", "neg"]
STORAGES = ["base", "base", "set_", "fresh", "freed", "pool"]


# ---------------------------------------------------------------- in-process: the rules, without processes
def test_a_tensor_goes_as_a_view_of_its_memory_only_where_ringflow_can_take_it_as_it_is() -> None:
    import torch

    from ringflow.runtime.call.ops import tensor_view
    buf = torch.zeros(64, dtype=torch.uint8)
    plain = buf[:16].view(torch.float32)
    # two tensor objects, the same memory
    first, second = tensor_view(plain), tensor_view(buf[:16].view(torch.float32))
    assert first is not None and second is not None and second.ctypes.data == plain.data_ptr()
    second[:] = 7.0
    assert plain.tolist() == [7.0] * 4   # the view is that memory
    square = buf[:16].view(torch.float32).view(2, 2)
    sq = tensor_view(square)
    assert sq is not None and sq.shape == (2, 2)
    assert tensor_view(square.t()) is None   # same address and shape, not contiguous: staged
    retyped = tensor_view(buf[:16].view(torch.int32))
    assert retyped is not None and retyped.dtype == "int32"   # same address, another dtype: its own view
    z = buf[:8].view(torch.complex64)
    imag = buf[4:8].view(torch.float32)
    assert tensor_view(imag) is not None
    neg = z.conj().imag   # the same address, dtype and shape as `imag`, holding the negated values
    assert neg.data_ptr() == imag.data_ptr() and neg.is_contiguous() and neg.is_neg()
    assert tensor_view(neg) is None
    assert tensor_view(torch.nn.Parameter(torch.ones(2))) is None   # subclasses are staged
    assert tensor_view(torch.ones(2, requires_grad=True)) is None   # so are tensors requiring grad
    assert tensor_view(torch.ones(4, dtype=torch.bfloat16)) is None   # no NumPy dtype


def test_a_finished_work_is_reused_only_for_a_repeated_call_while_no_one_holds_it() -> None:
    import weakref

    import torch

    from ringflow.torch_backend.work import Succeeded
    ok = Succeeded()
    x = torch.ones(1)
    ids = []
    for _ in range(4):   # as torch's dist.all_reduce does: wait on the Work, then drop it
        w = ok("allreduce", [x])
        assert w.wait() and w.result()[0] is x
        ids.append(id(w))
        del w
    assert ids[2] == ids[1] == ids[3]   # from the second call on the same tensor, one Work
    held = ok("broadcast", [x])
    other = ok("allreduce", [x])   # `held` is held: a new Work, and `held` keeps its outputs
    assert other is not held and held.description == "broadcast" and held.result()[0] is x
    fut = other.get_future()
    del other, held
    again = ok("allreduce", [x])
    assert fut.wait()[0] is x and again.get_future().wait()[0] is x
    del again
    fresh = torch.zeros(1)
    gone = weakref.ref(fresh)
    w = ok("allreduce", [fresh])
    assert w.result()[0] is fresh and id(w) not in ids
    del w, fresh
    assert gone() is None   # a tensor called once is not held past its call


@pytest.mark.long
@pytest.mark.parametrize("seed", [1, 2])
def test_reused_memory_gives_the_exact_result(tmp_path: Path, seed: int) -> None:
    from test_torch_backend import launch
    outs = launch(tmp_path, 2, [str(Path(__file__)), str(seed), "400"])
    for r, out in enumerate(outs):
        res = json.loads(out.strip().splitlines()[-1])
        assert res["rank"] == r and res["steps"] == 400 and res["fails"] == [], res["fails"]
        assert res["shapes"] > 0   # calls ran through call shapes their doors remembered (the fast path)


# ---------------------------------------------------------------- the rank side
def values(rank: int, step: int, k: int, dtype: Any) -> Any:
    """Rank `rank`'s input at `step`: small integers, exact in every dtype and in sums over a few ranks."""
    import torch
    return ((torch.arange(k) * 7 + 3 * rank + step) % 11 - 5).to(dtype)


def view(buf: Any, recipe: str, off: int, k: int, dtype: Any) -> Any:
    """A tensor of k elements of dtype starting at byte `off` of buf (uint8), made as `recipe` says: plain, a square
    matrix or its transpose, every other element, or (float32 at an offset 4 past a multiple of 8) the imaginary
    parts of a conjugated complex view (the negative bit) starting there. All start at `off`; a square, its
    transpose and plain have the same shape for k = 1; strided and plain always do."""
    import torch
    isz = torch.empty(0, dtype=dtype).element_size()
    if recipe == "neg" and dtype == torch.float32 and off % 8 == 4:
        return buf[off - 4:off - 4 + 8 * k].view(torch.complex64).conj().imag
    if recipe == "strided":
        return buf[off:off + 2 * k * isz].view(dtype)[::2]
    flat = buf[off:off + k * isz].view(dtype)
    m = int(round(k ** 0.5))
    if recipe == "square":
        return flat.view(m, m)
    if recipe == "transpose":
        return flat.view(m, m).t()
    return flat


class Storages:
    """The buffers tensors are made over: one kept for the run, new ones, ones freed and made again, a pool."""

    def __init__(self, rng: random.Random) -> None:
        import torch
        self.rng = rng
        self.base = torch.zeros(NBYTES, dtype=torch.uint8)
        self.last: Any = None
        self.pool = [torch.zeros(NBYTES, dtype=torch.uint8) for _ in range(3)]
        self.slot: tuple | None = None   # (storage, dtype, elements, byte offset) of the current calls

    def get(self, how: str) -> Any:
        import torch
        if how == "base":
            return self.base
        if how == "set_":   # a new tensor object over the base's storage
            return torch.empty(0, dtype=torch.uint8).set_(self.base.untyped_storage(), 0, (NBYTES,), (1,))
        if how == "freed":   # the previous new buffer freed first: the allocator tends to hand its memory back
            self.last = None
            self.last = torch.empty(NBYTES, dtype=torch.uint8)
            return self.last
        if how == "fresh":
            self.last = torch.empty(NBYTES, dtype=torch.uint8)
            return self.last
        return self.rng.choice(self.pool)


def step(rank: int, n: int, i: int, rng: random.Random, st: Storages, group: Any) -> str | None:
    """One collective on a tensor over a (re-used) buffer; a description of what differs, or None if exact."""
    import torch
    import torch.distributed as dist
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
    if st.slot is None or rng.random() < 0.25:   # the memory a call lands on stays for a few steps, as in loops
        if rng.random() < 0.2:   # where a negative view sits exactly on a plain one's memory
            st.slot = ("base", torch.float32, 1, 4)
        else:
            dtype = rng.choice(dtypes)
            isz = torch.empty(0, dtype=dtype).element_size()
            st.slot = (rng.choice(STORAGES), dtype, rng.choice(SIZES), rng.choice([o for o in OFFSETS if o % isz == 0]))
    where, dtype, k, off = st.slot
    recipe = rng.choice(RECIPES)
    op = rng.choices(["all_reduce", "broadcast", "all_gather"], weights=[6, 2, 2])[0]
    grad = dtype.is_floating_point and recipe == "plain" and rng.random() < 0.1
    buf = st.get(where)
    buf.copy_(torch.randint(0, 256, (NBYTES,), generator=torch.Generator().manual_seed(i), dtype=torch.uint8))
    ins = [values(r, i, k, dtype) for r in range(n)]
    what = f"step {i}: {op} {dtype} x{k} {recipe} at +{off} of {where}{' (grad)' if grad else ''}"
    if op == "all_gather":   # into a plain output; the input is this rank's slot of it (in place) or other bytes
        out = view(buf, "plain", off, k * n, dtype)
        inplace = rng.random() < 0.5
        isz = out.element_size()
        x = out[rank * k:(rank + 1) * k] if inplace else view(buf, "plain", off + k * n * isz, k, dtype)
        x.copy_(ins[rank])
        want = buf.clone()
        view(want, "plain", off, k * n, dtype).copy_(torch.cat(ins))
        dist.all_gather_into_tensor(out, x, group=group)
    else:
        x = view(buf, recipe, off, k, dtype)
        if grad:
            x.requires_grad_()
        with torch.no_grad():
            x.copy_(ins[rank].view(x.shape))
        want = buf.clone()
        if op == "all_reduce":
            red = rng.choice(["sum", "max", "min"] + (["avg"] if dtype.is_floating_point else []))
            stack = torch.stack([v.double() for v in ins])
            result = {"sum": stack.sum(0), "max": stack.max(0).values, "min": stack.min(0).values,
                      "avg": stack.sum(0) / n}[red].to(dtype)
            what += f" ({red})"
            dist.all_reduce(x, getattr(dist.ReduceOp, red.upper()), group=group)
        else:
            root = rng.randrange(n)
            result = ins[root]
            what += f" (root {root})"
            dist.broadcast(x, root, group=group)
        view(want, recipe, off, k, dtype).copy_(result.view(x.shape))
    if torch.equal(buf, want):
        return None
    bad = (buf != want).nonzero().view(-1)
    return f"{what}: {bad.numel()} bytes differ, first at {int(bad[0])}"


def main() -> None:
    import torch
    import torch.distributed as dist

    import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"
    warnings.filterwarnings("ignore")
    seed, steps, rank, n, init = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("ringflow", init_method=f"file://{init}", rank=rank, world_size=n)
    group = dist.group.WORLD
    rng = random.Random(seed)
    st = Storages(random.Random(seed + 1))
    fails = [f for i in range(steps) if (f := step(rank, n, i, rng, st, group)) is not None]
    shapes = sum(getattr(group.comm, "_door_" + d).shapes() for d in ("all_reduce", "broadcast", "all_gather"))
    print(json.dumps({"rank": rank, "steps": steps, "fails": fails[:10], "shapes": shapes}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
