"""Calibrated tuning: the runtime picks, among the tuner's candidates, the one the simulator predicts
fastest on a calibrated host (RINGFLOW_TUNER_TOPO, `Communicator.tune_with`)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ringflow.algorithms import registry, tuner
from ringflow.algorithms.schedule import Collective
from ringflow.errors import ConfigError
from ringflow.runtime.communicator import _call_shape, _candidate_schedule, pick_schedule
from ringflow.sim.calibrate import fit
from ringflow.sim.tuning import MIN_PREDICTED_GAIN, HostModel, load_host_model, predict_call_us
from test_sim_calibrate import TRUE, synthetic

BIG = 8 * 2**20


def _host(tr: str = "shm") -> HostModel:
    topo, _ = fit({t: {n: synthetic(t, n) for n in (2, 4)} for t in TRUE}, nprocs=4, cores=2)
    return HostModel(topo, tr)


@pytest.fixture
def slow_steps(monkeypatch):
    """A host where every step of 4 ranks costs 250 us (waking ranks that share cores), which the flat
    tuner's 10 us per step cannot see: pipelined trees lose clearly to a 2-step binomial tree."""
    for tr in TRUE:
        monkeypatch.setitem(TRUE[tr][4], "alpha", 250.0)


def _times(host: HostModel, coll: Collective, nbytes: int, n: int, root: int | None, inplace: bool) -> dict:
    ch = tuner.choose(coll, nbytes, n, dtype_size=4, root=root)
    shape = _call_shape(coll, n, nbytes, 4)
    out = {}
    for c in ch.candidates:
        s = _candidate_schedule(registry, ch, c, coll, n, root)
        out[(c.algorithm, c.nsegs, c.nchannels)] = (predict_call_us(host, s, shape, inplace), s)
    return out


@pytest.mark.parametrize("tr", ["shm", "tcp"])
@pytest.mark.parametrize("coll,root,inplace", [("broadcast", 0, True), ("reduce", 0, True),
                                               ("all_reduce", None, True), ("all_gather", None, False)])
@pytest.mark.parametrize("nbytes", [2**16, 2**20, BIG])
def test_a_calibrated_host_switches_only_to_a_candidate_predicted_clearly_faster(
        tr: str, coll: str, root: int | None, inplace: bool, nbytes: int) -> None:
    """The simulator's fastest candidate replaces the flat tuner's choice where it is predicted at least
    MIN_PREDICTED_GAIN faster than that choice; elsewhere the flat choice stays. Every rank computes
    it alone, so the same call gives the same schedule."""
    host = _host(tr)
    c = Collective.parse(coll)
    shape = _call_shape(c, 4, nbytes, 4)
    times = _times(host, c, nbytes, 4, root, inplace)
    best = min(t for t, _ in times.values())
    flat = pick_schedule(c, nbytes, 4, root, 4, inplace, 0)
    got = pick_schedule(c, nbytes, 4, root, 4, inplace, 0, host)
    t_flat, t_got = predict_call_us(host, flat, shape, inplace), predict_call_us(host, got, shape, inplace)
    if t_flat >= MIN_PREDICTED_GAIN * best:
        assert t_got == pytest.approx(best, rel=1e-9)
    else:
        assert got is flat
    again = pick_schedule(c, nbytes, 4, root, 4, inplace, 0, host)
    assert (again.algorithm, again.nchannels, again.params) == (got.algorithm, got.nchannels, got.params)


@pytest.mark.parametrize("tr,nbytes", [("shm", 2**22), ("shm", BIG), ("tcp", BIG)])
def test_a_host_with_slow_steps_gets_a_binomial_broadcast_where_the_flat_tuner_pipelines(
        slow_steps, tr: str, nbytes: int) -> None:
    host = _host(tr)
    flat = pick_schedule(Collective.BROADCAST, nbytes, 4, 0, 4, True, 0)
    got = pick_schedule(Collective.BROADCAST, nbytes, 4, 0, 4, True, 0, host)
    assert (flat.algorithm, got.algorithm) == ("tree", "binomial")


def test_a_topology_without_a_calibration_is_refused_with_the_fix(tmp_path) -> None:
    from ringflow.topology import load_topology
    path = tmp_path / "plain.yaml"
    load_topology("dgx-h100").save(str(path))
    with pytest.raises(ConfigError, match="ringflow calibrate"):
        load_host_model(str(path), "shm")
    with pytest.raises(ConfigError, match="unknown host transport"):
        load_host_model(str(path), "nvlink")


def test_the_runtime_runs_the_calibrated_choice_on_every_rank(slow_steps, tmp_path) -> None:
    """Real ranks with RINGFLOW_TUNER_TOPO: the bench reports the algorithm the calibrated host predicts
    fastest (every rank chose it, or the argument check would have failed) and the data are right; at
    4 MiB that is a binomial broadcast where the flat tuner runs a pipelined tree."""
    from ringflow.runtime import bench
    path = tmp_path / "host.yaml"
    _host("shm").topo.save(str(path))
    loaded = load_host_model(str(path), "shm")
    rows = bench.launch("broadcast", 4, 0, 0, sizes=[2**16, 2**22], iters=3, warmup=1, check=True,
                        extra_env={"RINGFLOW_TUNER_TOPO": str(path)}, timeout_s=120)
    assert [r["size_bytes"] for r in rows] == [2**16, 2**22]
    for r in rows:
        want = pick_schedule(Collective.BROADCAST, r["size_bytes"], 4, 0, 4, True, 256 * 2**10, loaded)
        assert r["algorithm"] == want.algorithm and r["wrong"] == 0
    flat = pick_schedule(Collective.BROADCAST, 2**22, 4, 0, 4, True, 256 * 2**10)
    assert (flat.algorithm, rows[1]["algorithm"]) == ("tree", "binomial")


def test_a_host_model_covers_only_jobs_its_calibration_has_curves_and_endpoints_for() -> None:
    """`HostModel.supports` (what RINGFLOW_TUNER_TOPO and `Communicator.tune_with` check): curves of the
    transport and at least as many endpoints as ranks."""
    import copy
    host = _host("shm")
    assert host.supports(4) and not host.supports(5)
    bare = copy.copy(host.topo)
    bare.meta = {**host.topo.meta, "sim": {k: v for k, v in host.topo.meta["sim"].items() if k != "host_curves"}}
    assert not HostModel(bare, "shm").supports(2)


def test_tuned_validation_predicts_the_choices_the_job_made(slow_steps) -> None:
    """`predict_rows(..., tuned=True)` asks the runtime's choice on the calibrated host, so a row that ran
    the calibrated choice (binomial) is predicted, while the flat tuner's view (tree) refuses it."""
    from ringflow.errors import InvalidUsage
    from ringflow.sim.validate import predict_rows
    host = _host("shm")
    row = {"collective": "broadcast", "nranks": 4, "size_bytes": 2**22, "count": 2**20, "dtype": "float32",
           "time_us": 1000.0, "algorithm": "binomial"}
    got = predict_rows(host.topo, [row], "shm", tuned=True)
    assert got[0]["algorithm"] == "binomial" and got[0]["predicted_us"] > 0
    with pytest.raises(InvalidUsage, match="runtime's choice here is tree"):
        predict_rows(host.topo, [row], "shm")


def test_a_bench_job_tunes_on_its_own_calibration_as_validation_predicts_it() -> None:
    """`ringflow validate --tuned` without a file: the job calibrates, every rank takes rank 0's curves and
    tunes with them; the validation refits the recorded calibration and must reach the same choices
    (it raises InvalidUsage on any row that ran another algorithm)."""
    from ringflow.runtime import bench
    from ringflow.sim.validate import compare_jobs
    got = bench.launch("broadcast,reduce,all_reduce", 2, 0, 0, sizes=[2**16, 2**22], calibrate="quick", tune_ranks=2,
                       iters=3, warmup=1, check=True, timeout_s=120)
    cal = [r["calibration"] for r in got if "calibration" in r]
    rows = [r for r in got if "calibration" not in r]
    assert len(cal) == 1 and len(rows) == 6 and all(r["wrong"] == 0 for r in rows)
    out, _ = compare_jobs([{"transport": "shm", "nranks": 2, "calibration": cal[0], "rows": rows, "tuned": True}],
                          None, 2, 0.15)
    assert sorted((r["collective"], r["size_bytes"], r["algorithm"]) for r in out) == \
        sorted((r["collective"], r["size_bytes"], r["algorithm"]) for r in rows)


@pytest.mark.parametrize("passes", [1, 5])
def test_a_validation_job_times_its_rows_between_its_calibration_s_sweeps(passes: int) -> None:
    """`ringflow validate`'s jobs (`bench.launch(calibrate=..., passes=...)`): the bench's passes run after
    each of the calibration's sweeps (BATCHES of them), any left over after it; every row gets all its
    passes' samples and is checked; with one pass the rows are timed after the calibration, as before."""
    from ringflow.runtime import bench
    from ringflow.sim._calib_worker import BATCHES
    got = bench.launch("all_reduce,scatter", 2, 0, 0, sizes=[2**16, 2**20], calibrate="quick", iters=3 * passes,
                       passes=passes, warmup=1, check=True, timeout_s=120)
    cal = [r["calibration"] for r in got if "calibration" in r]
    rows = [r for r in got if "calibration" not in r]
    assert len(cal) == 1 and cal[0].get("interleaved_sweeps", 0) == (BATCHES if passes > 1 else 0)
    assert len(rows) == 4 and all(r["wrong"] == 0 and r["iters"] == 3 * passes for r in rows)
    # every pass's median and every sweep's batch are kept apart, on record
    assert all(len(r["pass_us"]) == passes and min(r["pass_us"]) <= r["time_us"] <= max(r["pass_us"])
               for r in rows)
    sweeps = cal[0]["sweeps"]
    assert sweeps["oneway"].keys() == cal[0]["results"]["oneway"].keys()
    assert all(len(v) == BATCHES and np.median(v) == pytest.approx(cal[0]["results"]["oneway"][s])
               for s, v in sweeps["oneway"].items())


def test_the_tuned_vs_flat_benchmark_writes_both_tuners_rows_side_by_side(tmp_path) -> None:
    """`benchmarks/tuned_vs_flat.py` end to end on 2 shm ranks (quick calibration, one job per tuner):
    one row per collective and size, each with both tuners' algorithm, time and bandwidths, and the
    speed-up their times give."""
    import subprocess
    import sys
    from pathlib import Path
    out = tmp_path / "tvf.json"
    script = Path(__file__).parents[1] / "benchmarks" / "tuned_vs_flat.py"
    subprocess.run([sys.executable, str(script), "--ranks", "2", "--transports", "shm", "--collectives",
                    "broadcast,all_reduce", "--min", "64KiB", "--max", "128KiB", "--repeats", "1", "--quick",
                    "--json", str(out)], check=True, timeout=180, capture_output=True)
    rows = json.loads(out.read_text())
    assert sorted((r["collective"], r["size_bytes"]) for r in rows) == \
        sorted((c, s) for c in ("all_reduce", "broadcast") for s in (2**16, 2**17))
    for r in rows:
        for tuner_row in (r["flat"], r["tuned"]):
            assert tuner_row["algorithm"] and tuner_row["time_us"] > 0 and tuner_row["busbw_GBps"] > 0
        assert r["speedup"] == pytest.approx(r["flat"]["time_us"] / r["tuned"]["time_us"])


def test_algo_choose_shows_what_calibrated_tuning_runs_and_why(slow_steps, tmp_path, capsys) -> None:
    """`ringflow algo choose ... --calibrated FILE`: the flat choice, every candidate priced on the host,
    and the calibrated choice (the cheapest, as it beats the flat one by MIN_PREDICTED_GAIN); a file
    without enough endpoints is a typed error (exit 2)."""
    from ringflow.cli import main
    path = tmp_path / "host.yaml"
    _host("shm").topo.save(str(path))

    def run(args: list[str]) -> tuple[int, str]:
        with pytest.raises(SystemExit) as ei:
            main(args)
        return int(ei.value.code or 0), capsys.readouterr().out
    code, out = run(["algo", "choose", "broadcast", "--size", "4MiB", "-n", "4", "--calibrated", str(path), "--json"])
    got = json.loads(out)
    assert code == 0 and got["flat"]["algorithm"] == "tree" and got["chosen"]["algorithm"] == "binomial"
    best = min(r["calibrated_us"] for r in got["candidates"])
    chosen = [r for r in got["candidates"] if r["calibrated_choice"]]
    assert [r["calibrated_us"] for r in chosen] == [best] and got["flat_calibrated_us"] >= MIN_PREDICTED_GAIN * best
    assert sum(r["flat_choice"] for r in got["candidates"]) == 1
    code, _ = run(["algo", "choose", "broadcast", "--size", "4MiB", "-n", "8", "--calibrated", str(path)])
    assert code == 2


def test_sim_sweeps_sizes_with_the_calibrated_tuner_beside_the_flat_one(slow_steps, tmp_path, capsys) -> None:
    """`ringflow sim COLL --topo FILE --tuner calibrated`: per size the schedule the runtime would run with
    RINGFLOW_TUNER_TOPO=FILE (`pick_schedule` with the host) and the flat tuner's, each priced on the host
    as `predict_call_us` prices it, rows with bench keys; options that do not apply are a typed error."""
    from ringflow.cli import main
    from ringflow.sim.results import busbw_factor
    path = tmp_path / "host.yaml"
    host = _host("shm")
    host.topo.save(str(path))
    out_json = tmp_path / "sweep.json"
    plot = tmp_path / "sweep.png"

    def run(args: list[str]) -> int:
        with pytest.raises(SystemExit) as ei:
            main(args)
        return int(ei.value.code or 0)
    args = ["sim", "broadcast", "--topo", str(path), "--tuner", "calibrated", "-n", "4", "--min", "64KiB",
            "--max", "16MiB", "--factor", "4", "--json", str(out_json)]
    assert run(args + (["--plot", str(plot)] if _has_matplotlib() else [])) == 0
    rows = json.loads(out_json.read_text())
    assert [r["size_bytes"] for r in rows] == [2**16, 2**18, 2**20, 2**22, 2**24]
    assert any(r["changed"] for r in rows)
    for r in rows:
        assert {"size_bytes", "count", "dtype", "time_us", "algbw_GBps", "busbw_GBps", "algorithm"} <= set(r)
        c, nb = Collective.BROADCAST, r["size_bytes"]
        shape = _call_shape(c, 4, nb, 4)
        got = pick_schedule(c, nb, 4, 0, 4, True, 0, host)
        flat = pick_schedule(c, nb, 4, 0, 4, True, 0)
        assert (r["algorithm"], r["flat_algorithm"]) == (got.algorithm, flat.algorithm)
        assert r["time_us"] == pytest.approx(predict_call_us(host, got, shape, True), rel=1e-4)
        assert r["flat_time_us"] == pytest.approx(predict_call_us(host, flat, shape, True), rel=1e-4)
        assert r["gain"] >= (MIN_PREDICTED_GAIN if r["changed"] else 1.0) - 1e-9
        assert r["busbw_GBps"] == pytest.approx(nb / r["time_us"] / 1e3 * busbw_factor(c, 4), rel=1e-3)
    assert "changes the choice at" in capsys.readouterr().out
    if _has_matplotlib():
        assert plot.stat().st_size > 0
    assert run(["sim", "broadcast", "--topo", str(path), "--tuner", "calibrated", "--algo", "ring"]) == 2
    assert run(["sim", "broadcast", "--topo", str(path), "--tuner", "best"]) == 2


def _has_matplotlib() -> bool:
    import importlib.util
    return importlib.util.find_spec("matplotlib") is not None


def test_communicators_on_one_host_file_price_each_call_shape_once(tmp_path, monkeypatch) -> None:
    """Every communicator of a job loads RINGFLOW_TUNER_TOPO (split groups too): while the file is unchanged
    they get one host model, whose decisions are priced once per call shape (10-50 ms each); a rewritten
    file is loaded and priced anew."""
    import os
    import ringflow.sim.tuning as tuning
    from ringflow.runtime.communicator import calibrated_decision
    path = tmp_path / "host.yaml"
    _host("shm").topo.save(str(path))
    a, b = load_host_model(str(path), "shm"), load_host_model(str(path), "shm")
    assert a is b and load_host_model(str(path), "tcp") is not a
    priced = []
    real = tuning.decide
    monkeypatch.setattr(tuning, "decide", lambda *args: priced.append(args[3]) or real(*args))
    first = calibrated_decision(Collective.BROADCAST, BIG, 4, 0, 4, True, 256 * 2**10, a)
    again = calibrated_decision(Collective.BROADCAST, BIG, 4, 0, 4, True, 256 * 2**10, b)
    other = calibrated_decision(Collective.BROADCAST, BIG, 4, 1, 4, True, 256 * 2**10, b)
    assert again is first and other is not first and len(priced) == 2
    assert pick_schedule(Collective.BROADCAST, BIG, 4, 0, 4, True, 256 * 2**10, a) is first.chosen
    assert len(priced) == 2
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    c = load_host_model(str(path), "shm")
    assert c is not a and not c.decisions
