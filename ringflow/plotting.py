"""The one door to matplotlib (an optional extra): a headless pyplot, or a typed error naming the install."""
from __future__ import annotations

from typing import Any

from .errors import ConfigError


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files, no display)."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plotting needs matplotlib, which is not installed",
                          "pip install 'ringflow[plot]' (or drop --plot)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
