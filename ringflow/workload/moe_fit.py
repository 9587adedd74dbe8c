"""The MoE token dispatchers' rates, fitted on the fitting half of the published registry.

For each dispatcher kind (`moe.DISPATCHERS`; a case names its kind in ``layout.ep_dispatcher``, default
alltoall) the rate in routed elements per second is found by bisection in log space so that the median of
published / predicted over that kind's MoE fitting cases is 1. When the model is already at or below the
published throughput with the term left out, the rate stays 0 (the term is not there). Held-out cases are never
read: the caller passes the fitting cases only.
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


def fit_dispatchers(fit_cases: list[dict[str, Any]], consts: Constants, predictor: Predictor) -> None:
    """Set ``consts.dispatch_eps[kind]`` and ``consts.fitted_on['dispatch_eps[kind]']`` per dispatcher kind."""
    from .published import is_moe_case
    for kind in DISPATCHERS:
        mine = [c for c in fit_cases if is_moe_case(c) and (c.get("layout") or {}).get("ep_dispatcher",
                                                                                      "alltoall") == kind]
        consts.dispatch_eps.pop(kind, None)
        if not mine:
            continue
        centre, ids = _centre(mine, consts, predictor, kind, 0.0)
        if not ids or centre >= 1.0:
            consts.fitted_on[f"dispatch_eps[{kind}]"] = ids
            continue   # no time to explain: the term stays out
        lo, hi = (math.log(r) for r in RATE_RANGE_EPS)   # slow rate: too slow a prediction; fast: too fast
        for _ in range(BISECTIONS):
            mid = (lo + hi) / 2
            centre, ids = _centre(mine, consts, predictor, kind, math.exp(mid))
            if centre > 1.0:   # predicted too slow: the dispatcher is faster
                lo = mid
            else:
                hi = mid
        consts.dispatch_eps[kind] = math.exp((lo + hi) / 2)
        consts.fitted_on[f"dispatch_eps[{kind}]"] = ids


def _centre(cases: list[dict[str, Any]], consts: Constants, predictor: Predictor, kind: str,
            rate: float) -> tuple[float, list[str]]:
    """Median published / predicted over `cases` with the dispatcher `kind` at `rate` (0: left out)."""
    if rate:
        consts.dispatch_eps[kind] = rate
    else:
        consts.dispatch_eps.pop(kind, None)
    got = [(c, predictor(c, consts).value) for c in cases]
    ok = [(c, v) for c, v in got if v is not None and v > 0]
    if not ok:
        return 1.0, []
    return statistics.median(c["value"] / v for c, v in ok), [c["id"] for c, _ in ok]
