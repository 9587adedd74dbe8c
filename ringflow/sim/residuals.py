"""How much of a calibration the fitted host model explains: each calibration step, predicted back.

`ringflow calibrate` times a dozen tiny schedules (`_calib_worker`) and `calibrate.fit` turns them
into the curves the simulator reads. Predicting every timed step again from the fitted host, against
its raw time, shows what the model does not follow: noise the fit cleaned away (a delayed sample,
a size slower than both neighbours) and effects the model leaves out (on 4 TCP ranks sharing 2 cores a
lone one-way step below 1 MiB costs far less than half an exchange, which is what the model charges).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np


def calibration_residuals(topo: Any, measured: Mapping[str, Mapping[int, Mapping[str, Any]]],
                          engine: str = "analytic") -> list[dict[str, Any]]:
    """Every timed calibration step of `measured` (transport -> ranks -> worker output, as `fit` takes it)
    predicted on `topo` (the fitted host): rows of transport, nranks, step, size_bytes, measured_us,
    predicted_us, error = (predicted - measured) / measured."""
    from ..algorithms.schedule import Collective
    from ..runtime.communicator import _call_shape
    from ._calib_worker import CURVE_STEPS, MANY_RANK_STEPS, _schedules, buffer_bytes
    from .api import simulate_table
    from .transfers import from_plans
    rows: list[dict[str, Any]] = []
    for tr, by_n in measured.items():
        for n, res in by_n.items():
            n = int(n)
            scheds = _schedules(n)
            eps = topo.endpoints()[:n]
            # the steps timed at every size (steps1 / steps8, 4-byte calls, only give the per-step costs)
            for step in CURVE_STEPS + MANY_RANK_STEPS:
                times = res["results"].get(step)
                if not times or step not in scheds:
                    continue
                sched = scheds[step]
                coll = Collective.parse(sched.collective)
                # timed in place where the worker ran it so (`_calib_worker.batch`), without the runtime's check
                inplace = step.endswith("_inplace")
                for size, meas in sorted(times.items(), key=lambda kv: int(kv[0])):
                    nbytes, call_bytes = int(size), buffer_bytes(step, int(size))
                    tab = from_plans(sched, _call_shape(coll, n, call_bytes, 4), inplace)
                    pred = simulate_table(topo, tab, call_bytes, engine=engine, params={"host_transport": tr},
                                          endpoints=eps, checked=False).time_us
                    m = float(meas)
                    rows.append({"transport": tr, "nranks": n, "step": step, "size_bytes": nbytes, "measured_us": m,
                                 "predicted_us": pred, "error": (pred - m) / m if m > 0 else 0.0})
    return rows


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per transport, rank count and step: the median |error| over its sizes and the worst size."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["transport"], r["nranks"], r["step"]), []).append(r)
    out = []
    for (tr, n, step), rs in groups.items():
        worst = max(rs, key=lambda r: abs(r["error"]))
        out.append({"transport": tr, "nranks": n, "step": step,
                    "median_abs_error": float(np.median([abs(r["error"]) for r in rs])),
                    "worst_size_bytes": worst["size_bytes"], "worst_error": worst["error"]})
    return out
