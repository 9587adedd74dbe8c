"""The host cost model: predicts one runtime collective call's time on this machine from a few named parameters.

`ringflow calibrate` measures every registered algorithm on real ranks (shared memory and TCP), `fit`
fits each transport's parameters, `ringflow validate host` checks the predictions out of sample.
The runtime loads a model file through the `ringflow.cost_models` entry point (`load_cost_model`).
"""
from __future__ import annotations

from .features import FEATURES, CacheSizes, CallFeatures, cache_sizes, call_features, host_cores
from .model import PARAM_MEANINGS, HostCostModel, HostParams
from .wakeup import WakeupCost

__all__ = ["FEATURES", "PARAM_MEANINGS", "CacheSizes", "CallFeatures", "HostCostModel", "HostParams", "WakeupCost",
           "cache_sizes", "call_features", "host_cores", "load_cost_model"]


def load_cost_model(path: str, transport: str) -> HostCostModel:
    """The `transport` ('shm' or 'tcp') model of the host-model file at `path` (ConfigError if it is not one)."""
    return HostCostModel.load(path, transport)
