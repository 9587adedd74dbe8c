"""The plug-in point through which the runtime loads a cost model without importing the package that fits it.

A package registers a loader in the entry-point group `ringflow.cost_models` (ringflow's own
`ringflow.hostmodel` registers `host`, see pyproject.toml); `load_cost_model` calls the first
loader that accepts the file. The runtime so stays below the packages that measure and fit models.
"""
from __future__ import annotations

from importlib.metadata import entry_points

from ...algorithms.selection import CostModel
from ...errors import ConfigError

ENTRY_POINT_GROUP = "ringflow.cost_models"


def load_cost_model(path: str, transport: str) -> CostModel:
    """The cost model in the file at `path` for ranks talking over `transport` ('shm' or 'tcp')."""
    eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    if not eps:
        raise ConfigError(f"no cost-model loader is installed to read {path}",
                          "reinstall ringflow (pip install -e .) so its `ringflow.cost_models` entry point exists")
    errors = []
    for ep in eps:
        try:
            model = ep.load()(path, transport)
        except ConfigError as exc:
            errors.append(f"{ep.name}: {exc}")
            continue
        if not isinstance(model, CostModel):
            raise ConfigError(f"the {ep.name!r} cost-model loader returned {type(model).__name__}, not a CostModel",
                              "fix the loader registered under `ringflow.cost_models`")
        return model
    raise ConfigError(f"no cost-model loader could read {path}: {'; '.join(errors)}",
                      "write the file with `ringflow calibrate -o FILE` on this host")
