"""Typed errors of ringflow, NCCL's result classes made Pythonic.

Every error says what happened and what to do about it::

    RingflowError
    ├── InvalidArgument        bad value from the caller (NCCL: ncclInvalidArgument)
    │   ├── ConfigError        a RINGFLOW_* knob or option has a bad value
    │   ├── TopologyError      a topology file/preset/graph is malformed
    │   └── UnknownAlgorithm   an algorithm/collective name that does not exist
    ├── InvalidUsage           a programming error (NCCL: ncclInvalidUsage)
    ├── VerificationError      a schedule does not do what its collective promises
    ├── RingflowSystemError    an OS, socket or shared-memory call failed (NCCL: ncclSystemError)
    │   └── ProtocolError      a peer sent a malformed/truncated/out-of-sequence frame
    ├── RemoteError            a peer died or aborted (names the rank)
    ├── Timeout                a blocking call ran out of time (also a builtin TimeoutError)
    └── Aborted                the communicator was aborted (by abort() or a failure)

``SystemError`` is a deprecated alias of ``RingflowSystemError`` (the old name shadowed the builtin);
importing it warns with a DeprecationWarning.
"""
from __future__ import annotations

import builtins
import warnings
from typing import Any


class RingflowError(Exception):
    """Base of every ringflow error; `hint` says what to do, `detail` (a dict, or None) holds structured facts
    behind the sentence (both calls of a mismatch, the ranks a timeout waited on and their last calls)."""

    def __init__(self, message: str, hint: str | None = None, *, detail: Any = None) -> None:
        self.message = message
        self.hint = hint
        self.detail: dict[str, Any] | None = detail
        super().__init__(f"{message} (fix: {hint})" if hint else message)


class InvalidArgument(RingflowError, ValueError):
    """A value passed by the caller is wrong (shape, dtype, rank, size, name)."""


class ConfigError(InvalidArgument):
    """A RINGFLOW_* environment knob or an option has a bad value."""


class TopologyError(InvalidArgument):
    """A topology (file, preset, graph or ring order) is malformed or inconsistent."""


class UnknownAlgorithm(InvalidArgument):
    """An algorithm or collective name is not known; the message lists valid ones."""


class InvalidUsage(RingflowError):
    """The API was used in a way that cannot work (a programming error)."""


class VerificationError(RingflowError):
    """A schedule fails symbolic verification; names rank, step, chunk, expected vs found."""

    def __init__(self, message: str, *, rank: int | None = None, step: int | None = None,
                 chunk: object = None, hint: str | None = None) -> None:
        self.rank, self.step, self.chunk = rank, step, chunk
        super().__init__(message, hint)


class RingflowSystemError(RingflowError, OSError):
    """An operating-system, socket or shared-memory call failed (NCCL's ncclSystemError)."""


class ProtocolError(RingflowSystemError):
    """A peer sent a frame that fails validation (magic, version, size, sequence)."""


class RemoteError(RingflowError):
    """A peer rank died, disconnected or aborted; `rank` names it."""

    def __init__(self, message: str, rank: int | None = None, hint: str | None = None, *,
                 detail: Any = None) -> None:
        self.rank = rank
        super().__init__(message, hint, detail=detail)


class Timeout(RingflowError, builtins.TimeoutError):
    """A blocking call did not complete within its timeout."""


class Aborted(RingflowError):
    """The communicator was aborted; create a new one (or shrink) to continue."""


class Terminated(BaseException):  # noqa: N818 - like KeyboardInterrupt, a stop request rather than an error
    """SIGTERM or SIGHUP arrived (Slurm, Kubernetes, `timeout`, a closed terminal): unwind so cleanup runs."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by signal {signum}")


def raise_terminated(signum: int, frame: object) -> None:
    """A signal handler that turns SIGTERM / SIGHUP into `Terminated` in the main thread."""
    raise Terminated(signum)


__all__ = [
    "RingflowError", "InvalidArgument", "ConfigError", "TopologyError", "UnknownAlgorithm",
    "InvalidUsage", "VerificationError", "RingflowSystemError", "ProtocolError", "RemoteError",
    "Timeout", "Aborted", "Terminated",
]

#: old name -> new name; each old name still imports, with a DeprecationWarning
_DEPRECATED = {"SystemError": "RingflowSystemError"}


def _deprecated_alias(module: str, name: str) -> Any:
    """The class that the deprecated `name` now means, after warning; AttributeError if `name` is not one."""
    new = _DEPRECATED.get(name)
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warnings.warn(f"{module}.{name} is deprecated (it shadows the builtin {name}); use {module}.{new}",
                  DeprecationWarning, stacklevel=3)
    return globals()[new]


def __getattr__(name: str) -> Any:
    return _deprecated_alias(__name__, name)
