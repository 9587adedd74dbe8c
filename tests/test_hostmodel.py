"""The host cost model: features, prediction properties, fitting, file format, runtime protocol, a real calibration."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ringflow.algorithms import registry
from ringflow.algorithms.schedule import Collective
from ringflow.algorithms.selection import CostModel, call_shape, model_decision
from ringflow.errors import ConfigError, InvalidArgument
from ringflow.hostmodel import HostCostModel, HostParams, load_cost_model
from ringflow.hostmodel.features import CacheSizes, call_features
from ringflow.hostmodel.fit import Sample, fit_model, fit_params, nnls
from ringflow.hostmodel.sweep import INPLACE, SKIP_ALGORITHMS

CACHES = CacheSizes(private_bytes=2 * 2**20, shared_bytes=32 * 2**20)
TRUTH = HostParams(call_us=20.0, step_us=8.0, crowded_step_us=40.0, msg_us=2.0, peer_us=1.0, copy_us_per_MiB=100.0,
                   kernel_us_per_MiB=150.0, reduce_us_per_MiB=250.0, l2_miss_us_per_MiB=60.0,
                   llc_miss_us_per_MiB=40.0, core_share=0.7)
SIZES = [4096 * 4**k for k in range(7)]
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all"]


def _model(transport: str = "shm", params: HostParams = TRUTH) -> HostCostModel:
    return HostCostModel(transport, params, cores=2, calibrated_ranks=(2, 4), caches=CACHES, margin=1.1)


def _schedules(n: int):
    for c in COLLS:
        for a in registry.algorithms_for(c):
            if a in SKIP_ALGORITHMS:
                continue
            yield c, registry.get_schedule(c, a, n, root=0 if Collective.parse(c).has_root else None)


def _shape(c: str, n: int, nbytes: int):
    return call_shape(Collective.parse(c), n, nbytes, 4)


@pytest.fixture(scope="module")
def synthetic():
    """Features of every algorithm at 2 and 4 ranks (2 cores), and the times TRUTH gives them."""
    feats = [call_features(s, _shape(c, n, size), c in INPLACE, "shm", 2, CACHES)
             for n in (2, 4) for c, s in _schedules(n) for size in SIZES]
    m = _model()
    return feats, np.array([m.predict_features_us(f) for f in feats])


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_prediction_monotone_in_size(transport: str, n: int) -> None:
    m = _model(transport)
    for c, s in _schedules(n):
        t = [m.predict_us(s, _shape(c, n, size), c in INPLACE) for size in SIZES + [64 * 2**20]]
        assert all(b >= a * (1 - 1e-9) for a, b in zip(t, t[1:], strict=False)), (c, s.algorithm, t)


def _bytes_each_rank_receives(c: str, n: int, nbytes: int) -> float:
    """A lower bound on the bytes the busiest rank must receive for collective `c` of size `nbytes`."""
    return nbytes if c in ("broadcast",) else nbytes * (n - 1) / n if c != "reduce" else nbytes * (n - 1) / n / n


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_prediction_never_below_alpha_beta_bound(transport: str) -> None:
    m = _model(transport)
    per_MiB = min(TRUTH.copy_us_per_MiB, TRUTH.kernel_us_per_MiB)
    for n in (2, 4, 6):
        for c, s in _schedules(n):
            for size in SIZES:
                shape = _shape(c, n, size)
                moved = shape.count * 4 * (n if Collective.parse(c).per_rank_sized else 1)
                bound = TRUTH.call_us + TRUTH.step_us + _bytes_each_rank_receives(c, n, moved) / 2**20 * per_MiB
                assert m.predict_us(s, shape, c in INPLACE) >= bound * (1 - 1e-9), (c, s.algorithm, n, size)


def test_oversubscription_slows_calls() -> None:
    m = _model()
    s = registry.get_schedule("all_gather", "ring", 4)
    alone = _model(params=HostParams(**{**TRUTH.to_dict(), "core_share": 0.0}))
    shape = _shape("all_gather", 4, 2**20)
    crowding = 1 - 2 / 4   # half of a rank's peers are off a core: 4 ranks on 2 cores
    assert m.predict_us(s, shape, False) == pytest.approx(alone.predict_us(s, shape, False)
                                                          * (1 + TRUTH.core_share * crowding))


def test_nnls_matches_kkt_conditions() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 6))
    b = a @ np.array([1.0, 0.0, 2.0, -1.0, 0.5, 0.0]) + 0.01 * rng.standard_normal(40)
    x = nnls(a, b)
    w = a.T @ (b - a @ x)
    assert (x >= 0).all()
    assert np.all(w[x == 0] <= 1e-8)                     # no free variable would lower the residual
    assert np.allclose(w[x > 0], 0.0, atol=1e-8)         # stationary on the passive set
    xt = np.array([1.0, 0.5, 2.0, 0.0, 3.0, 0.25])
    assert np.allclose(nnls(a, a @ xt), xt, atol=1e-9)


@pytest.mark.long
def test_fit_recovers_parameters_noise_free(synthetic) -> None:
    feats, y = synthetic
    p = fit_params([Sample(f, t) for f, t in zip(feats, y, strict=True)], cores=2)
    for k, v in TRUTH.to_dict().items():
        assert getattr(p, k) == pytest.approx(v, rel=1e-3, abs=1e-3), k


@pytest.mark.long
def test_fit_with_small_noise_recovers_bandwidths_and_predictions(synthetic) -> None:
    feats, y = synthetic
    rng = np.random.default_rng(7)
    noisy = y * (1 + 0.02 * rng.standard_normal(len(y)))
    model = fit_model([Sample(f, t) for f, t in zip(feats, noisy, strict=True)], "shm", 2, CACHES, (2, 4))
    for k in ("copy_us_per_MiB", "kernel_us_per_MiB", "reduce_us_per_MiB", "core_share"):
        assert getattr(model.params, k) == pytest.approx(getattr(TRUTH, k), rel=0.1), k
    pred = np.array([model.predict_features_us(f) for f in feats])
    assert np.median(np.abs(pred / y - 1)) < 0.02
    assert 1.0 < model.margin < 1.1                       # 1 + p90 of a 2 % noise


def test_fit_rejects_too_few_rows(synthetic) -> None:
    feats, y = synthetic
    with pytest.raises(InvalidArgument):
        fit_params([Sample(f, t) for f, t in zip(feats[:3], y[:3], strict=True)], cores=2)


def test_save_load_round_trip(tmp_path) -> None:
    path = str(tmp_path / "host-model.json")
    for tr in ("shm", "tcp"):
        _model(tr).save(path)
    for tr in ("shm", "tcp"):
        back = load_cost_model(path, tr)
        assert back.params == TRUTH and back.margin == 1.1 and back.transport == tr
        assert back.calibrated_ranks == (2, 4) and back.cores == 2 and back.caches == CACHES


def test_load_rejects_foreign_files(tmp_path) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"nodes": []}))
    with pytest.raises(ConfigError):
        load_cost_model(str(path), "shm")
    _model("shm").save(str(path := tmp_path / "m.json"))
    with pytest.raises(ConfigError):
        load_cost_model(str(path), "tcp")


def test_satisfies_the_runtime_protocol() -> None:
    m = _model()
    assert isinstance(m, CostModel)
    assert m.supports(2) and m.supports(8) and not m.supports(9)
    d = model_decision(Collective.ALL_REDUCE, 2**20, 4, None, 4, True, 256 * 2**10, m)
    assert d.flat_us > 0 and all(t > 0 for _, _, t in d.candidates)
    assert d.chosen is d.flat or d.flat_us > m.margin * d.chosen_us


@pytest.mark.long
def test_real_calibration_writes_a_model(tmp_path) -> None:
    from ringflow.hostmodel.model import read_file, write_file
    from ringflow.hostmodel.sweep import calibrate, refit
    doc = calibrate([2], ["shm"], sizes=[16 * 2**10, 2**20], collectives=["all_reduce"], quiet_wait_s=0, retries=0)
    path = str(tmp_path / "host-model.json")
    write_file(path, doc)
    back = read_file(path)
    assert set(back["transports"]) == {"shm"}
    assert len(back["calibration"]) >= 12 and all(r["time_us"] > 0 for r in back["calibration"])
    assert back["meta"]["jobs"][0]["nranks"] == 2
    m = load_cost_model(path, "shm")
    assert m.calibrated_ranks == (2,) and m.margin >= 1.0
    assert set(m.fit_stats) >= {"cv_median", "cv_p90", "rows"}
    again = refit(back)                                   # fitted again from the stored rows, nothing measured
    assert set(again["transports"]) == {"shm"} and again["calibration"] == back["calibration"]
