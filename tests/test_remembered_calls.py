"""Remembered calls never give a wrong value: a stateful property test over a real job of 2 ranks (or more).

The driver (this process) sends both ranks the same steps: collectives on buffers held in slots, interleaved
with mutations of those buffers after the communicator remembered them (dtype reassignment, torch resize_,
set_ and .data =, the writeable flag, views at moving offsets, dropping and reallocating, out= overlapping x,
kept output buffers, tune_with, a new communicator), and calls on fresh arrays made like a slot's (same or
another dtype, strided, 2-D, read-only, unaligned; fresh, kept or overlapping out=), which the call shapes the
doors remember must tell apart. Each collective's result is checked against NumPy on both ranks; the only
allowed outcomes are the exact result on every rank or a typed error on every rank.

It runs on 2 ranks with the flight recorder on and off, and on 4 ranks with every call on the log-depth argument
check (`RINGFLOW_CHECK_ROUNDS=log`, `algorithms.check_rounds`; 2 ranks have a single exchange either way).
"""
from __future__ import annotations

import math
import os
import secrets
import subprocess
import sys
from collections import Counter
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

sys.path.insert(0, str(Path(__file__).parent))
from remembered_ranks import RETYPE, values  # noqa: E402

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:  # pragma: no cover
    HAVE_TORCH = False

ROOT = Path(__file__).resolve().parents[1]
SLOTS = st.integers(0, 3)
SIZES = st.sampled_from([2, 8, 64, 1000, 6000])   # 6000 x 8 bytes: past the low-latency threshold
DTYPES = st.sampled_from(["float32", "float64", "int32", "int64"])
KINDS = st.sampled_from(["numpy", "torch"] if HAVE_TORCH else ["numpy"])
EXAMPLES = 25   # runs of the state machine per job
TALLY: Counter[str] = Counter()   # steps run, by kind: the test's size, printed at the end


class Job:
    """`nranks` rank processes under `ringflow run`, each connected to this driver."""

    def __init__(self, env: dict[str, str], nranks: int) -> None:
        self.env, self.nranks = env, nranks
        key = secrets.token_bytes(16)
        self.listener = Listener(("127.0.0.1", 0), authkey=key)
        host, port = self.listener.address
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ringflow", "run", "-n", str(nranks), "--no-bind", "--timeout", "900", "--",
             sys.executable, str(ROOT / "tests" / "remembered_ranks.py"), f"{host}:{port}", key.hex()],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
        self.conns: list[Any] = [None] * nranks
        accepted = [self.listener.accept() for _ in range(nranks)]   # each rank's handshake, before its init
        for c in accepted:
            self.conns[c.recv()] = c

    def step(self, st_: dict[str, Any]) -> list[tuple]:
        try:
            for c in self.conns:
                c.send(st_)
            out = []
            for c in self.conns:
                if not c.poll(60):
                    raise AssertionError(f"a rank did not answer step {st_} within 60 s")
                out.append(c.recv())
        except (EOFError, OSError):
            self.proc.kill()
            raise AssertionError(f"a rank died at step {st_}:\n{self.proc.communicate()[0][-4000:]}") from None
        return out

    def close(self) -> str:
        for c in self.conns:
            c.send(None)
        out, _ = self.proc.communicate(timeout=60)
        self.listener.close()
        return out


# with the flight recorder off, a remembered call on NumPy arrays runs as one C call (hotpath.call_runner); with it
# on, through the recorder in Python
JOBS = {"recorder on": ({}, 2), "recorder off": ({"RINGFLOW_FLIGHT_RECORDER": "0"}, 2),
        "4 ranks, log-depth check": ({"RINGFLOW_FLIGHT_RECORDER": "0", "RINGFLOW_CHECK_ROUNDS": "log"}, 4)}


@pytest.fixture(scope="module", params=list(JOBS))
def job(request: pytest.FixtureRequest) -> Any:
    j = Job(*JOBS[request.param])
    yield j
    out = j.close()
    assert j.proc.returncode == 0, out[-3000:]
    print(f"\nremembered-call property test: {sum(TALLY.values())} steps: {dict(sorted(TALLY.items()))}")


def expected(op: str, st_: dict[str, Any], dtype: np.dtype, n: int, rank: int, nranks: int) -> np.ndarray:
    """What `op` must return on `rank` of `nranks` (every rank's input is `values(n, rank, gen)`)."""
    v = [values(n, r, st_["gen"]).astype(dtype) for r in range(nranks)]
    half = n // nranks
    if op == "all_reduce":
        f = {"sum": np.add, "max": np.maximum, "min": np.minimum}[st_["red"]]
        acc = v[0]
        for w in v[1:]:
            acc = f(acc, w)
        return acc
    if op == "broadcast":
        return v[st_["root"]]
    if op == "all_gather":
        return np.concatenate(v)
    if op == "reduce_scatter":
        return np.sum(v, axis=0, dtype=dtype)[rank * half:(rank + 1) * half]
    if op == "all_to_all":
        return np.concatenate([w[rank * half:(rank + 1) * half] for w in v])
    raise ValueError(op)


class RememberedCalls(RuleBasedStateMachine):
    """Slots of buffers on both ranks, mutated between collectives."""

    job: Job

    def __init__(self) -> None:
        super().__init__()
        self.slots: dict[int, dict[str, Any]] = {}
        self.steps: list[dict[str, Any]] = []
        self.gen = 0

    @property
    def n(self) -> int:
        """The job's ranks."""
        return self.job.nranks

    def run(self, st_: dict[str, Any], what: str) -> list[tuple]:
        TALLY[what] += 1
        self.steps.append(st_)
        return self.job.step(st_)

    def teardown(self) -> None:
        if sys.exc_info()[0] is not None:   # the steps that led to a failure (no shrinking: print them as run)
            print("steps:", *self.steps[-30:], sep="\n  ", file=sys.stderr)

    def ok(self, st_: dict[str, Any], what: str) -> None:
        answers = self.run(st_, what)
        assert all(a[0] == "ok" for a in answers), f"{st_}: {answers}"

    @initialize()
    def fresh_communicator(self) -> None:
        self.ok({"op": "reset"}, "new communicator")

    @rule(slot=SLOTS, kind=KINDS, dtype=DTYPES, n=SIZES)
    def new(self, slot: int, kind: str, dtype: str, n: int) -> None:
        self.ok({"op": "new", "slot": slot, "kind": kind, "dtype": dtype, "n": n}, "new buffer")
        self.slots[slot] = {"kind": kind, "dtype": np.dtype(dtype), "n": n, "writeable": True}

    def _collective(self, op: str, slot: int, repeat: int = 1, **kw: Any) -> None:
        for _ in range(repeat):   # the second call with the same objects is remembered, the third runs remembered
            if not self._one_call(op, slot, **kw):
                return

    def _one_call(self, op: str, slot: int, **kw: Any) -> bool:
        """One collective on both ranks, checked; False if it raised (typed, on every rank)."""
        s = self.slots[slot]
        if kw.get("fresh") is not None:   # a fresh array made like the slot's for this call
            s = {**s, "writeable": kw["fresh"] != "readonly",
                 "dtype": np.dtype(RETYPE[s["dtype"]]) if kw["fresh"] == "retyped" else s["dtype"]}
        self.gen = (self.gen + 1) % 50
        st_ = {"op": op, "slot": slot, "gen": self.gen, **kw}
        answers = self.run(st_, op)
        kinds = {a[0] for a in answers}
        assert "crash" not in kinds, f"{st_} on {s}: {answers}"
        assert len(kinds) == 1, f"ranks disagree on the outcome of {st_} on {s}: {answers}"
        if kinds == {"err"}:
            # a typed error on every rank: the only other allowed outcome; the next steps use a new communicator
            assert all(a[1] in ("InvalidArgument", "InvalidUsage", "Aborted", "Timeout") for a in answers), answers
            TALLY["typed errors"] += 1
            self.ok({"op": "resplit"}, "new communicator")
            return False
        assert s["writeable"] or op == "all_reduce" and kw.get("out") == "overlap" \
            or op != "broadcast" and kw.get("out") in ("kept", "fresh", "overlap"), \
            f"{op} wrote into a read-only buffer: {s}"
        for rank, a in enumerate(answers):
            want = expected(op, st_, s["dtype"], s["n"], rank, self.n)
            got = a[1]
            assert got.dtype == s["dtype"] and np.array_equal(got.reshape(-1), want), \
                f"rank {rank}: {op} {st_} on {s} gave {got[:8]}... want {want[:8]}..."
        return True

    def _call_on(self, data: st.DataObject, slot: int) -> None:
        """After a mutation: call a collective on the mutated slot (remembered calls must notice the change)."""
        if self.slots[slot]["n"] % self.n == 0 and data.draw(st.booleans()):
            op = data.draw(st.sampled_from(["broadcast", "all_gather", "reduce_scatter", "all_to_all"]))
            self._collective(op, slot, repeat=data.draw(st.integers(1, 3)), root=data.draw(st.integers(0, self.n - 1)),
                             out=data.draw(st.sampled_from(["none", "kept"])))
            return
        out = data.draw(st.sampled_from(["none", "self", "fresh"]))
        self._collective("all_reduce", slot, repeat=data.draw(st.integers(1, 3)),
                         red=data.draw(st.sampled_from(["sum", "max", "min"])), out=out, off=1)

    @precondition(lambda self: self.slots)
    @rule(data=st.data(), red=st.sampled_from(["sum", "max", "min"]),
          out=st.sampled_from(["none", "self", "fresh", "overlap"]), off=st.integers(1, 40), repeat=st.integers(1, 3))
    def all_reduce(self, data: st.DataObject, red: str, out: str, off: int, repeat: int) -> None:
        slot = data.draw(st.sampled_from(sorted(self.slots)))
        if out == "overlap" and self.slots[slot]["kind"] != "numpy":
            out = "none"
        self._collective("all_reduce", slot, repeat, red=red, out=out, off=off)

    @precondition(lambda self: self.slots)
    @rule(data=st.data(), op=st.sampled_from(["broadcast", "all_gather", "reduce_scatter", "all_to_all"]),
          repeat=st.integers(1, 3), out=st.sampled_from(["none", "kept"]))
    def other_collective(self, data: st.DataObject, op: str, repeat: int, out: str) -> None:
        slot = data.draw(st.sampled_from(sorted(self.slots)))
        if self.slots[slot]["n"] % self.n:
            op = "broadcast"
        self._collective(op, slot, repeat, root=data.draw(st.integers(0, self.n - 1)), out=out)

    def _slot_of(self, data: st.DataObject, kind: str) -> int | None:
        ok = sorted(k for k, v in self.slots.items() if v["kind"] == kind)
        return data.draw(st.sampled_from(ok)) if ok else None

    @rule(data=st.data(), how=st.sampled_from(["copy", "retyped", "strided", "2d", "readonly", "unaligned"]),
          repeat=st.integers(1, 3))
    def fresh_arrays(self, data: st.DataObject, how: str, repeat: int) -> None:
        """A call on a fresh array of a slot's dtype and shape (its call shape remembered), then calls each on a new
        array made like it in another way, which must not be taken for that shape."""
        slot = self._slot_of(data, "numpy")
        if slot is None:
            return
        TALLY[f"fresh {how}"] += 1
        if self.slots[slot]["n"] % self.n == 0 and data.draw(st.booleans()):
            op = data.draw(st.sampled_from(["broadcast", "all_gather", "reduce_scatter", "all_to_all"]))
            kw = {"root": data.draw(st.integers(0, self.n - 1)), "out": data.draw(st.sampled_from(
                ["none", "kept", "fresh", "overlap"] if op == "all_gather" else ["none", "kept", "fresh"]))}
        else:
            op = "all_reduce"
            kw = {"red": data.draw(st.sampled_from(["sum", "max", "min"])), "off": data.draw(st.integers(1, 40)),
                  "out": data.draw(st.sampled_from(["none", "self", "fresh", "overlap"]))}
        if self._one_call(op, slot, fresh="copy", **kw):
            self._collective(op, slot, repeat, fresh=how, **kw)
        shapes = min(int(a[1][0]) for a in self.job.step({"op": "doors"}))
        TALLY["door call shapes, most"] = max(TALLY["door call shapes, most"], shapes)

    @rule(data=st.data())
    def retype(self, data: st.DataObject) -> None:
        slot = self._slot_of(data, "numpy")
        if slot is not None:
            self.ok({"op": "retype", "slot": slot}, "x.dtype =")
            s = self.slots[slot]
            s["dtype"] = np.dtype(RETYPE[s["dtype"]])
            self._call_on(data, slot)

    @rule(data=st.data(), flag=st.booleans())
    def writeable(self, data: st.DataObject, flag: bool) -> None:
        slot = self._slot_of(data, "numpy")
        if slot is not None:
            self.ok({"op": "writeable", "slot": slot, "flag": flag}, "flags.writeable =")
            self.slots[slot]["writeable"] = flag
            self._call_on(data, slot)

    @rule(data=st.data(), n=SIZES, how=st.sampled_from(["resize", "set_", "data"]), one_rank=st.booleans())
    def restorage(self, data: st.DataObject, n: int, how: str, one_rank: bool) -> None:
        slot = self._slot_of(data, "torch")
        if slot is None:
            return
        if how == "resize" and one_rank:
            # only rank 1 resizes: its next collective on the slot must fail on every rank, never mix sizes
            self.ok({"op": "resize", "slot": slot, "n": n, "rank": 1}, "resize_ on one rank")
            s = self.slots[slot]
            if n != s["n"]:
                self._collective_expecting_error(slot)
            self.ok({"op": "resize", "slot": slot, "n": s["n"], "rank": 1}, "resize_ on one rank")
            return
        self.ok({"op": how, "slot": slot, "n": n}, f"tensor {how}")
        self.slots[slot]["n"] = n
        self._call_on(data, slot)

    def _collective_expecting_error(self, slot: int) -> None:
        self.gen = (self.gen + 1) % 50
        answers = self.run({"op": "all_reduce", "slot": slot, "gen": self.gen, "red": "sum", "out": "none"},
                           "all_reduce with sizes that differ")
        assert all(a[0] == "err" and a[1] == "InvalidArgument" for a in answers), answers
        self.ok({"op": "resplit"}, "new communicator")

    @precondition(lambda self: self.slots)
    @rule(data=st.data())
    def realloc(self, data: st.DataObject) -> None:
        slot = data.draw(st.sampled_from(sorted(self.slots)))
        self.ok({"op": "realloc", "slot": slot}, "drop and reallocate")
        self.slots[slot]["writeable"] = True
        self._call_on(data, slot)

    @rule(data=st.data(), slot=SLOTS, n=SIZES, off=st.integers(0, 63), dtype=DTYPES)
    def view(self, data: st.DataObject, slot: int, n: int, off: int, dtype: str) -> None:
        self.ok({"op": "view", "slot": slot, "n": n, "off": off, "dtype": dtype}, "view at an offset")
        self.slots[slot] = {"kind": "numpy", "dtype": np.dtype(dtype), "n": n, "writeable": True}
        self._call_on(data, slot)

    @rule(data=st.data(), what=st.sampled_from(["tune", "resplit"]))
    def forget(self, data: st.DataObject, what: str) -> None:
        self.ok({"op": what}, "tune_with" if what == "tune" else "new communicator")
        if self.slots:
            self._call_on(data, data.draw(st.sampled_from(sorted(self.slots))))

    @invariant()
    def gen_bounded(self) -> None:
        assert 0 <= self.gen < 50


@pytest.mark.long
def test_remembered_calls_give_the_exact_result_or_a_typed_error_on_every_rank(job: Job) -> None:
    RememberedCalls.job = job
    TALLY.clear()
    run_state_machine_as_test(RememberedCalls, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.reuse, Phase.generate)))   # no shrinking: the ranks' state is not replayable
    calls = sum(TALLY[k] for k in ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all"))
    mutations = sum(TALLY[k] for k in ("x.dtype =", "flags.writeable =", "tensor resize", "tensor set_", "tensor data",
                                       "resize_ on one rank", "drop and reallocate", "view at an offset"))
    # the run exercised enough to mean something
    assert calls >= 6 * EXAMPLES and mutations >= EXAMPLES, TALLY
    assert TALLY["door call shapes, most"] > 0, TALLY   # calls on fresh arrays ran through call shapes in the doors
    if job.env.get("RINGFLOW_CHECK_ROUNDS") == "log":   # every call checked its arguments in log-depth rounds
        assert {int(a[1][0]) for a in job.step({"op": "pattern"})} == {math.ceil(math.log2(job.nranks))}
