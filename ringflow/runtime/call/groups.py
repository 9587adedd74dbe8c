"""Groups of a Communicator: split by color, new_group of listed ranks, shrink past dead ranks."""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from ...errors import InvalidArgument
from ..job.store import PrefixStore

if TYPE_CHECKING:
    from ..job.rendezvous import SharedState


GroupT = TypeVar("GroupT", bound="Groups")


class Groups:
    """Sub-communicators (a mixin of `Communicator`: a group is a communicator of the same class)."""

    if TYPE_CHECKING:
        rank: int
        size: int
        ns: str
        timeout: float
        _nsplit: int
        _store: PrefixStore
        _sh: SharedState
        _usable: Callable[[], None]

        def __init__(self, shared: SharedState, ns: str, rank: int, size: int) -> None: ...

    def split(self: GroupT, color: int | None, key: int = 0, timeout: float | None = None) -> GroupT | None:
        """Collective: ranks with equal color form a new communicator, ordered by (key, rank); None: no group."""
        self._usable()
        if color is not None and (not isinstance(color, (int, np.integer)) or color < 0):
            raise InvalidArgument(f"color={color!r}", "color is an int >= 0, or None to join no group")
        k = self._nsplit
        self._nsplit += 1
        t = self.timeout if timeout is None else float(timeout)
        self._store.set(f"split{k}/{self.rank}", json.dumps([None if color is None else int(color), int(key)]))
        self._store.wait([f"split{k}/{r}" for r in range(self.size)], t)
        entries = [json.loads(self._store.get(f"split{k}/{r}", t)) for r in range(self.size)]
        if color is None:
            return None
        members = sorted((e[1], r) for r, e in enumerate(entries) if e[0] == int(color))
        new_rank = [r for _, r in members].index(self.rank)
        return type(self)(self._sh, f"{self.ns}/s{k}c{int(color)}", new_rank, len(members))

    def new_group(self: GroupT, ranks: Sequence[int], timeout: float | None = None) -> GroupT | None:
        """Collective over all ranks: a communicator of `ranks` (in that order); None on non-members."""
        rs = [int(r) for r in ranks]
        if len(set(rs)) != len(rs) or any(not 0 <= r < self.size for r in rs) or not rs:
            raise InvalidArgument(f"new_group ranks {list(ranks)} must be distinct ranks of 0..{self.size - 1}")
        if self.rank in rs:
            return self.split(0, rs.index(self.rank), timeout)
        return self.split(None, 0, timeout)

    def shrink(self: GroupT, exclude: Sequence[int] = (), timeout: float | None = None) -> GroupT:
        """Collective over the survivors: a new communicator without dead (or excluded) ranks; destroys this one."""
        from .recovery import shrink
        return shrink(self, exclude, timeout)  # type: ignore[arg-type, return-value]
