"""The MoE token dispatchers' constants, fitted on the fitting half of the published registry.

For each dispatcher kind (`moe.DISPATCHERS`; a case names its kind in ``layout.ep_dispatcher``, default
alltoall) two constants are fitted on that kind's MoE fitting cases:

- the host's seconds per dropless MoE layer forward (`moe.host_wait_s`), searched over `HOST_GRID_S`;
- for each candidate host time, the rate in routed elements per second, found by bisection in log space so that
  the median of published / predicted is 1 (it stays 0, the term left out, when the model is already at or
  below the published throughput without it).

The pair with the smallest median absolute log error over the kind's cases wins (the smaller host time on a
tie): the median, as everywhere in the fit (`published._centre`), so that one case far off for another reason (a
model gap, not noise) cannot drag a constant every other case shares. A host time is kept only where it lowers
that error by at least `MIN_GAIN` below the best fit without it: where the kind's cases cannot tell host times
apart, the term stays out (0). Held-out cases are never read: the caller passes the fitting cases only.
"""
from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

from .moe import DISPATCHERS

if TYPE_CHECKING:  # pragma: no cover
    from .published import Constants, Predictor

RATE_RANGE_EPS = (1e8, 1e13)   # routed elements per second per GPU and pass searched
BISECTIONS = 14
HOST_GRID_S = tuple(i * 0.5e-3 for i in range(25))   # 0 to 12 ms per MoE layer forward
MIN_GAIN = 0.01   # median |log error| a host time must remove to be kept


def fit_dispatchers(fit_cases: list[dict[str, Any]], consts: Constants, predictor: Predictor) -> None:
    """Set ``consts.dispatch_eps[kind]``, ``consts.dispatch_host_s[kind]`` and their ``consts.fitted_on`` entries per
    dispatcher kind."""
    from .published import is_moe_case
    for kind in DISPATCHERS:
        mine = [c for c in fit_cases if is_moe_case(c) and (c.get("layout") or {}).get("ep_dispatcher",
                                                                                      "alltoall") == kind]
        consts.dispatch_eps.pop(kind, None)
        consts.dispatch_host_s.pop(kind, None)
        if not mine:
            continue
        tried = []
        for host_s in HOST_GRID_S:
            rate = _fit_rate(mine, consts, predictor, kind, host_s)
            score, ids = _score(mine, consts, predictor, kind, host_s, rate)
            if ids:
                tried.append((score, host_s, rate, ids))
        if not tried:
            _set(consts, kind, 0.0, 0.0)
            continue
        best = min(tried, key=lambda t: (t[0], t[1]))
        if best[1] and best[0] > tried[0][0] - MIN_GAIN:   # tried[0]: no host time
            best = tried[0]
        _, host_s, rate, ids = best
        _set(consts, kind, host_s, rate)
        consts.fitted_on[f"dispatch_eps[{kind}]"] = ids
        consts.fitted_on[f"dispatch_host_s[{kind}]"] = ids


def _fit_rate(cases: list[dict[str, Any]], consts: Constants, predictor: Predictor, kind: str,
              host_s: float) -> float:
    """The rate (0: term left out) that centres published / predicted on 1 at host time `host_s`."""
    centre, ids = _centre(cases, consts, predictor, kind, host_s, 0.0)
    if not ids or centre >= 1.0:
        return 0.0   # no time to explain: the term stays out
    lo, hi = (math.log(r) for r in RATE_RANGE_EPS)   # slow rate: too slow a prediction; fast: too fast
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        centre, _ = _centre(cases, consts, predictor, kind, host_s, math.exp(mid))
        if centre > 1.0:   # predicted too slow: the dispatcher is faster
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _set(consts: Constants, kind: str, host_s: float, rate: float) -> None:
    for table, value in ((consts.dispatch_eps, rate), (consts.dispatch_host_s, host_s)):
        if value:
            table[kind] = value
        else:
            table.pop(kind, None)


def _ratios(cases: list[dict[str, Any]], consts: Constants, predictor: Predictor, kind: str, host_s: float,
            rate: float) -> list[tuple[str, float]]:
    """(case id, published / predicted) of every expressible case with `kind` at (`host_s`, `rate`)."""
    _set(consts, kind, host_s, rate)
    got = [(c, predictor(c, consts).value) for c in cases]
    return [(c["id"], c["value"] / v) for c, v in got if v is not None and v > 0]


def _centre(cases: list[dict[str, Any]], consts: Constants, predictor: Predictor, kind: str, host_s: float,
            rate: float) -> tuple[float, list[str]]:
    """Median published / predicted over `cases` with the dispatcher `kind` at (`host_s`, `rate`)."""
    ok = _ratios(cases, consts, predictor, kind, host_s, rate)
    if not ok:
        return 1.0, []
    return statistics.median(r for _, r in ok), [i for i, _ in ok]


def _score(cases: list[dict[str, Any]], consts: Constants, predictor: Predictor, kind: str, host_s: float,
           rate: float) -> tuple[float, list[str]]:
    """Median |log(published / predicted)| over `cases` at (`host_s`, `rate`)."""
    ok = _ratios(cases, consts, predictor, kind, host_s, rate)
    if not ok:
        return math.inf, []
    return statistics.median(abs(math.log(r)) for _, r in ok), [i for i, _ in ok]
