"""Bootstrap over torch's store: ringflow's Store interface on a c10d Store, and the communicator built with it.

torch hands the backend creator a c10d store (a PrefixStore per group over the job's TCPStore or
FileStore); ringflow needs set/get/wait/check/add/compare_set/delete with timeouts. `TorchStore`
adapts one to the other, so no second rendezvous port is opened. The job secret that authenticates
ringflow's own peer connections is drawn by group rank 0 and published under a key of that store:
torch's TCPStore is itself unauthenticated, so the secret is only as private as the store port.

ringflow's knobs apply as under `ringflow.init`: RINGFLOW_DEBUG / RINGFLOW_DEBUG_FILE configure logging
(prefixed with the process's global rank), RINGFLOW_TIMEOUT replaces torch's default timeout, and a
malformed knob raises ConfigError when the group is created.
"""
from __future__ import annotations

import datetime
import os
from collections.abc import Iterable
from typing import Any, cast

from .. import config
from ..errors import ConfigError, InvalidArgument, RingflowSystemError, Timeout
from ..runtime import Communicator, logs
from ..runtime.job.rendezvous import SharedState
from ..runtime.job.store import Store

_BOOT_KEY = "ringflow/boot"


def _td(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(0.001, float(seconds)))


class TorchStore:
    """ringflow's Store interface over a torch.distributed Store (TCPStore, FileStore, PrefixStore)."""

    def __init__(self, store: Any, timeout: float) -> None:
        self._s, self.timeout = store, float(timeout)

    def _err(self, exc: Exception, what: str) -> Exception:
        text = str(exc)
        if "timeout" in text.lower() or "timed out" in text.lower():
            return Timeout(f"torch store {what}: {text.splitlines()[0] if text else type(exc).__name__}",
                           "a rank did not arrive; check that every rank called the same function")
        return RingflowSystemError(f"torch store {what} failed: {text}", "check that the store (rank 0) is alive")

    def set(self, key: str, value: bytes | str) -> None:
        """Set key to value."""
        try:
            self._s.set(key, value if isinstance(value, bytes) else value.encode())
        except RuntimeError as exc:
            raise self._err(exc, f"set {key!r}") from None

    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of key, waiting up to `timeout` seconds for it to be set."""
        self.wait([key], timeout)
        try:
            return bytes(self._s.get(key))
        except RuntimeError as exc:
            raise self._err(exc, f"get {key!r}") from None

    def wait(self, keys: Iterable[str], timeout: float | None = None) -> None:
        """Wait until every key is set."""
        ks = list(keys)
        t = self.timeout if timeout is None else float(timeout)
        try:
            self._s.wait(ks, _td(t))
        except RuntimeError as exc:
            raise self._err(exc, f"wait for {ks[:4]} ({t:.1f}s)") from None

    def check(self, keys: Iterable[str]) -> bool:
        """True if every key is set (no waiting)."""
        try:
            return bool(self._s.check(list(keys)))
        except RuntimeError as exc:
            raise self._err(exc, "check") from None

    def add(self, key: str, delta: int = 1) -> int:
        """Atomically add delta to an integer key; the new value."""
        try:
            return int(self._s.add(key, int(delta)))
        except RuntimeError as exc:
            raise self._err(exc, f"add {key!r}") from None

    def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> tuple[bool, bytes | None]:
        """Set key to desired if it equals expected (None: if absent); (swapped, current value)."""
        try:
            cur = bytes(self._s.compare_set(key, b"" if expected is None else expected, desired))
        except RuntimeError as exc:
            raise self._err(exc, f"compare_set {key!r}") from None
        return cur == desired, cur

    def delete(self, key: str) -> bool:
        """Remove key; True if it existed."""
        try:
            return bool(self._s.delete_key(key))
        except RuntimeError as exc:
            raise self._err(exc, f"delete {key!r}") from None

    def close(self) -> None:
        """Nothing to release: torch owns the store."""


#: what torch passes a backend when init_process_group / new_group got no timeout (torch's default_pg_timeout)
TORCH_DEFAULT_TIMEOUT_S = 1800.0


def group_timeout_s(timeout: datetime.timedelta | float | None) -> float:
    """A group's timeout in seconds: the one torch passes, except that torch's default (30 min, passed when the
    caller gave none) gives way to RINGFLOW_TIMEOUT where that is set. ConfigError for a malformed knob."""
    knob = float(config.get("TIMEOUT"))   # validates RINGFLOW_TIMEOUT even where torch's timeout wins
    if knob <= 0:
        raise ConfigError(f"RINGFLOW_TIMEOUT={knob:g} is not positive", "give a positive number of seconds")
    t = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout or 0.0)
    if t <= 0 or t == TORCH_DEFAULT_TIMEOUT_S:
        return knob if os.environ.get("RINGFLOW_TIMEOUT", "").strip() else TORCH_DEFAULT_TIMEOUT_S
    return t


def _world_rank(group_rank: int) -> int:
    """This process's rank in the job (log lines carry it): torch's RANK, else the rank in the default group."""
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        import torch.distributed as dist
        return dist.get_rank() if dist.is_initialized() else group_rank


def communicator_from_store(store: Any, rank: int, size: int, timeout: float) -> Communicator:
    """A ringflow Communicator for one torch process group, bootstrapped through that group's store."""
    if not 0 <= rank < size:
        raise InvalidArgument(f"rank {rank} of {size}", "torch passed an impossible rank; check init_process_group")
    logs.setup(_world_rank(rank))
    ts = TorchStore(store, timeout)
    if rank == 0:
        ts.set(_BOOT_KEY, f"{os.urandom(8).hex()}:{os.urandom(32).hex()}")   # what secrets.token_hex draws
    job, _, secret = ts.get(_BOOT_KEY, timeout).decode().partition(":")
    tos = config.get("TRAFFIC_CLASS")
    tos = None if tos is None or int(tos) < 0 else int(tos)
    shared = SharedState(cast(Store, ts), None, f"torch-{job}", secret.encode(), float(timeout), tos)
    return Communicator(shared, "pg", rank, size)
