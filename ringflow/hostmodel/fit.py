"""Fit a host cost model to calibration rows: weighted non-negative least squares, a 1-D search for core sharing.

For a fixed `core_share` the model is linear in its other ten parameters once it is known which row is
critical in each step (the slowest rank, or all ranks' work pooled on the cores); the fit alternates between
choosing those rows under the current prices and solving the non-negative least squares problem
(Lawson-Hanson active set) weighted by 1/measured time, so it minimises relative, not absolute, error.
`core_share` is found by a golden-section search around that inner fit. A few rounds of Huber reweighting
keep a row measured during a burst of other work from pulling the fit as hard as the square of its error.
The model's `margin` is 1 + the 90th percentile of its K-fold cross-validated relative error: a predicted
gain smaller than that is within what the model cannot tell.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgument
from .features import FEATURES, CacheSizes, CallFeatures
from .model import HostCostModel, HostParams, sharing_factor

MAX_SHARE = 4.0          # core_share search interval [0, MAX_SHARE]
CV_FOLDS = 5
MARGIN_QUANTILE = 0.9
HUBER_K = 1.345        # Huber's constant (95 % efficiency on normal residuals)
ROBUST_ITERS = 3       # reweighting rounds
_INIT_THETA = np.array([5.0, 50.0, 1.0, 0.5, 150.0, 150.0, 200.0, 50.0, 50.0])  # starting prices (FEATURES order)
assert len(_INIT_THETA) == len(FEATURES)


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 0) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 10 * np.finfo(float).eps * max(1.0, np.abs(a).max(initial=0.0)) * max(m, n)
    for _ in range(max_iter or 3 * n + 10):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


@dataclass(frozen=True)
class Sample:
    """One calibration measurement: a call's features and its measured time."""

    feats: CallFeatures
    time_us: float


def _design(samples: Sequence[Sample], theta: np.ndarray, cores: int, share: float) -> np.ndarray:
    rows = []
    for s in samples:
        f = sharing_factor(s.feats.nranks, cores, share)
        rows.append(np.concatenate(([1.0], s.feats.critical(theta))) * f / s.time_us)
    return np.array(rows)


def fit_linear(samples: Sequence[Sample], cores: int, share: float, iters: int = 8,
               weights: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """(call_us and per-feature prices, loss) for a fixed core_share: alternating slowest-rank choice and NNLS
    (each row's squared relative error weighted by `weights`, default 1)."""
    theta = _INIT_THETA.copy()
    w = np.sqrt(np.ones(len(samples)) if weights is None else weights)
    b = w.copy()
    x = np.zeros(len(FEATURES) + 1)
    for _ in range(iters):
        a = _design(samples, theta, cores, share) * w[:, None]
        scale = np.linalg.norm(a, axis=0)
        scale[scale == 0] = 1.0
        x_new = nnls(a / scale, b) / scale
        done = np.allclose(x_new, x, rtol=1e-6, atol=1e-9)
        x = x_new
        theta = np.maximum(x[1:], 1e-9)   # a zero price still breaks ties towards the busier rank
        if done:
            break
    a = _design(samples, x[1:], cores, share) * w[:, None]
    r = a @ x - b
    return x, float(r @ r)


def robust_weights(rel_err: np.ndarray) -> np.ndarray | None:
    """Huber weights of relative residuals (scale: 1.4826 x their median absolute value); None where the fit is
    exact. A row far off the rest (a burst of other work during its samples) counts linearly, not squared."""
    scale = 1.4826 * float(np.median(np.abs(rel_err)))
    if scale < 1e-9:
        return None
    a = np.abs(rel_err)
    c = HUBER_K * scale
    return np.where(a <= c, 1.0, c / np.maximum(a, 1e-300))


def _share_search(samples: Sequence[Sample], cores: int, weights: np.ndarray | None) -> float:
    """The core_share minimising the weighted loss (0 where no sample has more ranks than cores)."""
    if not any(s.feats.nranks > cores for s in samples):
        return 0.0
    grid = np.linspace(0.0, MAX_SHARE, 9)
    losses = [fit_linear(samples, cores, g, weights=weights)[1] for g in grid]
    k = int(np.argmin(losses))
    lo, hi = grid[max(0, k - 1)], grid[min(len(grid) - 1, k + 1)]
    return _golden(lambda s: fit_linear(samples, cores, s, weights=weights)[1], lo, hi)


def _rel_residuals(x: np.ndarray, samples: Sequence[Sample], cores: int, share: float) -> np.ndarray:
    a = _design(samples, x[1:], cores, share)
    return a @ x - 1.0


def _golden(f, lo: float, hi: float, tol: float = 1e-3) -> float:
    g = (np.sqrt(5) - 1) / 2
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    fc, fd = f(c), f(d)
    while hi - lo > tol:
        if fc < fd:
            hi, d, fd = d, c, fc
            c = hi - g * (hi - lo)
            fc = f(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + g * (hi - lo)
            fd = f(d)
    return (lo + hi) / 2


def fit_params(samples: Sequence[Sample], cores: int) -> HostParams:
    """The parameters minimising the squared relative error over `samples`."""
    if len(samples) < len(FEATURES) + 2:
        raise InvalidArgument(f"{len(samples)} calibration rows cannot determine {len(FEATURES) + 2} parameters",
                              "calibrate more sizes, collectives or rank counts")
    if any(s.time_us <= 0 for s in samples):
        raise InvalidArgument("a calibration time is not positive", "re-measure: every time must be > 0")
    weights = None
    for _ in range(1 + ROBUST_ITERS):
        share = _share_search(samples, cores, weights)
        x, _ = fit_linear(samples, cores, share, weights=weights)
        weights = robust_weights(_rel_residuals(x, samples, cores, share))
        if weights is None:
            break
    names = HostParams.linear_names()
    return HostParams(**{n: float(v) for n, v in zip(names, x, strict=True)}, core_share=float(share))


def relative_errors(model: HostCostModel, samples: Sequence[Sample]) -> np.ndarray:
    """(predicted - measured) / measured per sample."""
    return np.array([(model.predict_features_us(s.feats) - s.time_us) / s.time_us for s in samples])


def cross_validated_errors(samples: Sequence[Sample], cores: int, folds: int = CV_FOLDS,
                           share: float | None = None) -> np.ndarray:
    """Out-of-fold relative errors: each sample predicted by a model fitted without its fold (fixed `share`
    if given, else searched per fold)."""
    n = len(samples)
    order = np.random.default_rng(0).permutation(n)
    errs = np.zeros(n)
    for k in range(folds):
        test = order[k::folds]
        mask = np.ones(n, dtype=bool)
        mask[test] = False
        train = [samples[int(i)] for i in np.flatnonzero(mask)]
        if share is None:
            p = fit_params(train, cores)
        else:
            w = None
            for _ in range(1 + ROBUST_ITERS):
                x, _ = fit_linear(train, cores, share, weights=w)
                w = robust_weights(_rel_residuals(x, train, cores, share))
                if w is None:
                    break
            names = HostParams.linear_names()
            p = HostParams(**{nm: float(v) for nm, v in zip(names, x, strict=True)}, core_share=share)
        m = HostCostModel("shm", p, cores, (2,), CacheSizes(1, 1))
        errs[test] = relative_errors(m, [samples[i] for i in test])
    return errs


def fit_model(samples: Sequence[Sample], transport: str, cores: int, caches: CacheSizes,
              calibrated_ranks: Sequence[int]) -> HostCostModel:
    """A fitted model with its margin from cross-validation and its fit statistics."""
    params = fit_params(samples, cores)
    model = HostCostModel(transport, params, cores, tuple(calibrated_ranks), caches)
    ins = np.abs(relative_errors(model, samples))
    cv = np.abs(cross_validated_errors(samples, cores, share=params.core_share))
    model.margin = float(1.0 + np.quantile(cv, MARGIN_QUANTILE))
    model.fit_stats = {"rows": len(samples), "in_sample_median": float(np.median(ins)),
                       "in_sample_p90": float(np.quantile(ins, 0.9)), "cv_median": float(np.median(cv)),
                       "cv_p90": float(np.quantile(cv, 0.9)), "cv_folds": CV_FOLDS}
    return model
