"""The native executor's reductions against NumPy's, element for element, for every dtype and op it takes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringflow.runtime import native
from ringflow.runtime.call import hotpath
from ringflow.runtime.call.ops import BITWISE_OPS, SUPPORTED_DTYPES, UFUNCS, check_dtype

needs_hot = pytest.mark.skipif(native._hotpath is None, reason="native executor not built (no C compiler at install)")


def _dtype(name: str) -> np.dtype:
    from ringflow.runtime.call.ops import BFLOAT16
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)  # type: ignore[return-value]


def _values(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    x = (rng.standard_normal(n) * 100).astype(np.float32).astype(dtype)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 1e-8], dtype=np.float32).astype(dtype)
    k = min(n, special.size)
    x[rng.permutation(n)[:k]] = special[:k]
    return x


CASES = [(d, op) for d in SUPPORTED_DTYPES for op in UFUNCS if op != "avg"
         and not (op in BITWISE_OPS and _dtype(d).kind not in "biu")]


@needs_hot
@pytest.mark.parametrize("dtype_name,op", CASES)
@settings(max_examples=5, deadline=None)
@given(n=st.integers(0, 700), seed=st.integers(0, 2**16))
def test_native_reduction_equals_numpy(dtype_name: str, op: str, n: int, seed: int) -> None:
    dtype = check_dtype(_dtype(dtype_name))
    a, b = _values(dtype, n, seed), _values(dtype, n, seed + 1)
    want = np.empty_like(a)
    with np.errstate(all="ignore"):
        UFUNCS[op](a, b, out=want)
    got = np.full_like(a, 7) if n else np.empty_like(a)
    native._hotpath.reduce_into(hotpath._DTYPES[dtype], hotpath.OPS[op], got.ctypes.data, a.ctypes.data,
                                b.ctypes.data, n)
    if dtype.kind == "f" or dtype == _dtype("bfloat16"):
        wf, gf = want.astype(np.float64), got.astype(np.float64)
        same = (wf == gf) | (np.isnan(wf) & np.isnan(gf))
        assert same.all(), (dtype_name, op, a[~same][:4], b[~same][:4], want[~same][:4], got[~same][:4])
    else:
        assert np.array_equal(got, want), (dtype_name, op)


def test_every_supported_dtype_and_op_has_a_native_code() -> None:
    assert {np.dtype(_dtype(d)) for d in SUPPORTED_DTYPES} == set(hotpath._DTYPES)
    assert set(UFUNCS) == set(hotpath.OPS)


def test_the_knob_turns_the_native_executor_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGFLOW_NATIVE", "0")
    assert not native.hot_available()
    from ringflow.algorithms.plan import Plan
    assert hotpath.build(Plan((), 0, True), None, 0.0, np.dtype(np.float32), "sum") is hotpath.UNSUITED


def test_early_local_ops_touch_nothing_the_step_moves() -> None:
    """A local op runs early (overlapping the step's transfers) only if no transfer of the step reads or writes
    its bytes; in place, IN and OUT are one buffer."""
    from ringflow.algorithms.layout import CallShape
    from ringflow.algorithms.plan import compile_plan
    from ringflow.algorithms.registry import get_schedule
    from ringflow.algorithms.schedule import Collective
    ag = get_schedule(Collective.ALL_GATHER, "bruck", 2)
    step = compile_plan(ag, CallShape(Collective.ALL_GATHER, 2, 1024, 4, None), 0, False).steps[0]
    assert [lo.kind.name for lo in step.locals] == ["COPY"]
    assert hotpath.early_locals(step, 4, inplace=False) == [True]    # own block IN -> OUT, disjoint from the move
    assert hotpath.early_locals(step, 4, inplace=True) == [False]    # in place, OUT[own block] is what is sent
    for coll, alg in ((Collective.ALL_REDUCE, "recursive_doubling"), (Collective.ALL_REDUCE, "ring"),
                      (Collective.ALL_TO_ALL, "pairwise"), (Collective.REDUCE_SCATTER, "halving_doubling")):
        sch = get_schedule(coll, alg, 4)
        for inplace in (False, True):
            plan = compile_plan(sch, CallShape(coll, 4, 4096, 4, None), 1, inplace)
            for stp in plan.steps:
                flags = hotpath.early_locals(stp, 4, inplace)
                moved = [(x.buf, x.off, x.off + x.nbytes) for x in stp.xfers]
                for lo, early in zip(stp.locals, flags, strict=True):
                    if early:   # the destination overlaps no transfer's bytes (same buffer naming as the plan)
                        assert not any(b == lo.dst and a < lo.dst_off * 4 + lo.n * 4 and lo.dst_off * 4 < e
                                       for b, a, e in moved)
