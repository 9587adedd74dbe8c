"""ringflow as a torch.distributed backend: ``import ringflow.torch_backend`` then ``init_process_group("ringflow")``.

Importing this package registers backend "ringflow" for CPU tensors. Each process group (the
default one and every ``new_group``) is a `ProcessGroupRingflow` over its own ringflow
Communicator, bootstrapped through the store torch hands the backend (see docs/torch.md).
"""
from __future__ import annotations

from typing import Any

BACKEND = "ringflow"


def _create(store: Any, rank: int, size: int, timeout: Any) -> Any:
    from .process_group import create  # torch.distributed and the runtime load on first use
    return create(store, rank, size, timeout)


def register() -> None:
    """Register backend "ringflow" with torch.distributed (idempotent)."""
    import torch.distributed as dist
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


def __getattr__(name: str) -> Any:
    if name in ("ProcessGroupRingflow", "RingflowWork", "TorchStore", "communicator_from_store"):
        from . import process_group, store, work
        for mod in (process_group, store, work):
            if hasattr(mod, name):
                return getattr(mod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register()

__all__ = ["BACKEND", "register", "ProcessGroupRingflow", "RingflowWork", "TorchStore", "communicator_from_store"]
