"""The simulator: ringflow's schedules on modelled clusters (analytic and flow-level engines).

    from ringflow.sim import simulate
    res = simulate(load_topology("dgx-h100"), "all_reduce", 1 << 30, engine="flow")
    res.time_us, res.busbw_GBps, res.tiers()
"""
from __future__ import annotations

from .api import ENGINES, choose_algorithm, itemsize_of, schedule_for, simulate, simulate_schedule
from .params import SimParams, params_for
from .results import SimResult, busbw_factor, count_for_size, size_for_count

__all__ = ["ENGINES", "SimParams", "SimResult", "busbw_factor", "choose_algorithm", "count_for_size",
           "itemsize_of", "params_for", "schedule_for", "simulate", "simulate_schedule", "size_for_count"]
