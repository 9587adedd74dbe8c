"""ringflow: collective communication for distributed AI training.

A real collective library (shared memory and TCP), a model of the hardware it
runs on, and a simulator that predicts collectives and LLM-training traffic on
clusters of thousands of GPUs. Heavy parts load lazily so `import ringflow`
stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

from .errors import (
    Aborted,
    ConfigError,
    InvalidArgument,
    InvalidUsage,
    ProtocolError,
    RemoteError,
    RingflowError,
    RingflowSystemError,
    Timeout,
    TopologyError,
    UnknownAlgorithm,
    VerificationError,
    _deprecated_alias,
)

__version__ = "0.1.0"

# name -> module that defines it; loaded on first access
_LAZY = {
    "init": "ringflow.runtime",
    "Communicator": "ringflow.runtime",
    "Work": "ringflow.runtime",
    "get_rank": "ringflow.runtime.call.identity",
    "get_world_size": "ringflow.runtime.call.identity",
    "local_rank": "ringflow.runtime.call.identity",
    "Topology": "ringflow.topology",
    "Schedule": "ringflow.algorithms",
}

__all__ = [
    "__version__", "init", "Communicator", "Work", "Topology", "Schedule", "get_rank", "get_world_size", "local_rank",
    "RingflowError", "InvalidArgument", "ConfigError", "TopologyError", "UnknownAlgorithm", "InvalidUsage",
    "VerificationError", "RingflowSystemError", "ProtocolError", "RemoteError", "Timeout", "Aborted",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        return _deprecated_alias(__name__, name)  # `ringflow.SystemError` warns; anything else: AttributeError
    return getattr(importlib.import_module(module), name)
