"""The host model's wake-up term: its fit recovers a known cost, a same-host replay adds it exactly to the
operations whose ranks arrived further apart than a waiter spins, and a model file without it prices as before."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from ringflow.hostmodel import CacheSizes, HostCostModel, HostParams
from ringflow.hostmodel.wakeup import WakeupCost, _spin_windows, fit
from ringflow.workload.recorded import TRACE_FORMAT
from ringflow.workload.replay_host import HostDurations, communication_time

BASE_US = 9.0          # the synchronous call
EARLY_A, EARLY_B = 40.0, 15.0
LATE_US = 20.0


def _rows(delays_us: list[float], reps: int = 4) -> list[dict]:
    """Wake-up job rows with hand-made times: the late rank starts at t, ends BASE_US + LATE_US after it; the
    early one EARLY_A + EARLY_B ln(delay / 1 ms) later than the synchronous call (delay 0: both BASE_US)."""
    rows = []
    t = 10**9
    for d in delays_us:
        for i in range(reps):
            late = i % 2
            start = [t, t]
            start[1 - late] = t - int(d * 1e3)
            end = [t + int(BASE_US * 1e3)] * 2
            if d > 0:
                end[late] += int(LATE_US * 1e3)
                end[1 - late] += int((EARLY_A + EARLY_B * math.log(d / 1000.0)) * 1e3)
            rows.append({"delay_us": d, "late": late, "start_ns": start, "end_ns": end})
            t += 10**8
    return rows


def test_the_fit_recovers_a_known_wake_up() -> None:
    spin_us = _spin_windows()[0]
    rows = _rows([0.0, 2000.0, 5000.0, 10000.0, 20000.0])   # every delay beyond the runtime's spin windows
    # a trial inside the spin window never slept: it must not enter the fit
    rows += [{**r, "end_ns": [e + 10**6 for e in r["end_ns"]], "delay_us": spin_us / 2} for r in _rows([1.0])]
    w = fit(rows)
    assert w.early_a_us == pytest.approx(EARLY_A, abs=0.01)
    assert w.early_b_us == pytest.approx(EARLY_B, abs=0.01)
    assert w.late_a_us == pytest.approx(LATE_US, abs=0.01)
    assert w.late_b_us == 0.0          # a constant predicts the late rank: no log term
    assert (w.min_wait_us, w.max_wait_us) == (2000.0, 20000.0)
    assert w.early_us(2e-3) == pytest.approx(EARLY_A + EARLY_B * math.log(2.0), abs=0.01)
    assert w.early_us(1.0) == pytest.approx(w.early_us(20e-3))    # clamped to the measured range


WAKE = WakeupCost(early_a_us=60.0, early_b_us=10.0, late_a_us=20.0, late_b_us=0.0, min_wait_us=100.0,
                  max_wait_us=20000.0, spin_us=50.0, bulk_spin_us=1000.0, ll_threshold_bytes=16384)
PRICE_US = 100.0


class Stub:
    """A cost model that charges PRICE_US per call, with an optional wake-up cost."""

    def __init__(self, wakeup: WakeupCost | None) -> None:
        self.wakeup = wakeup

    def supports(self, nranks: int) -> bool:
        return True

    def predict_us(self, schedule, shape, inplace: bool) -> float:
        return PRICE_US


# (nbytes, spread us): small calls spin 50 us, bulk ones (>= 16 KiB) 1 ms
OPS = [(8, 30.0), (8, 2000.0), (8, 51.0), (65536, 500.0), (65536, 3000.0)]


def _trace() -> dict:
    calls = []
    for seq, (nbytes, spread_us) in enumerate(OPS):
        t = (seq + 1) * 10**8
        for r, start in ((0, t - int(spread_us * 1e3)), (1, t)):
            calls.append({"rank": r, "comm": "w", "lane": "coll", "seq": seq, "op": "all_reduce", "dtype": "float32",
                          "count": nbytes // 4, "nbytes": nbytes, "root": None, "async": False, "status": "ok",
                          "site": "x.py:1", "enq_ns": start, "start_ns": start, "end_ns": t + 10**5})
    return {"format": TRACE_FORMAT, "clock": "barrier", "world": "w", "world_size": 2, "groups": {"w": [0, 1]},
            "ranks": {"0": {}, "1": {}}, "calls": calls, "flight": {}}


def _by_seq(dur: HostDurations, trace: dict) -> list[float]:
    ops: dict = {}
    for c in trace["calls"]:
        ops.setdefault(("coll", c["comm"], c["seq"]), []).append(c)
    return [dur(k, cs) * 1e6 for k, cs in sorted(ops.items(), key=lambda kv: kv[0][2])]


def test_the_replay_adds_the_wake_up_exactly_beyond_the_spin_window() -> None:
    trace = _trace()
    got = _by_seq(HostDurations(Stub(WAKE), trace), trace)
    for (nbytes, spread_us), us in zip(OPS, got, strict=True):
        window_us = 50.0 if nbytes < 16384 else 1000.0
        # 2 members: the median is the mean of the early rank's cost at its wait and the last rank's
        want = PRICE_US + ((60.0 + 10.0 * math.log(max(spread_us, 100.0) / 1000.0) + 20.0) / 2
                           if spread_us > window_us else 0.0)
        assert us == pytest.approx(want, rel=1e-9), (nbytes, spread_us)
    assert got[1] > got[0] == PRICE_US and got[4] > got[3] == PRICE_US
    assert communication_time(trace, HostDurations(Stub(None), trace)) == pytest.approx(len(OPS) * PRICE_US / 1e6)


def test_a_model_file_without_the_wake_up_prices_as_before(tmp_path: Path) -> None:
    params = HostParams(call_us=7.0, msg_us=1.0, copy_us_per_MiB=60.0)
    plain = HostCostModel("shm", params, 2, (2,), CacheSizes(2**20, 2**25))
    d = plain.to_dict()
    assert "wakeup" not in d
    loaded = HostCostModel.from_dict("shm", d)
    assert loaded.wakeup is None
    trace = _trace()
    before = _by_seq(HostDurations(loaded, trace), trace)
    assert len(set(before[:3])) == 1 and before[0] > 0      # the 8-byte calls: one price whatever their spread
    path = str(tmp_path / "hm.json")
    HostCostModel("shm", params, 2, (2,), CacheSizes(2**20, 2**25), wakeup=WAKE).save(path)
    with_wake = HostCostModel.load(path, "shm")
    assert with_wake.wakeup == WAKE
    after = _by_seq(HostDurations(with_wake, trace), trace)
    assert after[0] == before[0] and after[1] > before[1]
