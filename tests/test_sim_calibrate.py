"""Calibration round trip: synthetic calibration times -> fitted curves -> topology file -> loaded ->
the calibration schedules' times back; and the validation path predicts every bench collective."""
from __future__ import annotations

import numpy as np
import pytest

from ringflow.algorithms.layout import CallShape
from ringflow.algorithms.schedule import Collective, is_self_checking
from ringflow.sim._calib_worker import SIZES, _schedules, exchange_outliers
from ringflow.sim.api import simulate_schedule, simulate_table
from ringflow.sim.calibrate import SPIKE_TOL, curves, despike, fit, monotone
from ringflow.sim.transfers import from_plans
from ringflow.sim.params import params_for
from ringflow.sim.residuals import calibration_residuals, summarize
from ringflow.topology import Topology

A2A = 2.5   # an all-to-all step of b bytes per rank on 4 ranks costs that many one-ways of b
FAN = {"fanin": 0.5, "fanout": 0.6}   # one rank receiving (sending) b/4 from (to) each of 3 peers: one-ways of b
SOLO = 1.25   # on 4 ranks a lone one-way (the other ranks idle) is that much faster than one on every pair
SINGLE = 2**20   # the runtime's single-copy threshold: from here the sender does no work
CHAINED = 0.5   # 4 ranks sharing 2 cores: a slot-copied exchange step right after another, over the first
FRESH_SINGLE = 2**22   # ... for a source the sender wrote earlier in the call
FRESH = 1 / 8e3   # us per byte such a source costs extra on 1 MiB .. 4 MiB messages (shm)
BESIDE = 1 / 3e3   # us per byte a local copy costs extra beside a receive in the same step (above 10 % of the exchange)
# per transport and rank count: per-step latency, call overhead, CHECK exchange (us), and the cost
# per byte (us) of a lone one-way transfer, of a reduction and of a local copy; `exch`: an exchange
# with every rank busy costs that many one-ways (below the single-copy size both ends copy: 2 on
# 2 ranks; above it only receivers, sharing the memory bus: 1.5; 4 ranks share 2 cores: 3; 2 ranks
# over TCP: 2.5, both directions at once cost more than two one-ways, as loopback TCP on a 2-core VM)
TRUE = {"shm": {2: dict(alpha=8.0, base=20.0, check=25.0, oneway=1 / 6e3, exch=(2.0, 1.5), red=1 / 9e3, copy=1 / 12e3,
                        check_rooted=32.0),
                4: dict(alpha=25.0, base=60.0, check=120.0, oneway=1 / 5e3, exch=(3.0, 3.0), red=1 / 4e3, copy=1 / 6e3,
                        check_rooted=110.0)},
        "tcp": {2: dict(alpha=12.0, base=25.0, check=60.0, oneway=1 / 3e3, exch=(2.5, 2.5), red=1 / 9e3, copy=1 / 12e3,
                        check_rooted=60.0),
                4: dict(alpha=30.0, base=50.0, check=300.0, oneway=1 / 2.5e3, exch=(3.0, 3.0), red=1 / 4e3, copy=1 / 6e3,
                        check_rooted=220.0)}}


def synthetic(tr: str, n: int) -> dict:
    """What `_calib_worker.measure` would report on a host that follows the model exactly."""
    p = TRUE[tr][n]
    t1 = p["base"] + p["alpha"]
    # above the single-copy size a one-way costs the receiver alone and an exchange the same per rank
    ow = {str(b): t1 + b * p["oneway"] for b in SIZES}
    single = tr == "shm"
    ex = {str(b): t1 + b * p["oneway"] * p["exch"][int(single and b >= SINGLE)] for b in SIZES}
    res = {"steps1_checked": {"4": t1 + p["check"]}, "steps1": {"4": t1}, "steps8": {"4": t1 + 7 * p["alpha"]},
           "oneway": ow, "exchange": ex,
           "exchange_reduce": {str(b): ex[str(b)] + b * p["red"] for b in SIZES},
           # one rank reducing alone runs faster than every rank at once (they share the memory bus)
           "oneway_reduce": {str(b): ow[str(b)] + b * p["red"] / 1.6 for b in SIZES},
           # into its own operand (in-place all-reduce and reduce) faster still: one buffer fewer
           "oneway_reduce_inplace": {str(b): ow[str(b)] + b * p["red"] / 2.5 for b in SIZES},
           "copy": {str(b): p["base"] + b * p["copy"] for b in SIZES}}
    if n > 2:
        res["oneway_solo"] = {str(b): t1 + b * p["oneway"] / SOLO for b in SIZES}
        # every rank sends 1/n of b to each peer: n - 1 messages per rank, each paying its own costs
        res["alltoall"] = {str(b): t1 + b * p["oneway"] * A2A for b in SIZES}
        for name, k in FAN.items():
            res[name] = {str(b): t1 + b * p["oneway"] * k for b in SIZES}
        # three exchanges in a row: each after the first moves its data CHAINED times as long
        res["exchange3"] = {str(b): ex[str(b)] + 2 * (p["alpha"] + (ex[str(b)] - t1) * CHAINED) for b in SIZES}
    if tr == "shm":   # sending bytes just written: a copy into scratch, then the exchange, plus the extra
        res["exchange_fresh"] = {str(b): ex[str(b)] + b * p["copy"] + b * FRESH for b in SIZES}
    # the exchange and a copy of as many bytes in one step: both, plus the copy's extra beside a transfer
    # where every rank has a core (the round trips fit 2 cores; more ranks: not modelled, so not here)
    res["exchange_copy"] = {str(b): ex[str(b)] + b * p["copy"] + b * BESIDE * (n <= 2) for b in SIZES}
    # the check before a rooted step (on 4 ranks cheaper, on 2 shm ranks dearer than before a 1-step call)
    res["check_rooted"] = {str(2**16): p["check_rooted"]}
    out = {"nranks": n, "results": res}
    if tr == "shm":
        out["single_copy_min_bytes"] = SINGLE
        out["single_copy_fresh_min_bytes"] = FRESH_SINGLE
    return out


def test_monotone_is_the_least_squares_non_decreasing_fit() -> None:
    assert monotone([1, 3, 2, 4]).tolist() == [1, 2.5, 2.5, 4]
    assert monotone([5, 4, 3]).tolist() == [4, 4, 4]
    v = np.random.default_rng(0).random(30)
    assert np.all(np.diff(monotone(list(v))) >= -1e-12)


def test_an_exchange_slower_than_the_exchange_with_a_reduction_is_cleaned_to_it() -> None:
    """A slow mode of the plain exchange (seen on 2 TCP ranks) cannot make it dearer than the same
    exchange with a reduction on top."""
    m = synthetic("tcp", 2)
    for b in (2**19, 2**20):    # the slow mode spans sizes (512 KiB-1 MiB), so it is no lone spike
        m["results"]["exchange"][str(b)] = 3 * m["results"]["exchange_reduce"][str(b)]
    c = curves(m)
    i = c["sizes"].index(2**19)
    assert c["exchange_us"][i] == pytest.approx(m["results"]["exchange_reduce"][str(2**19)])
    assert np.all(np.diff(c["exchange_us"]) >= 0)


def test_an_exchange_slower_than_the_exchange_beside_a_copy_less_the_copy_is_cleaned_to_it() -> None:
    """The first 2-rank TCP job of a validation run measures the plain exchange 2-3x slow from 512 KiB on;
    the exchange with a copy after it in its step (minus the copy's own work) bounds it where the
    exchange with a reduction, itself slow or dear, does not."""
    m = synthetic("tcp", 2)
    r = m["results"]
    stretch = [str(b) for b in (2**19, 2**20, 2**21, 2**22)]
    true = {b: r["exchange"][b] for b in stretch}
    for b in stretch:
        r["exchange"][b] *= 2.2
        r["exchange_reduce"][b] = 2.0 * true[b]
    c = curves(m)
    for b in stretch:
        got = c["exchange_us"][c["sizes"].index(int(b))]
        assert true[b] - 1e-6 <= got <= true[b] + int(b) * BESIDE + 1e-6, (b, got, true[b])


@pytest.mark.parametrize("tr,n", [("tcp", 2), ("shm", 2), ("shm", 4), ("tcp", 4)])
def test_the_calibration_times_again_exactly_the_sizes_whose_exchange_its_copy_bound_contradicts(tr: str, n: int) -> None:
    m = synthetic(tr, n)
    assert exchange_outliers(m["results"], SIZES) == []
    stretch = [2**19, 2**20, 2**21, 2**22]
    for b in stretch:
        m["results"]["exchange"][str(b)] *= 3.0
    assert exchange_outliers(m["results"], SIZES) == stretch


def test_a_latency_bound_one_way_does_not_slow_the_exchange_below_its_measured_rate() -> None:
    """One job in three, loopback TCP one-ways at 128-512 KiB take nearly as long as the exchange: the
    rank's engine is at least as fast as the exchange showed, so the exchange is predicted as measured."""
    m = synthetic("tcp", 2)
    r = m["results"]
    r["oneway"] = {k: 0.9 * v for k, v in r["exchange"].items()}
    topo, _ = fit({"tcp": {2: m}}, nprocs=2)
    b = 2**19
    got = simulate_schedule(topo, _schedules(2)["exchange"], b, params={"host_transport": "tcp"},
                            endpoints=topo.endpoints()[:2])
    assert got.time_us == pytest.approx(r["exchange"][str(b)], rel=0.02)


def test_fit_round_trips_through_a_file_and_predicts_the_calibration_back(tmp_path) -> None:
    measured = {tr: {n: synthetic(tr, n) for n in (2, 4)} for tr in TRUE}
    topo, report = fit(measured, nprocs=4, cores=2)
    for tr in TRUE:
        for n, p in TRUE[tr].items():
            assert report[f"{tr}.{n}ranks.alpha_us"]["value"] == pytest.approx(p["alpha"])
            assert report[f"{tr}.{n}ranks.base_us"]["value"] == pytest.approx(p["base"])
            assert report[f"{tr}.{n}ranks.check_us"]["value"] == pytest.approx(p["check"])
            assert report[f"{tr}.{n}ranks.check_rooted_us"]["value"] == pytest.approx(p["check_rooted"])
            assert report[f"{tr}.{n}ranks.16MiB.copy_GBps"]["value"] == pytest.approx(1e-3 / p["copy"])
            assert report[f"{tr}.{n}ranks.16MiB.reduce_GBps"]["value"] == pytest.approx(1.6e-3 / p["red"])  # alone
            assert report[f"{tr}.{n}ranks.16MiB.reduce_inplace_GBps"]["value"] == pytest.approx(2.5e-3 / p["red"])
    path = str(tmp_path / "host.yaml")
    topo.save(path)
    loaded = Topology.load(path)
    assert params_for(loaded).host_curves == topo.meta["sim"]["host_curves"]
    for tr in TRUE:
        for n, names in ((2, ("oneway", "exchange", "exchange_reduce", "oneway_reduce", "copy", "exchange_copy")),
                         (4, ("exchange", "exchange_reduce", "copy", "exchange_copy", "oneway_solo", "alltoall",
                              "fanin", "fanout"))):
            sched = _schedules(n)
            meas = synthetic(tr, n)["results"]
            check = TRUE[tr][n]["check"]
            for name in names:
                for b in (2**16, 2**20, 2**24):
                    want = meas[name][str(b)] + (0.0 if is_self_checking(sched[name]) else check)
                    res = simulate_schedule(loaded, sched[name], b, params={"host_transport": tr},
                                            endpoints=loaded.endpoints()[:n])
                    assert res.time_us == pytest.approx(want, rel=1e-6), (tr, n, name, b)
                    flow = simulate_schedule(loaded, sched[name], b, engine="flow", params={"host_transport": tr},
                                             endpoints=loaded.endpoints()[:n])
                    assert flow.time_us == pytest.approx(res.time_us, rel=1e-6), (tr, n, name, b)
        # the runtime's plan of the one-way reduction called in place: its reduction is priced in place
        for b in (2**16, 2**20, 2**24):
            s2 = _schedules(2)["oneway_reduce"]
            tab = from_plans(s2, CallShape(Collective.ALL_REDUCE, 2, b // 4, 4), inplace=True)
            assert tab.lreduce_inplace is not None and tab.lreduce_inplace.sum() == tab.lreduce.sum() > 0
            want = synthetic(tr, 2)["results"]["oneway_reduce_inplace"][str(b)] + TRUE[tr][2]["check"]
            for engine in ("analytic", "flow"):
                res = simulate_table(loaded, tab, b, dtype="float32", engine=engine, params={"host_transport": tr},
                                     endpoints=loaded.endpoints()[:2], checked=not is_self_checking(s2))
                assert res.time_us == pytest.approx(want, rel=1e-6), (tr, engine, b)


def test_the_fitted_model_predicts_the_calibration_s_own_steps_back_and_shows_a_delayed_sample() -> None:
    """On a host that follows the model, every step the fit reads is predicted back exactly; one sample the
    scheduler delayed (2 TCP ranks' exchange at 1 MiB timed 2x) is cleaned out of the fit, so it shows as
    the residual (predicted about half of what was timed) and as that step's worst size."""
    measured = {tr: {n: synthetic(tr, n) for n in (2, 4)} for tr in TRUE}
    delayed = str(2**20)
    measured["tcp"][2]["results"]["exchange"][delayed] *= 2.0
    topo, _ = fit(measured, nprocs=4, cores=2)
    rows = calibration_residuals(topo, measured)
    err = {(r["transport"], r["nranks"], r["step"], r["size_bytes"]): r["error"] for r in rows}
    exact = {2: ("oneway", "exchange", "exchange_reduce", "oneway_reduce", "copy", "exchange_copy"),
             4: ("exchange", "exchange_reduce", "copy", "exchange_copy", "oneway_solo", "alltoall", "fanin", "fanout")}
    for tr in TRUE:
        for n, steps in exact.items():
            for step in steps:
                for b in (2**16, 2**24):
                    assert err[(tr, n, step, b)] == pytest.approx(0.0, abs=1e-6), (tr, n, step, b)
    assert -0.55 < err[("tcp", 2, "exchange", 2**20)] < -0.4
    assert err[("shm", 2, "exchange", 2**20)] == pytest.approx(0.0, abs=1e-6)
    worst = {(s["transport"], s["nranks"], s["step"]): s for s in summarize(rows)}[("tcp", 2, "exchange")]
    assert worst["worst_size_bytes"] == 2**20 and worst["worst_error"] < -0.4


def test_curves_clean_noise_that_inverts_sizes() -> None:
    raw = synthetic("shm", 2)
    bumped = dict(raw["results"]["exchange"])
    bumped[str(2**18)] *= 3.0      # one noisy point must not make smaller sizes look slower later
    c = curves({**raw, "results": {**raw["results"], "exchange": bumped}})
    assert np.all(np.diff(c["exchange_us"]) >= 0)
    assert np.all(np.asarray(c["exchange_reduce_us"]) >= np.asarray(c["exchange_us"]))


def test_one_delayed_calibration_sample_is_put_back_on_its_neighbours_line_but_a_regime_step_stays() -> None:
    """4 shm ranks on 2 cores measured an exchange with reduction of 2 MiB at 1.6x the line through 1 and
    4 MiB once: that sample goes; a rise that the next size keeps (a cache edge) is physics and stays."""
    sizes = [2**18, 2**19, 2**20, 2**21, 2**22]
    line = [100.0, 200.0, 400.0, 800.0, 1600.0]
    spiked = list(line)
    spiked[3] *= 1.6
    assert despike(spiked, sizes) == pytest.approx(line)
    step = [100.0, 200.0, 400.0, 1200.0, 2400.0]
    assert despike(step, sizes) == pytest.approx(step)
    dip = [100.0, 200.0, 190.0, 800.0, 1600.0]     # dips are left to `monotone`
    assert despike(dip, sizes) == pytest.approx(dip)
    just = list(line)
    just[2] *= float(np.exp(SPIKE_TOL)) * 0.99
    assert despike(just, sizes) == pytest.approx(just)
    raw = synthetic("shm", 4)
    res = raw["results"]
    b = str(2**21)
    c = curves({**raw, "results": {**res, "exchange_reduce": {**res["exchange_reduce"], b: res["exchange_reduce"][b] * 1.6}}})
    i = c["sizes"].index(2**21)
    assert c["exchange_reduce_us"][i] == pytest.approx(curves(raw)["exchange_reduce_us"][i], rel=0.05)


def test_validate_predicts_every_bench_collective() -> None:
    from ringflow.runtime.bench import COLLECTIVES
    from ringflow.sim.validate import predict_rows, runtime_schedule
    measured = {tr: {n: synthetic(tr, n) for n in (2, 4)} for tr in TRUE}
    topo, _ = fit(measured, nprocs=4, cores=2)
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
    s = runtime_schedule("all_gather", 2**20, 4, 4, None)
    assert s.nranks == 4 and s.collective.value == "all_gather"


@pytest.mark.parametrize("coll,algo,n", [("all_gather", "bruck", 4), ("all_reduce", "halving_doubling", 4),
                                         ("broadcast", "binomial", 2), ("all_to_all", "pairwise", 3),
                                         ("reduce_scatter", "ring", 4)])
def test_runtime_plans_give_the_schedules_table_and_know_in_place(coll: str, algo: str, n: int) -> None:
    """Out of place the runtime's compiled plans move what the schedule says; in place the root of a
    broadcast copies nothing onto itself (the runtime skips that copy, so the simulator must too)."""
    from ringflow.algorithms import registry
    from ringflow.algorithms.layout import CallShape
    from ringflow.algorithms.schedule import Collective
    from ringflow.sim.transfers import from_plans, from_schedule
    c = Collective.parse(coll)
    s = registry.get_schedule(c, algo, n, root=0 if c.has_root else None)
    ref, got = from_schedule(s), from_plans(s, CallShape(c, n, 1 << 16, 4), inplace=False)
    assert np.allclose(np.sort(ref.frac), np.sort(got.frac))
    assert ref.lcopy.sum() == pytest.approx(got.lcopy.sum()) and ref.lreduce.sum() == pytest.approx(got.lreduce.sum())
    if coll == "broadcast":
        assert ref.lcopy.sum() > 0 and from_plans(s, CallShape(c, n, 1 << 16, 4), inplace=True).lcopy.sum() == 0


def test_a_rank_sending_to_every_peer_is_limited_by_the_host_cores_not_a_shared_hop() -> None:
    """Direct scatter on a calibrated host, single-copy sizes: the three receivers copy at once, so
    the step costs what the host's cores allow (the pool, measured by the calibration's fan-out step
    since the root sends to several peers at once), not three one-ways in a row over the root's
    shared-memory hop."""
    from ringflow.sim.validate import runtime_schedule
    topo, _ = fit({"shm": {n: synthetic("shm", n) for n in (2, 4)}}, nprocs=4, cores=2)
    p = TRUE["shm"][4]
    m = 4 * SINGLE   # bytes each receiver gets
    sched = runtime_schedule("scatter", 4 * m, 4, 4, 0)
    assert sched.algorithm == "direct"
    tab = from_plans(sched, CallShape(Collective.SCATTER, 4, m // 4, 4), inplace=False)
    res = simulate_table(topo, tab, 4 * m, params={"host_transport": "shm"}, endpoints=topo.endpoints()[:4],
                         checked=not is_self_checking(sched))
    # three messages through the host's pool, whose rate the calibration's fan-out step gave (the
    # root sends to three peers in the step): 3 messages of m in FAN["fanout"] one-ways of 4 m
    pool_us = 3 * m * (4 * m * p["oneway"] * FAN["fanout"]) / (3 * m)
    # then the root copies its own chunk, alone: its peers finished reading theirs, so it has a core where
    # the calibration's copy, every rank at once, had half of one (`SimParams.shared_cores`)
    own_us = m * p["copy"] * 2 / 4
    want = p["base"] + p["alpha"] + p["check_rooted"] + max(pool_us, m * p["oneway"]) + own_us
    # rel: the copy curve is read between two calibrated sizes (log-log), not exactly on the line
    assert res.time_us == pytest.approx(want, rel=1e-3)
    assert want < p["base"] + p["alpha"] + p["check_rooted"] + 3 * m * p["oneway"] + own_us   # a shared hop


def test_three_ranks_copying_on_two_cores_take_the_packing_of_their_copies_not_the_fluid_share() -> None:
    """A double-tree step on 4 shm ranks sharing 2 cores (single-copy sizes): ranks 1, 2 and 3 each
    copy two messages of m. A rank's copies run on one core, so the busier core moves four messages
    (longest-processing-time packing), not the fluid three; one core moves a message in 2 x 1/12 of
    the calibration's all-to-all step (12 messages on 2 cores). A pair exchange, every rank with one
    message, packs evenly and keeps the fluid share."""
    from ringflow.algorithms.schedule import Buffer, BufferLayout, ChunkRef, ScheduleBuilder
    topo, _ = fit({"shm": {n: synthetic("shm", n) for n in (2, 4)}}, nprocs=4, cores=2)
    p = TRUE["shm"][4]
    m = 4 * SINGLE
    lay = {Buffer.IN: BufferLayout(2), Buffer.OUT: BufferLayout(2)}

    def one_step(name: str, transfers: list[tuple[int, int, int]]):  # noqa: ANN202
        b = ScheduleBuilder("all_reduce", 4, name, layouts=lay)
        for src, dst, k in transfers:
            b.transfer(0, src, dst, ChunkRef(Buffer.IN, k), ChunkRef(Buffer.OUT, k))
        return b.build()
    tree = one_step("tree-step", [(0, 1, 0), (0, 2, 0), (1, 3, 0), (1, 3, 1), (2, 1, 1), (3, 2, 1)])
    t_a2a = 4 * m * p["oneway"] * A2A          # the calibration's all-to-all step of m-byte messages
    per_core_msg = 2 * t_a2a / 12
    got = simulate_schedule(topo, tree, 2 * m, params={"host_transport": "shm"}, endpoints=topo.endpoints()[:4])
    # the CHECK first; rank 1's two messages to rank 3 pay the per-message cost twice
    assert got.time_us == pytest.approx(p["base"] + p["check"] + 2 * p["alpha"] + 4 * per_core_msg, rel=1e-3)
    assert 4 * per_core_msg > max(3 * per_core_msg, 2 * m * p["oneway"])   # fluid, or the pair 1 -> 3
    pairs = one_step("pairs", [(0, 1, 0), (1, 0, 0), (2, 3, 0), (3, 2, 0)])
    ex = simulate_schedule(topo, pairs, 2 * m, params={"host_transport": "shm"}, endpoints=topo.endpoints()[:4])
    assert ex.time_us == pytest.approx(p["base"] + p["check"] + p["alpha"] + m * p["oneway"] * p["exch"][1], rel=1e-3)


def test_a_transfer_step_right_after_another_costs_what_the_three_step_exchange_showed() -> None:
    """4 shm ranks on 2 cores: the calibration's three exchanges in a row cost the first plus CHAINED
    times its data for each next one, so a 3-step exchange schedule is priced so; with a local copy
    between the steps (the ranks stop to copy) every step is a first one; with single copies a ring
    of shifts is not discounted (each send completes when the next rank has read it: none runs ahead)."""
    from ringflow.algorithms.schedule import Buffer, BufferLayout, ChunkRef, ScheduleBuilder
    topo, _ = fit({"shm": {n: synthetic("shm", n) for n in (2, 4)}}, nprocs=4, cores=2)
    p = TRUE["shm"][4]
    lay = {Buffer.IN: BufferLayout(1), Buffer.OUT: BufferLayout(1)}

    def exchanges(copy_between: bool, shift: bool = False):  # noqa: ANN202
        b = ScheduleBuilder("all_reduce", 4, "ex3" + "c" * copy_between + "s" * shift, layouts=lay)
        gap = 2 if copy_between else 1
        pairs = [(r, (r + 1) % 4) for r in range(4)] if shift else [(0, 1), (1, 0), (2, 3), (3, 2)]
        for s in range(3):
            for src, dst in pairs:
                b.transfer(gap * s, src, dst, ChunkRef(Buffer.IN, 0), ChunkRef(Buffer.OUT, 0))
            if copy_between and s < 2:
                for r in range(4):
                    b.copy(r, gap * s + 1, ChunkRef(Buffer.IN, 0), ChunkRef(Buffer.OUT, 0))
        return b.build()

    def data_us(m: int) -> float:
        return m * p["oneway"] * p["exch"][int(m >= SINGLE)]

    def run(sched, m: int) -> float:  # noqa: ANN001
        return simulate_schedule(topo, sched, m, params={"host_transport": "shm"}, endpoints=topo.endpoints()[:4]).time_us

    m = SINGLE // 4
    fixed = p["base"] + p["check"] + 3 * p["alpha"]
    assert run(exchanges(False), m) == pytest.approx(fixed + data_us(m) * (1 + 2 * CHAINED), rel=1e-3)
    copies = 2 * m * p["copy"]
    assert run(exchanges(True), m) == pytest.approx(fixed + 3 * data_us(m) + copies, rel=2e-3)
    big = 2 * SINGLE
    assert run(exchanges(False), big) == pytest.approx(fixed + data_us(big) * (1 + 2 * CHAINED), rel=1e-3)
    ring = run(exchanges(False, shift=True), big)
    assert ring == pytest.approx(run(exchanges(True, shift=True), big) - 2 * big * p["copy"], rel=2e-3)


def test_replay_predicts_a_recorded_validation_again_from_its_own_calibrations(tmp_path) -> None:
    """`ringflow validate --record` then `--replay`: each job's rows are predicted from that job's
    calibration; a job that measured twice the model's time shows -50 %, and the row's spread."""
    import json

    from ringflow.errors import InvalidArgument
    from ringflow.sim.validate import predict_rows, replay
    cal = synthetic("shm", 2)
    topo, _ = fit({"shm": {2: cal}}, nprocs=2)
    bench_rows = [{"collective": c, "nranks": 2, "size_bytes": 2**20, "count": 2**18, "dtype": "float32",
                   "time_us": 1.0} for c in ("all_reduce", "all_gather")]
    model = {r["collective"]: r["predicted_us"] for r in predict_rows(topo, bench_rows, "shm")}
    jobs = [{"transport": "shm", "nranks": 2, "calibration": cal,
             "rows": [{**r, "time_us": model[r["collective"]] * k} for r in bench_rows]} for k in (1.0, 2.0, 2.0)]
    import gzip
    path, packed = tmp_path / "record.json", tmp_path / "record.json.gz"
    record = json.dumps({"version": 1, "max_ranks": 2, "jobs": jobs})
    path.write_text(record)
    packed.write_bytes(gzip.compress(record.encode()))
    for p in (path, packed):   # a record compressed with gzip (.gz) replays the same
        rows, ok = replay(str(p))
        assert not ok and len(rows) == 2
        for r in rows:
            assert r["predicted_us"] == pytest.approx(model[r["collective"]])
            assert r["error"] == pytest.approx(-0.5) and r["jobs"] == 3 and r["spread"] == pytest.approx(1.0)
    path.write_text("{}")
    packed.write_bytes(b"not gzip")
    for p in (path, packed):
        with pytest.raises(InvalidArgument, match="not a validation record"):
            replay(str(p))


def test_the_records_script_counts_the_model_and_the_leave_one_out_oracle_per_recording(tmp_path) -> None:
    """benchmarks/validation_records.py over four recordings of one job each, measured at 1, 1, 1.3 and 1
    times the model: the model and the oracle (each row the median of the other recordings' measurements)
    put both rows of the three alike recordings within 15 % and none of the odd one; the bias lists both
    rows at a mean error of -0.3 / 1.3 / 4."""
    import json

    from validation_records import main

    from ringflow.sim.validate import predict_rows
    cal = synthetic("shm", 2)
    topo, _ = fit({"shm": {2: cal}}, nprocs=2)
    bench_rows = [{"collective": c, "nranks": 2, "size_bytes": 2**20, "count": 2**18, "dtype": "float32",
                   "time_us": 1.0} for c in ("all_reduce", "all_gather")]
    model = {r["collective"]: r["predicted_us"] for r in predict_rows(topo, bench_rows, "shm")}
    paths = []
    for i, k in enumerate((1.0, 1.0, 1.3, 1.0)):
        job = {"transport": "shm", "nranks": 2, "calibration": cal,
               "rows": [{**r, "time_us": model[r["collective"]] * k} for r in bench_rows]}
        paths.append(tmp_path / f"rec{i}.json")
        paths[-1].write_text(json.dumps({"version": 1, "max_ranks": 2, "jobs": [job]}))
    out = tmp_path / "figures.json"
    assert main([*map(str, paths), "--jobs", "1", "--bias", "0.05", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert [r["model"] for r in got["recordings"]] == [2, 2, 0, 2]
    assert [r["oracle"] for r in got["recordings"]] == [2, 2, 0, 2]
    assert got["total"] == 6 and {r["recording"] for r in got["outside"]} == {"rec2.json"}
    assert [b["collective"] for b in got["bias"]] == ["all_gather", "all_reduce"]
    for b in got["bias"]:
        assert b["mean_error"] == pytest.approx((1 / 1.3 - 1) / 4) and b["outside"] == 1 and b["recordings"] == 4
    assert main([*map(str, paths), "--jobs", "1", "--bias", "0.1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["bias"] == []


def test_the_records_script_reads_sweeps_and_passes_with_another_statistic_and_pools_calibrations(tmp_path) -> None:
    """`--summary` re-reads a job's calibration points from their sweeps and its rows from their passes (a
    retimed point keeps its faster retime); `--calibration pooled` gives every job of a configuration the
    per-point median of their calibrations. Jobs that saw a burst in three of five sweeps and passes: read
    by the fastest sweep and pass they agree with the model; pooled, jobs 1x, 3x and 2x slow all get the 2x
    points, and the script replays the recording either way."""
    import copy
    import json

    from validation_records import main, pooled, resummarised

    from ringflow.sim.validate import predict_rows
    cal = synthetic("shm", 2)
    topo, _ = fit({"shm": {2: cal}}, nprocs=2)
    bench_rows = [{"collective": "all_gather", "nranks": 2, "size_bytes": 2**20, "count": 2**18,
                   "dtype": "float32", "time_us": 1.0}]
    model = predict_rows(topo, bench_rows, "shm")[0]["predicted_us"]
    sizes = [str(s) for s in SIZES]
    ex = cal["results"]["exchange"]

    def job(burst: float) -> dict:
        # the smallest size was timed again after the sweeps and came out at half the sweeps' fastest
        full = copy.deepcopy(cal)
        full["results"].update({"exchange": {s: ex[s] * (0.5 if s == sizes[0] else burst) for s in sizes},
                                "exchange_retimed": {sizes[0]: ex[sizes[0]] * burst}})
        full["sweeps"] = {"exchange": {s: [ex[s]] * 2 + [ex[s] * burst] * 3 for s in sizes}}
        return {"transport": "shm", "nranks": 2, "calibration": full,
                "rows": [{**bench_rows[0], "time_us": model * burst, "pass_us": [model] * 2 + [model * burst] * 3}]}
    slow = job(2.0)
    fast = resummarised(slow, "min")
    assert fast["rows"][0]["time_us"] == pytest.approx(model)
    assert fast["calibration"]["results"]["exchange"][sizes[1]] == pytest.approx(ex[sizes[1]])
    # the retimed point keeps the faster of the two: its retime, below the sweeps' fastest
    assert fast["calibration"]["results"]["exchange"][sizes[0]] == pytest.approx(0.5 * ex[sizes[0]])
    assert slow["rows"][0]["time_us"] == pytest.approx(2 * model)   # the copy, not the recording, changed
    q = resummarised(slow, "median")["calibration"]["results"]["exchange"][sizes[2]]
    assert q == pytest.approx(2 * ex[sizes[2]])
    both = pooled([job(1.0), job(3.0), job(2.0)])
    for j in both:
        assert j["calibration"]["results"]["exchange"][sizes[3]] == pytest.approx(2 * ex[sizes[3]])
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"version": 1, "max_ranks": 2, "jobs": [job(1.0), slow]}))
    out = tmp_path / "figures.json"
    assert main([str(path), "--jobs", "1", "--summary", "min", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["recordings"][0]["model"] == 1 and got["outside"] == []
    assert main([str(path), "--jobs", "1", "--calibration", "pooled", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["recordings"][0]["rows"] == 1


def test_disagreeing_fraction_counts_the_sizes_the_jobs_measured_more_than_the_tolerance_apart() -> None:
    from ringflow.sim.validate import disagreeing_fraction

    def job(*times: float) -> dict:
        return {"rows": [{"collective": "all_reduce", "size_bytes": 2**k, "time_us": t} for k, t in enumerate(times)]}
    assert disagreeing_fraction([job(100, 100, 100, 100)], 0.15) == 0.0   # one job: nothing to disagree with
    assert disagreeing_fraction([job(100, 100, 100, 100), job(110, 120, 90, 200)], 0.15) == 0.5
    assert disagreeing_fraction([job(100, 100, 100, 100), job(110, 120, 90, 200)], 1.5) == 0.0


@pytest.mark.parametrize("tolerance,jobs", [(10.0, 2), (-1.0, 3)])
def test_validate_runs_more_real_bench_jobs_while_they_disagree(tmp_path, tolerance: float, jobs: int) -> None:
    """Real 2-rank bench jobs: a configuration whose jobs disagree beyond the tolerance on more than a
    fifth of its sizes gets another job, up to max_repeats (a negative tolerance: they always disagree)."""
    import json

    from ringflow.sim.validate import compared_jobs, validate
    topo, _ = fit({"shm": {2: synthetic("shm", 2)}}, nprocs=2)
    record = tmp_path / "rec.json"
    rows, _ = validate(topo, ranks=[2], collectives=["all_reduce"], min_size="64KiB", max_size="64KiB", quick=True,
                       transports=("shm",), repeats=2, max_repeats=3, tolerance=tolerance, record=str(record))
    # (a job run beside a straggling process of an earlier test would be set aside and run again)
    assert len(compared_jobs(json.loads(record.read_text())["jobs"])) == jobs
    assert [r["jobs"] for r in rows] == [jobs]


def test_validate_sets_aside_and_reruns_jobs_that_ran_beside_other_work(tmp_path, busy_loops) -> None:
    """Real 2-rank bench jobs beside real busy-looping processes: the host-load meter flags every job, so
    the first BUSY_RERUNS are set aside (kept in the recording, left out of the rows) and run again, and the
    last counts as a busy job; a replay of the recording compares the same single job."""
    import json
    import os

    from ringflow.cli.sim_cmds import noise_summary
    from ringflow.sim.validate import BUSY_RERUNS, replay, validate
    topo, _ = fit({"shm": {2: synthetic("shm", 2)}}, nprocs=2)
    record = tmp_path / "rec.json"
    busy_loops(max(1, (os.cpu_count() or 1) // 2))
    rows, _ = validate(topo, ranks=[2], collectives=["all_reduce"], min_size="64KiB", max_size="64KiB",
                       quick=True, transports=("shm",), repeats=1, max_repeats=1, record=str(record))
    jobs = json.loads(record.read_text())["jobs"]
    assert [bool(j.get("set_aside")) for j in jobs] == [True] * BUSY_RERUNS + [False]
    assert [(r["jobs"], r["busy_jobs"], r["set_aside_jobs"]) for r in rows] == [(1, 1, BUSY_RERUNS)]
    again, _ = replay(str(record), topo)
    assert [(r["jobs"], r["measured_us"]) for r in again] == [(1, rows[0]["measured_us"])]
    assert f"set aside and run again because other processes' work ran beside them: shm2 {BUSY_RERUNS}" \
        in noise_summary(rows, 0.15)


def test_repeated_calibration_jobs_merge_by_the_median_so_one_outlier_job_does_not_decide() -> None:
    """`calibrate(repeats=3)`: the third job saw every exchange 60 % slower (a neighbour's load); the
    merged curves, and the rates fitted from them, are the two steady jobs'."""
    from ringflow.sim.calibrate import median_of
    steady = synthetic("tcp", 2)
    slow = synthetic("tcp", 2)
    slow["results"]["exchange"] = {b: v * 1.6 for b, v in slow["results"]["exchange"].items()}
    merged = median_of([steady, slow, synthetic("tcp", 2)])
    assert merged["results"] == steady["results"] and merged["nranks"] == 2
    want = params_for(fit({"tcp": {2: steady}}, nprocs=2)[0], {"host_transport": "tcp"}).for_call(2**20, 2, 2**20)
    got = params_for(fit({"tcp": {2: merged}}, nprocs=2)[0], {"host_transport": "tcp"}).for_call(2**20, 2, 2**20)
    alone = params_for(fit({"tcp": {2: slow}}, nprocs=2)[0], {"host_transport": "tcp"}).for_call(2**20, 2, 2**20)
    assert got.host_pool_GBps == want.host_pool_GBps != alone.host_pool_GBps
    assert got.lone_pool_speedup == want.lone_pool_speedup != alone.lone_pool_speedup


def test_a_noisy_reduction_point_does_not_blow_up_the_reduction_rate() -> None:
    """One size where one-way-with-reduction measured no slower than the one-way (noise) used to make a
    lone reduction look free and so every rank reducing at once hundreds of times slower than it."""
    raw = synthetic("tcp", 4)
    res = raw["results"]
    b = str(2**17)
    bumped = {**res, "oneway_reduce": {**res["oneway_reduce"], b: res["oneway"][b] * 0.9}}
    c = curves({**raw, "results": bumped})
    c["link_GBps"] = c["peak_oneway_GBps"]
    base = params_for(fit({"tcp": {4: synthetic("tcp", 4)}}, nprocs=4, cores=2)[0], {"host_transport": "tcp"})
    clean = base.for_call(2**17, 4, 2**17)
    noisy = base._from_curves(c, 2**17, 2**17)
    assert 1.0 <= noisy.reduce_busy_slowdown <= c["busy_ranks"]
    # the rate comes from the neighbouring sizes too: within 2x of the clean one, not 1000x
    assert clean.reduce_GBps / 2 <= noisy.reduce_GBps <= clean.reduce_GBps * 2


@pytest.mark.parametrize("tr", ["shm", "tcp"])
def test_an_in_place_reduction_with_a_core_per_rank_runs_at_the_rate_measured_at_the_call_s_size(
        tr: str) -> None:
    """From 1 MiB the in-place reduction runs 3x slower (its operand left a cache level). With a core per
    rank a call of 1 MiB messages reduces at the rate measured at 1 MiB and one of 512 KiB at the rate
    below, not at a slope the next size dominates; where ranks share cores the pair's point is noise, so
    the neighbourhood's slope stays, and a 512 KiB call borrows most of 1 MiB's rate."""
    raw = synthetic(tr, 2)
    res = raw["results"]
    red = TRUE[tr][2]["red"] / 2.5
    res["oneway_reduce_inplace"] = {b: res["oneway"][b] + int(b) * red * (3.0 if int(b) >= 2**20 else 1.0)
                                    for b in res["oneway"]}
    base = params_for(fit({tr: {2: raw}}, nprocs=2)[0], {"host_transport": tr})
    us_per_byte = {m: 1e-3 / base.for_call(m, 2, m).reduce_inplace_GBps for m in (2**19, 2**20)}
    assert us_per_byte == pytest.approx({2**19: red, 2**20: 3 * red}, rel=1e-6)
    # 4 ranks sharing 2 cores: the pair's point is noise there, so the neighbourhood's slope is used
    raw4 = synthetic(tr, 4)
    res4 = raw4["results"]
    red4 = TRUE[tr][4]["red"] / 2.5
    res4["oneway_reduce_inplace"] = {b: res4["oneway"][b] + int(b) * red4 * (3.0 if int(b) >= 2**20 else 1.0)
                                     for b in res4["oneway"]}
    shared = params_for(fit({tr: {4: raw4}}, nprocs=4, cores=2)[0], {"host_transport": tr})
    assert 2 * red4 < 1e-3 / shared.for_call(2**19, 4, 2**19).reduce_inplace_GBps < 3 * red4


@pytest.mark.parametrize("coll,algo,want", [("all_reduce", "sharded_ps", 3), ("gather", "direct", 3),
                                             ("all_reduce", "ring", 1), ("broadcast", "binomial", 1)])
def test_peers_per_step_counts_a_rank_s_distinct_peers_in_one_step(coll: str, algo: str, want: int) -> None:
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.transfers import from_schedule
    sched = get_schedule(coll, algo, 4, root=0 if Collective.parse(coll).has_root else None)
    assert from_schedule(sched).peers_per_step() == want


@pytest.mark.parametrize("coll,algo,want", [("gather", "direct", "in"), ("scatter", "direct", "out"),
                                             ("all_reduce", "sharded_ps", "all"), ("broadcast", "binomial", "all")])
def test_step_pattern_tells_fan_in_and_fan_out_from_all_to_all(coll: str, algo: str, want: str) -> None:
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.transfers import from_schedule
    sched = get_schedule(coll, algo, 4, root=0 if Collective.parse(coll).has_root else None)
    assert from_schedule(sched).step_pattern() == want


def test_a_direct_gather_is_priced_from_the_fan_in_step_not_the_all_to_all() -> None:
    """A root receiving from 3 peers at once: the calibration's fan-in step, not the all-to-all's rate."""
    from ringflow.algorithms.registry import get_schedule
    topo, _ = fit({"tcp": {4: synthetic("tcp", 4)}}, nprocs=4, cores=2)
    p, t1 = TRUE["tcp"][4], TRUE["tcp"][4]["base"] + TRUE["tcp"][4]["alpha"]
    for coll, name in (("gather", "fanin"), ("scatter", "fanout")):
        sched = get_schedule(coll, "direct", 4, root=0)
        b = 2**22      # bench size: the whole gathered buffer, b / 4 per rank
        got = simulate_schedule(topo, sched, b, params={"host_transport": "tcp"}, endpoints=topo.endpoints()[:4])
        own_us = b / 4 * p["copy"]   # and the root copies its own block
        want = t1 + b * p["oneway"] * FAN[name] + p["check_rooted"] + own_us
        assert got.time_us == pytest.approx(want, rel=1e-3), coll


def test_rooted_collectives_pay_the_check_measured_before_a_rooted_step() -> None:
    """Broadcast, reduce, gather, scatter: the CHECK exchange's cost measured before the fan-out step
    (its own figure); the others: the one measured before a 1-step call."""
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.transfers import from_schedule
    topo, _ = fit({"tcp": {4: synthetic("tcp", 4)}}, nprocs=4, cores=2)
    p = TRUE["tcp"][4]
    for coll, algo, check in (("broadcast", "binomial", p["check_rooted"]), ("reduce", "binomial", p["check_rooted"]),
                              ("all_gather", "ring", p["check"])):
        sched = get_schedule(coll, algo, 4, root=0 if Collective.parse(coll).has_root else None)
        assert not is_self_checking(sched)
        tab = from_schedule(sched)
        t = [simulate_table(topo, tab, 2**20, params={"host_transport": "tcp"}, endpoints=topo.endpoints()[:4],
                            checked=c).time_us for c in (True, False)]
        assert t[0] - t[1] == pytest.approx(check, rel=1e-6), coll


@pytest.mark.parametrize("coll,algo,size,per_size", [("scatter", "direct", 2**20, True),
                                                     ("scatter", "direct", 2**19, True),
                                                     ("scatter", "direct", 2**26, True),
                                                     ("gather", "direct", 2**20, False),
                                                     ("broadcast", "binomial", 2**20, False)])
def test_a_direct_scatter_pays_the_rooted_check_measured_at_its_own_messages(
        coll: str, algo: str, size: int, per_size: bool) -> None:
    """A calibration that timed the check before the fan-out step at several sizes: a direct scatter (the
    fan-out step itself) pays the figure where the fan-out's messages are its own, held at the measured
    ends; between them the fan-out step *with* its check is interpolated (log-log) and the check is what
    it adds to the fan-out at the call's size; other rooted collectives pay the figure at the smallest."""
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.transfers import from_schedule
    sizes, checks = [2**16, 2**18, 2**20, 2**22], [460.0, 420.0, 340.0, 320.0]
    m = synthetic("tcp", 4)
    m["results"]["check_rooted"] = {str(b): v for b, v in zip(sizes, checks)}
    topo, _ = fit({"tcp": {4: m}}, nprocs=4, cores=2)
    tab = from_schedule(get_schedule(coll, algo, 4, root=0))
    t = [simulate_table(topo, tab, size, params={"host_transport": "tcp"}, endpoints=topo.endpoints()[:4],
                        checked=c).time_us for c in (True, False)]
    c = curves(m)

    def fanout(b: float) -> float:
        return float(np.exp(np.interp(np.log(b), np.log(c["sizes"]), np.log(c["fanout_us"]))))
    want = checks[0]
    if per_size:
        want = checks[-1] if size >= sizes[-1] else checks[sizes.index(size)] if size in sizes else \
            float(np.exp(np.interp(np.log(size), np.log(sizes), np.log([k + fanout(b) for k, b in zip(checks, sizes)])))) \
            - fanout(size)
        assert size in sizes or size >= sizes[-1] or want != pytest.approx(np.interp(np.log(size), np.log(sizes), checks))
    assert t[0] - t[1] == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("tr,coll,size,cores,asleep", [("tcp", "gather", 2**21, 2, True),
                                                        ("tcp", "reduce", 2**21, 2, True),
                                                        ("tcp", "gather", 2**16, 2, False),
                                                        ("tcp", "broadcast", 2**21, 2, False),
                                                        ("tcp", "scatter", 2**21, 2, False),
                                                        ("tcp", "gather", 2**21, 1, False),
                                                        ("shm", "gather", 2**21, 2, False)])
def test_a_checked_call_whose_root_works_on_after_its_peer_is_done_pays_a_wake_up(
        tr: str, coll: str, size: int, cores: int, asleep: bool) -> None:
    """2 ranks over TCP, each with a core: a binomial gather's root copies its own block (a reduce's
    reduces) after the peer's message, so the peer waits for the next call's check past the runtime's
    spin and sleeps: where that work exceeds `asleep_lag_us` the check costs once more; not a broadcast
    (no work after the message), not a scatter (its peer, done first while the root copies its own block,
    only receives: it wakes while the next call's message is on the way; 2 TCP ranks timed a 2 MiB scatter
    the same with a 500 us spin), not small calls, not ranks sharing a core (they never spin), not shm."""
    from ringflow.algorithms.registry import get_schedule
    topo, _ = fit({tr: {2: synthetic(tr, 2)}}, nprocs=2, cores=cores)
    c = Collective.parse(coll)
    count = size // 4 // (2 if c.per_rank_sized else 1)
    tab = from_plans(get_schedule(coll, "binomial", 2, root=0), CallShape(c, 2, count, 4),
                     inplace=not c.per_rank_sized)   # as `ringflow bench` calls them
    t = [simulate_table(topo, tab, size, params={"host_transport": tr}, endpoints=topo.endpoints()[:2],
                        checked=c).time_us for c in (True, False)]
    p = TRUE[tr][2]
    assert t[0] - t[1] == pytest.approx(p["check_rooted"] + (p["check"] if asleep else 0.0), rel=1e-6)


def test_a_transfer_alone_on_its_host_moves_at_the_lone_one_way_rate() -> None:
    """Binomial broadcast on 4 ranks: step 0 (0 -> 2, the others idle) at the calibrated lone one-way
    rate, step 1 (0 -> 1 and 2 -> 3 at once) at the every-pair one-way rate; the flow engine agrees."""
    from ringflow.algorithms.registry import get_schedule
    topo, _ = fit({"shm": {4: synthetic("shm", 4)}}, nprocs=4, cores=2)
    p = TRUE["shm"][4]
    b = 2**18   # below the single-copy size: both ends copy
    # in place, as `ringflow bench` calls it: the root copies nothing, so every step is transfers only
    tab = from_plans(get_schedule("broadcast", "binomial", 4, root=0),
                     CallShape(Collective.BROADCAST, 4, b // 4, 4), inplace=True)
    got = {e: simulate_table(topo, tab, b, engine=e, params={"host_transport": "shm"},
                             endpoints=topo.endpoints()[:4], timeline=True) for e in ("analytic", "flow")}
    assert got["flow"].time_us == pytest.approx(got["analytic"].time_us, rel=1e-6)
    spans = {}
    for step, src, dst, _, t0, t1 in got["flow"].timeline:
        spans.setdefault(step, []).append(t1 - t0)
    assert spans[0] == pytest.approx([p["alpha"] + b * p["oneway"] / SOLO], rel=1e-6)
    # step 1 is the calibration's one-way step (pairs 0-1 and 2-3 at once): priced as that step is, its
    # data CHAINED times as long right after step 0 (slot-copied messages, `chained_step_factor`)
    pairs = simulate_schedule(topo, _schedules(4)["oneway"], b, params={"host_transport": "shm"},
                              endpoints=topo.endpoints()[:4], timeline=True).timeline
    assert spans[1] == pytest.approx([p["alpha"] + CHAINED * (t1 - t0 - p["alpha"]) for *_, t0, t1 in pairs], rel=1e-6)
    assert spans[1][0] - p["alpha"] > (spans[0][0] - p["alpha"]) * 1.2 * CHAINED


def test_a_lone_transfer_is_not_held_to_its_share_of_the_busy_host_pool() -> None:
    """2 TCP ranks whose exchange costs 2.5 one-ways: the host pool (fitted to the exchange) would
    price a lone one-way 1.25x slow; a broadcast's single message moves at the one-way rate."""
    from ringflow.algorithms.registry import get_schedule
    topo, _ = fit({"tcp": {2: synthetic("tcp", 2)}}, nprocs=2)
    p = TRUE["tcp"][2]
    b = 2**20
    tab = from_plans(get_schedule("broadcast", "binomial", 2, root=0),
                     CallShape(Collective.BROADCAST, 2, b // 4, 4), inplace=True)
    got = {e: simulate_table(topo, tab, b, engine=e, params={"host_transport": "tcp"},
                             endpoints=topo.endpoints()[:2], timeline=True) for e in ("analytic", "flow")}
    assert got["flow"].time_us == pytest.approx(got["analytic"].time_us, rel=1e-6)
    (_, _, _, _, t0, t1), = got["flow"].timeline
    assert t1 - t0 == pytest.approx(p["alpha"] + b * p["oneway"], rel=1e-6)
    # the exchange still costs what the calibration measured: the pool binds when both directions run
    ex = simulate_schedule(topo, _schedules(2)["exchange"], b, params={"host_transport": "tcp"},
                           endpoints=topo.endpoints()[:2], timeline=True).timeline
    assert [t1 - t0 for *_, t0, t1 in ex] == pytest.approx([p["alpha"] + 2.5 * b * p["oneway"]] * 2, rel=1e-6)


@pytest.mark.parametrize("msg", [SINGLE, FRESH_SINGLE, 2 * FRESH_SINGLE, SINGLE // 2])
def test_sending_bytes_written_earlier_in_the_call_costs_the_calibrated_extra(msg: int) -> None:
    """2-rank halving-doubling all-reduce: step 1 sends what step 0 reduced (`Xfer.fresh`); from the
    single-copy size up to the fresh single-copy size each rank pays `FRESH` per byte of it, elsewhere
    nothing (the path is the same as an untouched source's, and no copy wrote it), and nothing where
    ranks share cores."""
    from ringflow.algorithms.registry import get_schedule
    measured = synthetic("shm", 2)
    plain = {**measured, "results": {k: v for k, v in measured["results"].items() if k != "exchange_fresh"}}
    size = 2 * msg   # halving-doubling on 2 ranks: halves of the buffer
    tab = from_plans(get_schedule("all_reduce", "halving_doubling", 2),
                     CallShape(Collective.ALL_REDUCE, 2, size // 4, 4), inplace=True)
    assert tab.lfresh is not None and tab.lfresh[tab.lstep == 1] == pytest.approx([0.5, 0.5])
    assert not tab.lfresh[tab.lstep == 0].any()
    got = {}
    for name, m in (("fresh", measured), ("plain", plain)):
        topo, _ = fit({"shm": {2: m}}, nprocs=2, cores=2)
        got[name] = [simulate_table(topo, tab, size, engine=e, params={"host_transport": "shm"},
                                    endpoints=topo.endpoints()[:2]).time_us for e in ("analytic", "flow")]
        assert got[name][1] == pytest.approx(got[name][0], rel=1e-6)
    extra = msg * FRESH if SINGLE <= msg <= FRESH_SINGLE else 0.0
    assert got["fresh"][0] - got["plain"][0] == pytest.approx(extra, rel=1e-6, abs=1e-6)
    # ranks sharing cores: the calibration step's extra is their time-sharing, which is not priced
    shared = [simulate_table(fit({"shm": {2: m}}, nprocs=2, cores=1)[0], tab, size, params={"host_transport": "shm"},
                             endpoints=topo.endpoints()[:2]).time_us for m in (measured, plain)]
    assert shared[0] == pytest.approx(shared[1], rel=1e-9)


@pytest.mark.parametrize("block,cores,paying", [(FRESH_SINGLE // 2, 4, 2), (FRESH_SINGLE, 4, 1), (SINGLE // 2, 2, 1),
                                                (SINGLE // 4, 4, 0)])
def test_sending_bytes_a_copy_wrote_costs_the_extra_at_every_size_from_the_single_copy_one(
        block: int, cores: int, paying: int) -> None:
    """4-rank Bruck all-gather: step 1 sends the rank's own block (copied in step 0) and the block it
    received in step 0. Where fresh sources take the slots (messages of the single-copy .. fresh
    single-copy size, a core per rank) both pay `FRESH` per byte; at other sizes from the single-copy
    one, and where ranks share cores, only the copied block does, as the calibration's copied source
    did; below the single-copy size neither."""
    from ringflow.algorithms.registry import get_schedule
    measured = synthetic("shm", 4)
    plain = {**measured, "results": {k: v for k, v in measured["results"].items() if k != "exchange_fresh"}}
    tab = from_plans(get_schedule("all_gather", "bruck", 4), CallShape(Collective.ALL_GATHER, 4, block // 4, 4),
                     inplace=False)
    assert tab.lfresh[tab.lstep == 1] == pytest.approx([2.0] * 4)
    assert tab.lfresh_copied[tab.lstep == 1] == pytest.approx([1.0] * 4)
    assert not tab.lfresh[tab.lstep == 0].any() and not tab.lfresh_copied[tab.lstep == 0].any()
    got = {}
    for name, m in (("fresh", measured), ("plain", plain)):
        topo, _ = fit({"shm": {4: m}}, nprocs=4, cores=cores)
        got[name] = np.array([simulate_table(topo, tab, 4 * block, engine=e, params={"host_transport": "shm"},
                                             endpoints=topo.endpoints()[:4]).time_us for e in ("analytic", "flow")])
    assert got["fresh"] - got["plain"] == pytest.approx([paying * block * FRESH] * 2, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("block,cores,paying", [(SINGLE // 2, 2, True), (SINGLE, 2, True), (FRESH_SINGLE, 2, False),
                                                (SINGLE // 4, 2, False), (SINGLE // 2, 4, False)])
def test_forwarding_fresh_bytes_on_shared_cores_costs_the_senders_copy_into_the_slots(
        block: int, cores: int, paying: bool) -> None:
    """4-rank Bruck all-gather on shm: step 1 forwards the block each rank received in step 0 (fresh, not
    written by a copy). Below the fresh sources' single-copy size the runtime sends it through the slots,
    so where ranks share cores the sender copies it once at the calibrated copy rate (`fresh_slot_GBps`);
    single copies (from the fresh size, or below the plain single-copy size the slots for every message,
    priced by the curves) and a core per rank (the fresh exchange prices every fresh byte) leave it out."""
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.api import itemsize_of
    from ringflow.sim.fabric import fabric_for
    from ringflow.sim.results import footprint_bytes
    topo, _ = fit({"shm": {4: synthetic("shm", 4)}}, nprocs=4, cores=cores)
    size = 4 * block
    tab = from_plans(get_schedule("all_gather", "bruck", 4), CallShape(Collective.ALL_GATHER, 4, block // 4, 4),
                     inplace=False)
    forwarded = tab.lfresh - tab.lfresh_copied
    assert forwarded[tab.lstep == 1] == pytest.approx([1.0] * 4) and not forwarded[tab.lstep == 0].any()
    count_bytes = float(block * itemsize_of("float32") // 4)
    msg = float(np.max(tab.frac / np.maximum(tab.nmsg, 1))) * count_bytes
    prm = params_for(topo, {"host_transport": "shm"}).for_call(
        count_bytes, 4, msg, footprint_bytes(tab.collective, 4, size), tab.peers_per_step(), tab.step_pattern(),
        footprint_bytes(tab.collective, 4, size, by_reference=True))
    assert (prm.fresh_slot_GBps is not None) == paying
    if not paying:
        return
    # the copy curve is linear, so its cost per byte at the message is the true copy rate's
    assert 1e-3 / prm.fresh_slot_GBps == pytest.approx(TRUE["shm"][4]["copy"], rel=1e-6)
    import dataclasses
    eps = topo.endpoints()[:4]
    with_slot = fabric_for(topo, prm, eps).local_us_per_byte(tab)
    without = fabric_for(topo, dataclasses.replace(prm, fresh_slot_GBps=None), eps).local_us_per_byte(tab)
    assert (with_slot - without) * count_bytes == pytest.approx(forwarded * count_bytes * TRUE["shm"][4]["copy"],
                                                                rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("coll,algo", [("all_gather", "bruck"), ("gather", "binomial"), ("all_to_all", "pairwise"),
                                       ("scatter", "direct")])
def test_a_copy_beside_a_receive_costs_the_calibrated_extra(coll: str, algo: str) -> None:
    """2 ranks: the step that moves a message also copies a rank's own block (an all-gather's rotation,
    the gather root's own part, the all-to-all's block to itself): a rank that receives in that step
    pays `BESIDE` per byte of its copy on top of the copy rate, as the calibration's exchange-and-copy
    step did; a scatter's root only sends, and a copy alone pays nothing."""
    from ringflow.algorithms.registry import get_schedule
    measured = synthetic("shm", 2)
    apart = {**measured, "results": {k: v for k, v in measured["results"].items() if k != "exchange_copy"}}
    size = 2**20
    rooted = coll in ("gather", "scatter")
    tab = from_plans(get_schedule(coll, algo, 2, root=0 if rooted else None),
                     CallShape(Collective.parse(coll), 2, size // 8, 4), inplace=False)
    receives = set(zip(tab.step.tolist(), tab.dst.tolist()))
    beside = np.array([c for s, r, c in zip(tab.lstep, tab.lrank, tab.lcopy) if (s, r) in receives] or [0.0])
    assert tab.lcopy.max() > 0 and (beside.max() > 0) == (coll != "scatter")
    got = {}
    for name, m in (("beside", measured), ("apart", apart)):
        topo, _ = fit({"shm": {2: m}}, nprocs=2)
        got[name] = [simulate_table(topo, tab, size, engine=e, params={"host_transport": "shm"},
                                    endpoints=topo.endpoints()[:2]).time_us for e in ("analytic", "flow")]
        assert got[name][1] == pytest.approx(got[name][0], rel=1e-6)
        copy_only = simulate_schedule(topo, _schedules(2)["copy"], size, params={"host_transport": "shm"},
                                      endpoints=topo.endpoints()[:2]).time_us
        assert copy_only == pytest.approx(measured["results"]["copy"][str(size)] + TRUE["shm"][2]["check"], rel=1e-6)
    assert got["beside"][0] - got["apart"][0] == pytest.approx(beside.max() * (size // 2) * BESIDE, rel=1e-6)


@pytest.mark.parametrize("coll,algo,copying", [("all_gather", "bruck", 4), ("gather", "direct", 1)])
def test_on_shared_cores_a_copy_beside_a_receive_pays_the_calibrated_extra_in_proportion_to_the_ranks_copying(
        coll: str, algo: str, copying: int) -> None:
    """4 TCP ranks on 2 cores, whose calibration's exchange-and-copy step (every rank copying beside its
    exchange) took BESIDE per byte more than the two apart: a step in which all 4 ranks copy beside a
    receive (a Bruck all-gather's own block) pays it in full, a direct gather's root copying alone a
    quarter of it; below BESIDE_SHARED_MIN_BYTES messages (wake-ups, not bytes) nothing."""
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.params import BESIDE_SHARED_MIN_BYTES
    measured = synthetic("tcp", 4)
    res = measured["results"]
    res["exchange_copy"] = {b: res["exchange"][b] + res["copy"][b] - TRUE["tcp"][4]["base"] + int(b) * BESIDE
                            for b in res["exchange"]}
    apart = {**measured, "results": {k: v for k, v in res.items() if k != "exchange_copy"}}
    topos = {name: fit({"tcp": {4: m}}, nprocs=4, cores=2)[0] for name, m in (("beside", measured), ("apart", apart))}
    for block in (2**20, BESIDE_SHARED_MIN_BYTES // 4):   # a Bruck all-gather's largest message is 2 blocks
        size = 4 * block
        tab = from_plans(get_schedule(coll, algo, 4, root=0 if coll == "gather" else None),
                         CallShape(Collective.parse(coll), 4, block // 4, 4), inplace=False)
        got = {name: [simulate_table(t, tab, size, engine=e, params={"host_transport": "tcp"},
                                     endpoints=t.endpoints()[:4]).time_us for e in ("analytic", "flow")]
               for name, t in topos.items()}
        want = block * BESIDE * copying / 4 if block >= BESIDE_SHARED_MIN_BYTES else 0.0
        for e, engine in enumerate(("analytic", "flow")):
            assert got["beside"][e] - got["apart"][e] == pytest.approx(want, rel=1e-6, abs=1e-6), (engine, block)


@pytest.mark.parametrize("tr,coll,algo,share", [("tcp", "gather", "binomial", 0.25), ("tcp", "all_gather", "bruck", 1.0),
                                                 ("shm", "gather", "binomial", 1.0)])
def test_over_tcp_a_rank_copying_beside_a_receive_it_does_not_send_in_pays_the_lone_reduction_s_share(
        tr: str, coll: str, algo: str, share: float) -> None:
    """2 TCP ranks whose lone receiver reduced 4x faster than every rank beside its exchange (its work hides
    behind its socket receive): a binomial gather's root, which only receives while it copies its own
    block, pays a quarter of the calibrated copy-beside extra; a Bruck all-gather's ranks, sending too, all
    of it, as the calibration's exchange-and-copy step did; over shm the whole extra either way."""
    from ringflow.algorithms.registry import get_schedule
    measured = synthetic(tr, 2)
    res = measured["results"]
    res["oneway_reduce"] = {b: res["oneway"][b] + int(b) * TRUE[tr][2]["red"] / 4 for b in res["oneway"]}
    apart = {**measured, "results": {k: v for k, v in res.items() if k != "exchange_copy"}}
    size, block = 2**21, 2**20
    tab = from_plans(get_schedule(coll, algo, 2, root=0 if coll == "gather" else None),
                     CallShape(Collective.parse(coll), 2, block // 4, 4), inplace=False)
    got = {}
    for name, m in (("beside", measured), ("apart", apart)):
        topo, _ = fit({tr: {2: m}}, nprocs=2, cores=2)
        got[name] = [simulate_table(topo, tab, size, engine=e, params={"host_transport": tr},
                                    endpoints=topo.endpoints()[:2]).time_us for e in ("analytic", "flow")]
    for e in range(2):
        assert got["beside"][e] - got["apart"][e] == pytest.approx(block * BESIDE * share, rel=1e-6)


@pytest.mark.parametrize("tr,cores,coll,charged", [("tcp", 2, "scatter", True), ("shm", 2, "scatter", False),
                                                   ("tcp", 1, "scatter", False), ("tcp", 2, "gather", False)])
def test_over_tcp_a_scatter_root_copying_beside_its_send_pays_the_one_way_copy_extra(
        tr: str, cores: int, coll: str, charged: bool) -> None:
    """2 ranks with a core each: a binomial scatter's root sends the peer's block and copies its own in one
    step; over TCP its core also copies the message into the socket, and its copy pays what the
    calibration's one-way with the sender copying took beyond the two apart. Not over shm (the peer reads
    the root's buffer), not where ranks share a core, not a gather (its root receives)."""
    from ringflow.algorithms.registry import get_schedule
    send_beside = 1 / 5e3   # us per byte
    measured = synthetic(tr, 2)
    res = measured["results"]
    res["oneway_copy"] = {b: res["oneway"][b] + int(b) * TRUE[tr][2]["copy"] + int(b) * send_beside
                          for b in res["oneway"]}
    apart = {**measured, "results": {k: v for k, v in res.items() if k != "oneway_copy"}}
    size, block = 2**21, 2**20
    tab = from_plans(get_schedule(coll, "binomial", 2, root=0), CallShape(Collective.parse(coll), 2, block // 4, 4),
                     inplace=False)
    got = {}
    for name, m in (("beside", measured), ("apart", apart)):
        topo, _ = fit({tr: {2: m}}, nprocs=2, cores=cores)
        got[name] = [simulate_table(topo, tab, size, engine=e, params={"host_transport": tr},
                                    endpoints=topo.endpoints()[:2]).time_us for e in ("analytic", "flow")]
    for e in range(2):
        assert got["beside"][e] - got["apart"][e] == pytest.approx(block * send_beside * charged, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("fraction,counted", [(0.12, True), (0.08, False)])
def test_a_copy_s_extra_beside_a_transfer_counts_from_a_tenth_of_the_exchange(fraction: float, counted: bool) -> None:
    """The exchange and a copy in one step took `fraction` of the exchange more than the two apart: from a
    tenth of the exchange that is the copy's cost beside a transfer (2 TCP ranks: 43 us at 1 MiB, 0.147 of
    the exchange, is what a binomial gather's root pays), below it the run-to-run noise of three timings."""
    m = synthetic("tcp", 2)
    ex, cp = m["results"]["exchange"], m["results"]["copy"]
    m["results"]["exchange_copy"] = {b: ex[b] + cp[b] - TRUE["tcp"][2]["base"] + fraction * ex[b] for b in ex}
    topo, _ = fit({"tcp": {2: m}}, nprocs=2, cores=2)
    p = params_for(topo, {"host_transport": "tcp"})
    got = p._from_curves(p.host_curves_for(2), 2**20, 2**20)
    assert (got.copy_beside_transfer_GBps is not None) == counted
    if counted:
        assert 1e-3 / got.copy_beside_transfer_GBps * 2**20 == pytest.approx(fraction * ex[str(2**20)], rel=0.05)


@pytest.mark.parametrize("tr,n", [("shm", 2), ("tcp", 2), ("shm", 4), ("tcp", 4)])
def test_every_rank_reducing_beside_its_exchange_pays_what_the_calibration_s_exchange_with_reduction_took(
        tr: str, n: int) -> None:
    """A rank reducing alone (one-way with reduction) was 5x faster than every rank reducing beside its
    exchange: over shm the slot copy hides the lone reduction, and over TCP with a core per rank its
    socket receive does, so every rank reducing is that much slower (a 2-rank halving-doubling
    reduce-scatter's step costs the calibration's exchange with reduction at its message size), not at most
    n lone reductions in a row; over TCP with ranks sharing cores (4 on 2) the n-fold bound stays."""
    from ringflow.algorithms.registry import get_schedule
    m = synthetic(tr, n)
    red, ow = TRUE[tr][n]["red"], m["results"]["oneway"]
    m["results"]["oneway_reduce"] = {b: ow[b] + int(b) * red / 5 for b in ow}
    topo, _ = fit({tr: {n: m}}, nprocs=n, cores=2)
    size = 2**21
    tab = from_plans(get_schedule("reduce_scatter", "halving_doubling", n), CallShape(Collective.REDUCE_SCATTER, n,
                     size // 4 // n, 4), inplace=False)
    got = simulate_table(topo, tab, size, params={"host_transport": tr}, endpoints=topo.endpoints()[:n]).time_us
    msg = size // 2
    params = params_for(topo, {"host_transport": tr})
    slowdown = params._from_curves(params.host_curves_for(n), msg, msg).reduce_busy_slowdown
    own_core = n <= 2
    if n == 2:   # one step: the exchange of half the buffer, reduced
        assert got == pytest.approx(m["results"]["exchange_reduce"][str(msg)], rel=1e-6)
    if tr == "shm" or own_core:
        assert slowdown == pytest.approx(5.0, rel=1e-6)
    else:
        assert 1.0 < slowdown <= n


def test_a_real_4_rank_calibration_times_the_all_to_all_step_again_at_every_size_and_keeps_the_fastest() -> None:
    """4 shm ranks (real processes, quick sizes): the all-to-all step's slow mode (1.7-1.8x at 4-64 KiB in
    most 4-rank jobs on 2 cores, gone seconds later) is met by timing it again after everything else; the
    first times stay on record and the curve keeps the fastest of the three."""
    from ringflow.sim._calib_worker import QUICK_SIZES
    from ringflow.sim.calibrate import measure
    r = measure(4, "shm", quick=True, timeout_s=120)["results"]
    first, kept = r["alltoall_retimed"], r["alltoall"]
    assert sorted(first, key=int) == sorted(kept, key=int) == [str(b) for b in QUICK_SIZES]
    assert all(0 < kept[k] <= first[k] for k in kept)
    assert set(k for k in r if k.endswith("_retimed")) <= {"alltoall_retimed", "exchange_retimed"}
    got = curves({"nranks": 4, "results": r})
    assert len(got["alltoall_us"]) == len(got["shift_us"]) == len(QUICK_SIZES)   # and the ring step
    # the check timed apart before the exchange step of 64 KiB too (calls whose first step has every rank busy)
    assert list(r["check_busy"]) == [str(2**16)] and got["check_busy_us"] >= 0.0
    # the reducing exchange of one block into the other of a two-block buffer, at every message size
    assert len(got["exchange_reduce_split_us"]) == len(QUICK_SIZES)
    assert all(s >= e for s, e in zip(got["exchange_reduce_split_us"], got["exchange_us"]))


def test_a_shift_step_has_every_rank_send_once_and_receive_once_not_in_pairs_nor_a_chain() -> None:
    """`TransferTable.in_shift_step`: ring steps and a pairwise all-to-all's shifts by 1 .. n-1 other than
    n/2 are shifts; a pipelined tree broadcast relays (some ranks receive and send on) but its root only
    sends and its leaves only receive, so its steps are not; exchanges in pairs are neither."""
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.transfers import from_schedule
    from ringflow.sim.validate import runtime_schedule

    def steps(t, mask):
        return sorted(set(t.step[mask].tolist()))
    for n, shifts in ((3, [0, 1]), (4, [0, 2]), (5, [0, 1, 2, 3])):
        t = from_schedule(get_schedule("all_to_all", "pairwise", n))
        assert steps(t, t.in_shift_step) == shifts == steps(t, t.in_relay_step)
        t = from_schedule(get_schedule("all_reduce", "ring", n))
        assert steps(t, t.in_shift_step) == list(range(2 * (n - 1)))
    tree = from_schedule(runtime_schedule("broadcast", 2**23, 4, 4, 0))
    assert tree.algorithm == "tree" and steps(tree, tree.in_relay_step) and not tree.in_shift_step.any()
    hd = from_schedule(get_schedule("all_reduce", "halving_doubling", 4))
    assert not hd.in_shift_step.any() and not hd.in_relay_step.any()


@pytest.mark.parametrize("size, cores", [(2**22, 2), (2**22, 4), (2**19, 2), (2**19, 4)])
def test_a_ring_step_s_transfers_take_the_calibrated_shift_step_over_the_exchange(size: int, cores: int) -> None:
    """4 TCP ranks: every rank sending to the next and receiving from the one before (the calibration's
    shift step) took 1.3x the exchange's transfer time. From 1 MiB messages relay steps (a pairwise
    all-to-all's shifts by 1 and 3; every ring step) pay that on their transfers, in both engines; pairs
    (its shift by 2, halving-doubling) and lone sends (a binomial broadcast) do not. With ranks sharing
    cores (2 cores) shift steps pay it below 1 MiB too, and a relay step that opens the call does not."""
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim import analytic
    from ringflow.sim.api import count_for_size
    from ringflow.sim.fabric import fabric_for
    from ringflow.sim.params import RELAY_MIN_BYTES
    m = synthetic("tcp", 4)
    t1 = TRUE["tcp"][4]["base"] + TRUE["tcp"][4]["alpha"]
    slow = {**m, "results": {**m["results"], "shift": {b: t1 + 1.3 * (t - t1) for b, t in m["results"]["exchange"].items()}}}
    cases = {(c, a): from_plans(get_schedule(c, a, 4, root=0 if c == "broadcast" else None),
                                CallShape(Collective.parse(c), 4, size // 4 // (4 if c == "all_to_all" else 1), 4),
                                inplace=False)
             for c, a in (("all_to_all", "pairwise"), ("all_reduce", "ring"), ("all_reduce", "halving_doubling"),
                          ("broadcast", "binomial"), ("all_gather", "bruck"))}
    relay = {k: sorted(set(t.step[t.in_relay_step].tolist())) for k, t in cases.items()}
    assert relay == {("all_to_all", "pairwise"): [0, 2], ("all_reduce", "ring"): list(range(6)),
                     ("all_reduce", "halving_doubling"): [], ("broadcast", "binomial"): [], ("all_gather", "bruck"): [0]}
    assert {k: sorted(set(t.step[t.in_shift_step].tolist())) for k, t in cases.items()} == relay
    shared, large = cores == 2, size >= 4 * RELAY_MIN_BYTES   # the all-to-all's and the ring's messages: size / 4
    paying = {k: [s for s in v if s > 0 or not shared] if large or shared else [] for k, v in relay.items()}
    for (coll, algo), tab in cases.items():
        got = {}
        for name, meas in (("plain", m), ("shift", slow)):
            topo, _ = fit({"tcp": {4: meas}}, nprocs=4, cores=cores)
            got[name] = [simulate_table(topo, tab, size, engine=e, params={"host_transport": "tcp"},
                                        endpoints=topo.endpoints()[:4]).time_us for e in ("analytic", "flow")]
            p = params_for(topo, {"host_transport": "tcp"})
            nbytes = 4 * count_for_size(tab.collective, 4, size, 4)
            call = p.for_call(nbytes, 4, float(np.max(tab.frac / tab.nmsg)) * nbytes, None, tab.peers_per_step(),
                              tab.step_pattern())
            ratio = 1.3 if name == "shift" else 1.0
            assert call.relay_step_slowdown == pytest.approx(ratio if large else 1.0, rel=1e-6)
            assert call.shift_step_slowdown == pytest.approx(ratio if shared and not large else 1.0, rel=1e-6)
            assert call.relay_skips_opening_step == shared
            if name == "plain":
                model = analytic.build_model(tab, fabric_for(topo, call, topo.endpoints()[:4]), call)
                lines = model.line_c[0] * nbytes
                transfer_us = sum(lines[model.line_step == s].max() for s in paying[(coll, algo)])
        for e in (0, 1):
            assert got["shift"][e] - got["plain"][e] == pytest.approx(0.3 * transfer_us, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("tr,n,m,slower", [("tcp", 4, 2**21, True), ("shm", 4, 2**21, False),
                                            ("shm", 4, 2 * FRESH_SINGLE, True), ("shm", 4, FRESH_SINGLE, False),
                                            ("tcp", 2, 2**21, False)])
def test_a_transfer_costs_at_least_what_its_bytes_cost_at_the_call_s_working_set(tr: str, n: int, m: int,
                                                                               slower: bool) -> None:
    """At 16 MiB every transfer moves its bytes 1.5x slower (its working set left a cache). A call of m-byte
    messages whose working set is that of a 16 MiB exchange moves them at the 16 MiB rate over TCP where
    ranks share cores, and over shm past the size where the curves' message-size regimes end (the fresh
    single-copy size, whose own point measures its new path); a call whose working set is its messages', shm
    messages up to that size, and TCP ranks with a core each (whose 16 MiB cliff is the socket's, a
    message-size regime) at the message's rate."""
    raw = synthetic(tr, n)
    res, t1 = raw["results"], TRUE[tr][n]["base"] + TRUE[tr][n]["alpha"]
    slow = 1.5
    for name, curve in res.items():   # every transfer schedule's
        if name not in ("copy", "check_rooted") and not name.startswith("steps"):
            res[name] = {b: t1 + (v - t1) * (slow if int(b) >= 2**24 else 1.0) for b, v in curve.items()}
    prm = params_for(fit({tr: {n: raw}}, nprocs=n, cores=2)[0], {"host_transport": tr})
    alone, in_big_call = prm.for_call(m, n, m), prm.for_call(8 * m, n, m, footprint_bytes=2**25)
    ratio = alone.host_pool_GBps / in_big_call.host_pool_GBps
    assert ratio == pytest.approx(slow if slower else 1.0, rel=1e-6)
    assert prm.for_call(m, n, m, footprint_bytes=2 * m).host_pool_GBps == pytest.approx(alone.host_pool_GBps)


@pytest.mark.parametrize("tr,n,m,slower", [("shm", 4, 2 * SINGLE, True), ("shm", 4, SINGLE // 2, False),
                                            ("shm", 2, 2 * SINGLE, False), ("tcp", 4, 2 * SINGLE, False)])
def test_where_shm_ranks_share_cores_a_reduction_costs_at_least_what_it_costs_at_the_call_s_working_set(
        tr: str, n: int, m: int, slower: bool) -> None:
    """From 8 MiB every reduction costs 1.5x more per byte (its operands left a cache). 4 shm ranks on 2 cores
    reducing single-copy messages in a call whose working set is a 16 MiB exchange's (a tree reduce streaming
    segments through its buffers) reduce at the 8-16 MiB rate, in place and out of place; below the
    single-copy size, with a core per rank (read at the message size) and over TCP at the message's rate."""
    raw = synthetic(tr, n)
    res, slow = raw["results"], 1.5
    for name, plain in (("exchange_reduce", "exchange"), ("oneway_reduce", "oneway"),
                        ("oneway_reduce_inplace", "oneway")):
        res[name] = {b: res[plain][b] + (v - res[plain][b]) * (slow if int(b) >= 2**23 else 1.0)
                     for b, v in res[name].items()}
    prm = params_for(fit({tr: {n: raw}}, nprocs=n, cores=2)[0], {"host_transport": tr})
    alone, in_big_call = prm.for_call(m, n, m), prm.for_call(8 * m, n, m, footprint_bytes=2**25)
    one_rank_alone = TRUE[tr][n]["red"] / 1.6   # us per byte: the one-way reduction's, below 8 MiB
    if slower:
        assert 1e-3 / in_big_call.reduce_GBps == pytest.approx(slow * one_rank_alone, rel=1e-6)
        assert 1e-3 / in_big_call.reduce_inplace_GBps == pytest.approx(slow * one_rank_alone, rel=1e-6)
    else:
        assert in_big_call.reduce_GBps == pytest.approx(alone.reduce_GBps, rel=1e-6)
        assert in_big_call.reduce_inplace_GBps == pytest.approx(alone.reduce_inplace_GBps, rel=1e-6)


def test_a_one_way_in_place_reduction_on_the_slot_path_moves_its_bytes_as_fast_as_the_calibration_timed_it() -> None:
    """4 shm ranks on 2 cores: below the reductions' single-copy size (FRESH_SINGLE) the runtime's reductions
    take the slot path, here 0.8 of the plain one-way's single copy, reduction included. The in-place
    one-way reduction's data then moves in 0.8 of the plain one-way's time (plus a reduction the curves
    price at nothing), not in the plain transfer's time plus a reduction; from FRESH_SINGLE, where both go
    by single copy, in the plain one-way's plus one rank's reduction alone (on shared cores the bound of an
    in-place reduction); a reduction in an exchange step is not discounted."""
    from ringflow.algorithms.layout import CallShape
    from ringflow.algorithms.schedule import Collective
    from ringflow.sim.api import simulate_table
    from ringflow.sim.transfers import from_plans
    raw = synthetic("shm", 4)
    res, p = raw["results"], TRUE["shm"][4]
    t1 = p["base"] + p["alpha"]
    res["oneway_reduce_inplace"] = {b: t1 + 0.8 * (v - t1) for b, v in res["oneway"].items()}
    topo, _ = fit({"shm": {4: raw}}, nprocs=4, cores=2)
    sched = _schedules(4)

    def data_us(name: str, b: int) -> float:
        tab = from_plans(sched[name], CallShape(Collective.ALL_REDUCE, 4, b // 4, 4), inplace=True)
        return simulate_table(topo, tab, b, dtype="float32", params={"host_transport": "shm"},
                              endpoints=topo.endpoints()[:4], checked=True).time_us - t1 - p["check"]

    for b in (SINGLE, 2 * SINGLE):
        assert data_us("oneway_reduce_inplace", b) / data_us("oneway", b) == pytest.approx(0.8, abs=0.01)
    lone_reduction = FRESH_SINGLE * p["red"] / 1.6
    assert data_us("oneway_reduce_inplace", FRESH_SINGLE) - data_us("oneway", FRESH_SINGLE) == \
        pytest.approx(lone_reduction, rel=0.01)
    for name in ("oneway_reduce_inplace", "exchange_reduce"):
        tab = from_plans(sched[name], CallShape(Collective.ALL_REDUCE, 4, SINGLE // 4, 4), inplace=True)
        assert tab.oneway_into_inplace_reduction.any() == (name == "oneway_reduce_inplace")


@pytest.mark.parametrize("tr,n,applies", [("tcp", 4, True), ("tcp", 2, False), ("shm", 4, False)])
def test_where_tcp_ranks_share_cores_a_step_of_smaller_messages_pays_the_exchange_s_cost_per_byte_at_its_size(
        tr: str, n: int, applies: bool) -> None:
    """4 TCP ranks on 2 cores whose exchanges (with and without reduction) pay a fixed WAKE us on top of their
    bytes: the second step of a halving-doubling reduce-scatter, half the first's messages, costs per byte
    what the calibration's exchange with reduction of its own messages did over the first's (not half the
    first step); with a core per rank, or over shm, every step costs the largest message's rate."""
    import dataclasses

    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.analytic import build_model
    from ringflow.sim.fabric import fabric_for, step_size_factor
    wake = 150.0
    m = synthetic(tr, n)
    res = m["results"]
    for key in ("exchange", "exchange_reduce"):
        res[key] = {b: t + wake for b, t in res[key].items()}
    topo, _ = fit({tr: {n: m}}, nprocs=n, cores=2)
    size = 2**18   # 4 ranks: messages of 128 KiB, then 64 KiB
    tab = from_plans(get_schedule("reduce_scatter", "halving_doubling", n),
                     CallShape(Collective.REDUCE_SCATTER, n, size // 4 // n, 4), inplace=False)
    msg = size // 2
    base = params_for(topo, {"host_transport": tr})
    p = base._from_curves(base.host_curves_for(n), msg, msg)
    assert (p.small_step_costs is not None) == applies
    factor = step_size_factor(p, tab)
    if not applies:
        assert np.all(factor == 1.0)
        return
    t1 = TRUE[tr][n]["base"] + TRUE[tr][n]["alpha"]
    per_byte = {b: (res["exchange_reduce"][str(b)] - t1) / b for b in (msg, msg // 2)}
    assert factor == pytest.approx([1.0, per_byte[msg // 2] / per_byte[msg]], rel=1e-6)
    assert factor[1] > 1.3   # the wake-up does not halve with the bytes
    count = float(size // n)
    with_it = build_model(tab, fabric_for(topo, p, topo.endpoints()[:n]), p)
    plain = dataclasses.replace(p, small_step_costs=None)
    without = build_model(tab, fabric_for(topo, plain, topo.endpoints()[:n]), plain)
    fixed = float(with_it.line_a[0].max())   # the per-message latency, the same in both steps
    steps_with, steps_without = with_it.step_times_us(count, 0), without.step_times_us(count, 0)
    assert steps_with[0] == pytest.approx(steps_without[0], rel=1e-9)
    assert steps_with[1] - fixed == pytest.approx((steps_without[1] - fixed) * factor[1], rel=1e-6)


@pytest.mark.parametrize("tr,n,cores", [("shm", 4, 2), ("tcp", 4, 2), ("shm", 2, 2), ("tcp", 2, 2)])
def test_where_ranks_share_cores_an_in_place_reduction_is_no_faster_than_one_rank_reducing_alone(
        tr: str, n: int, cores: int) -> None:
    """The calibration's in-place one-way reduction is 2.5x faster than a plain reduction and one rank's
    out-of-place one 1.6x: with a core per rank the in-place figure holds; where ranks share cores it is
    a slope through differences of nearly equal noisy times, and the lone out-of-place rate bounds it."""
    m = synthetic(tr, n)
    topo, _ = fit({tr: {n: m}}, nprocs=n, cores=cores)
    base = params_for(topo, {"host_transport": tr})
    msg = 2**22
    p = base._from_curves(base.host_curves_for(n), msg, msg)
    red = TRUE[tr][n]["red"]
    want = red / 1.6 if n > cores else red / 2.5
    assert 1e-3 / p.reduce_inplace_GBps == pytest.approx(want, rel=0.02)


def test_a_copy_s_extra_beside_a_transfer_is_no_more_than_the_calibration_measured_at_the_message_size() -> None:
    """2 shm ranks whose exchange-and-copy step took BESIDE per byte more than the exchange and the copy
    apart, and twice that at 1 MiB alone (a cache effect that comes and goes): 1 MiB messages pay the
    bump (the mean over m/2..2m), 2 MiB messages only what the calibration measured at 2 MiB."""
    m = synthetic("shm", 2)
    res = m["results"]
    base = TRUE["shm"][2]["base"]
    res["exchange_copy"] = {b: res["exchange"][b] + res["copy"][b] - base + int(b) * BESIDE * (2 if int(b) == 2**20 else 1)
                            for b in res["exchange"]}
    topo, _ = fit({"shm": {2: m}}, nprocs=2, cores=2)
    p = params_for(topo, {"host_transport": "shm"})
    per_byte = {msg: 1e-3 / p._from_curves(p.host_curves_for(2), msg, msg).copy_beside_transfer_GBps
                for msg in (2**20, 2**21)}
    assert per_byte[2**21] == pytest.approx(BESIDE, rel=1e-3)
    assert per_byte[2**20] == pytest.approx(BESIDE * (1 + 2 + 1) / 3, rel=1e-3)


@pytest.mark.parametrize("tr,by_reference", [("shm", True), ("tcp", False)])
def test_a_scatter_root_sending_by_reference_copies_at_the_working_set_of_its_own_block(
        tr: str, by_reference: bool) -> None:
    """A copy costs 1.5x more per byte from 2 MiB (its working set left a cache). A 2-rank scatter of 4 MiB:
    with single copies (shm, 2 MiB messages) the peer's core reads its block from the root's buffer, so the
    root touches only its own block and the copy of it (4 MiB: the calibration's copy of 2 MiB) and copies
    at the 2 MiB rate; over TCP the root's core also sends the peer's block (6 MiB: the 3 MiB rate)."""
    from ringflow.sim.results import footprint_bytes
    size = 2**22
    assert footprint_bytes("scatter", 2, size, by_reference=True) == size
    assert footprint_bytes("scatter", 2, size) == size + size // 2
    assert footprint_bytes("gather", 2, size, by_reference=True) == size + size // 2
    raw = synthetic(tr, 2)
    base = TRUE[tr][2]["base"]
    raw["results"]["copy"] = {b: base + (v - base) * (1.5 if int(b) > 2**21 else 1.0) for b, v in raw["results"]["copy"].items()}
    prm = params_for(fit({tr: {2: raw}}, nprocs=2, cores=2)[0], {"host_transport": tr})
    got = prm.for_call(size / 2, 2, size / 2, footprint_bytes("scatter", 2, size), 1, "all",
                       footprint_bytes("scatter", 2, size, by_reference=True))
    at_block = prm.for_call(size / 2, 2, size / 2, size)
    assert (got.copy_GBps == pytest.approx(at_block.copy_GBps, rel=1e-9)) == by_reference


@pytest.mark.parametrize("tr", ["shm", "tcp"])
def test_a_reducing_exchange_step_costs_the_calibrated_reduction_of_one_block_into_the_other(tr: str) -> None:
    """2 shm ranks: the calibration's exchange with reduction of the very block sent took 93 us at 512 KiB,
    the same step reducing one block of a two-block buffer while sending the other 115, and the bench's
    1 MiB halving-doubling reduce-scatter (that one step) 117. A reducing step is priced from the latter
    where it was measured; calibrations recorded before it was still predict from the former."""
    from ringflow.algorithms.registry import get_schedule
    n, size = 2, 2**20
    msg = size // 2
    tab = from_plans(get_schedule("reduce_scatter", "halving_doubling", n),
                     CallShape(Collective.REDUCE_SCATTER, n, size // 4 // n, 4), inplace=False)

    def predicted(m: dict) -> float:
        topo, _ = fit({tr: {n: m}}, nprocs=n, cores=2)
        return simulate_table(topo, tab, size, params={"host_transport": tr}, endpoints=topo.endpoints()[:n],
                              checked=False).time_us
    old = synthetic(tr, n)
    red = TRUE[tr][n]["red"]
    new = synthetic(tr, n)
    new["results"]["exchange_reduce_split"] = {b: t + int(b) * red * 0.8 for b, t in
                                               new["results"]["exchange_reduce"].items()}
    assert predicted(new) > predicted(old) * 1.01   # over TCP up to the n-fold bound on every rank reducing
    if tr == "shm":   # with a core per shm rank read at the message size: the step is the curve's time there
        assert predicted(old) == pytest.approx(old["results"]["exchange_reduce"][str(msg)], rel=1e-6)
        assert predicted(new) == pytest.approx(new["results"]["exchange_reduce_split"][str(msg)], rel=1e-6)


@pytest.mark.parametrize("coll,algo,busy", [("all_gather", "bruck", True), ("reduce_scatter", "halving_doubling", True),
                                           ("all_reduce", "ring", True), ("all_reduce", "tree", False)])
def test_a_call_whose_first_step_keeps_every_rank_busy_pays_the_check_timed_before_the_exchange_step(
        coll: str, algo: str, busy: bool) -> None:
    """4 TCP ranks on 2 cores: the argument check cost 526-540 us before the 4-byte step (`check_us`) but
    325-360 before the 64 KiB exchange step and before the bench's all-gathers, reduce-scatters and
    all-to-alls of 64 KiB (their first step has every rank sending and receiving). A calibration that timed
    the check there (`check_busy`) prices such calls with it; a call whose first step leaves ranks idle (a
    tree all-reduce's leaves send first) keeps `check_us`; a calibration without it prices both as before."""
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.transfers import from_schedule
    n, size = 4, 2**16
    with_busy = synthetic("tcp", n)
    p = TRUE["tcp"][n]
    with_busy["results"]["check_busy"] = {str(2**16): 0.6 * p["check"]}
    sched = get_schedule(coll, algo, n)
    assert from_schedule(sched).first_step_busy() == busy

    def t_us(cal: dict) -> float:
        topo, _ = fit({"tcp": {n: cal}}, nprocs=n, cores=2)
        return simulate_schedule(topo, sched, size, params={"host_transport": "tcp"}).time_us
    saved = t_us(synthetic("tcp", n)) - t_us(with_busy)
    assert saved == pytest.approx(0.4 * p["check"] if busy else 0.0, abs=1e-6)


@pytest.mark.parametrize("tr,coll,size,want_at", [("shm", "broadcast", 2**17, 2**18), ("shm", "reduce", 2**17, 2**18),
                                                  ("shm", "broadcast", 2**16, 2**16), ("shm", "gather", 2**18, 2**18),
                                                  ("shm", "broadcast", 2**19, 2**20), ("shm", "broadcast", 2**20, 2**16),
                                                  ("tcp", "broadcast", 2**17, 2**16)])
def test_two_shm_ranks_rooted_slot_message_pays_the_check_timed_before_the_largest_such_message_no_larger(
        tr: str, coll: str, size: int, want_at: int) -> None:
    """2 shm ranks: a rooted call below the single-copy size is one slot message, the calibration's fan-out
    step of twice its size, whose check was timed at 32 and 128 KiB messages (12 and 19 us; the bench's 64
    KiB broadcast paid 13, its 128 KiB one 19). The call pays the figure timed before the largest such
    message no larger than its own; from the single-copy size on, and over TCP, the 32 KiB one."""
    from ringflow.algorithms.registry import get_schedule
    from ringflow.sim.transfers import from_schedule
    sizes, checks = [2**16, 2**18, 2**20, 2**22], [12.0, 19.0, 14.0, 14.0]
    m = synthetic(tr, 2)
    m["results"]["check_rooted"] = {str(b): v for b, v in zip(sizes, checks)}
    topo, _ = fit({tr: {2: m}}, nprocs=2, cores=2)
    tab = from_schedule(get_schedule(coll, "binomial", 2, root=0))
    t = [simulate_table(topo, tab, size, params={"host_transport": tr}, endpoints=topo.endpoints()[:2],
                        checked=c).time_us for c in (True, False)]
    assert size < SINGLE or want_at == sizes[0]   # (the synthetic host's single-copy size)
    assert t[0] - t[1] == pytest.approx(checks[sizes.index(want_at)], rel=1e-6)
