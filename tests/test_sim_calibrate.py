"""Calibration round trip: fitted numbers -> topology file -> loaded -> the same numbers and times back."""
from __future__ import annotations

import pytest

from ringflow.sim._calib_worker import _schedules
from ringflow.sim.api import simulate_schedule
from ringflow.sim.calibrate import fit
from ringflow.sim.params import params_for
from ringflow.topology import Topology

TRUE = {"shm": dict(alpha=20.0, base=100.0, per_peer=30.0, oneway=3.0, endpoint=4.0, reduce=5.0, copy=6.0),
        "tcp": dict(alpha=45.0, base=160.0, per_peer=55.0, oneway=1.5, endpoint=2.5, reduce=5.0, copy=6.0)}
SIZES = [2**16, 2**18, 2**20, 2**22, 2**24]
CACHE = 32 * 2**20     # 2 x 16 MiB x 2 ranks does not fit: the 16 MiB points come from DRAM
DRAM = 2.0


def synthetic(tr: str, n: int) -> dict:
    p = TRUE[tr]
    call = p["base"] + p["per_peer"] * (n - 1)
    per_dir = p["endpoint"] / 2

    def line(rate: float, extra: float = 0.0) -> dict:
        slow = lambda b: DRAM if 2 * b * n > CACHE else 1.0  # noqa: E731
        return {str(b): call + p["alpha"] + slow(b) * (b / (rate * 1e3) + b * extra) for b in SIZES}
    return {"nranks": n, "results": {
        "steps1": {"4": call + p["alpha"]}, "steps8": {"4": call + 8 * p["alpha"]},
        "copy": {str(b): call + b / (p["copy"] * 1e3) * (DRAM if 2 * b * n > CACHE else 1.0) for b in SIZES},
        "oneway": line(p["oneway"]), "exchange": line(per_dir),
        "exchange_reduce": line(per_dir, 1.0 / (p["reduce"] * 1e3))}}


def test_fit_recovers_parameters_and_round_trips_through_a_file(tmp_path) -> None:
    measured = {tr: {n: synthetic(tr, n) for n in (2, 4)} for tr in TRUE}
    topo, report = fit(measured, nprocs=4, cores=2, cache_bytes=CACHE)
    for tr, p in TRUE.items():
        assert report[f"{tr}.dram_factor"]["value"] == pytest.approx(DRAM)
        assert report[f"{tr}.alpha_us"]["value"] == pytest.approx(p["alpha"])
        assert report[f"{tr}.oneway_GBps"]["value"] == pytest.approx(p["oneway"])
        assert report[f"{tr}.endpoint_GBps"]["value"] == pytest.approx(p["endpoint"])
        assert report[f"{tr}.reduce_GBps"]["value"] == pytest.approx(p["reduce"])
        assert report[f"{tr}.per_peer_us"]["value"] == pytest.approx(p["per_peer"])
        assert report[f"{tr}.copy_GBps"]["value"] == pytest.approx(p["copy"])
    path = str(tmp_path / "host.yaml")
    topo.save(path)
    loaded = Topology.load(path)
    prm = params_for(loaded)
    assert prm.endpoint_GBps == pytest.approx({"shm": 4.0, "tcp": 2.5})
    assert prm.reduce_GBps == pytest.approx(5.0)
    assert prm.host_cores == 2
    assert prm.copy_GBps == pytest.approx(6.0)
    # the loaded topology predicts the measured times of the calibration schedules back
    sched = _schedules(2)
    for tr in TRUE:
        meas = synthetic(tr, 2)["results"]
        for name in ("copy", "oneway", "exchange", "exchange_reduce"):
            for b in (2**18, 2**22, 2**24):
                res = simulate_schedule(loaded, sched[name], b, params={"host_transport": tr})
                assert res.time_us == pytest.approx(meas[name][str(b)], rel=1e-6), (tr, name, b)
                flow = simulate_schedule(loaded, sched[name], b, engine="flow", params={"host_transport": tr})
                assert flow.time_us == pytest.approx(res.time_us, rel=1e-9)


def test_validate_predicts_every_bench_collective(tmp_path) -> None:
    from ringflow.runtime.bench import COLLECTIVES
    from ringflow.sim.validate import predict_rows, runtime_schedule
    measured = {tr: {n: synthetic(tr, n) for n in (2, 4)} for tr in TRUE}
    topo, _ = fit(measured, nprocs=4, cores=2, cache_bytes=CACHE)
    rows = []
    for coll in COLLECTIVES:
        for n in (2, 4):
            size = 2**20
            rows.append({"collective": coll, "nranks": n, "size_bytes": size, "count": size // 4,
                         "dtype": "float32", "time_us": 1000.0})
    for tr in TRUE:
        out = predict_rows(topo, rows, tr)
        assert len(out) == len(rows)
        for r in out:
            assert r["predicted_us"] > 0 and r["algorithm"]
    # the schedule is the runtime's: same tuner choice, same registry build
    s = runtime_schedule("all_gather", 2**18 // 4, 4, 4, None)
    assert s.nranks == 4 and s.collective.value == "all_gather"
