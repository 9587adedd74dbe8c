"""Per-communicator connection table: shared memory to peers on this host, TCP to the rest.

Connections are one-directional and made on first use, keyed by (peer, key): ``c<channel>``
for collectives, ``p<tag>`` for point-to-point. Each key belongs to a *lane* (a thread of
execution: collectives, p2p sends, p2p receives) whose doorbell the other side rings.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ... import config
from ...errors import RingflowSystemError
from . import doorbell
from .shm import Regions, ShmIn, ShmOut, segment_name
from .tcp import Listener, TcpIn, TcpOut, dial

LANE_COLL, LANE_SEND, LANE_RECV = 0, 1, 2
NSLOTS = 8  # NCCL_STEPS: slices in flight per connection


@dataclass(frozen=True)
class PeerCard:
    """What a rank publishes about itself in the store."""

    rank: int
    host_id: str
    address: str
    port: int
    pid: int

    def to_json(self) -> dict:
        return {"rank": self.rank, "host_id": self.host_id, "address": self.address, "port": self.port,
                "pid": self.pid}

    @classmethod
    def from_json(cls, d: dict) -> PeerCard:
        return cls(int(d["rank"]), str(d["host_id"]), str(d["address"]), int(d["port"]), int(d["pid"]))


def lane_of(key: str, sending: bool) -> int:
    """The lane that drives a connection key on the sending or receiving side."""
    if key.startswith("p"):
        return LANE_SEND if sending else LANE_RECV
    return LANE_COLL


class Transport:
    """Lazily built connections of one rank of one communicator."""

    def __init__(self, *, job: str, uid: str, rank: int, cards: list[PeerCard], secret: bytes,
                 tos: int | None, listener: Listener, shm_disabled: bool, buffsize: int) -> None:
        self.job, self.uid, self.rank, self.cards = job, uid, rank, cards
        self.secret, self.tos, self.listener = secret, tos, listener
        me = cards[rank]
        self.shm_peers = set() if shm_disabled else {c.rank for c in cards if c.host_id == me.host_id}
        self.shm_peers.discard(rank)
        self.local_ranks = 1 + len(self.shm_peers) if not shm_disabled else \
            sum(1 for c in cards if c.host_id == me.host_id)
        self.slot_bytes = max(4096, buffsize // NSLOTS)
        self._out: dict[tuple[int, str], ShmOut | TcpOut] = {}
        self._in: dict[tuple[int, str], ShmIn | TcpIn] = {}
        self._created: list[str] = []
        self.regions = Regions(self.region_prefix(rank))

    def region_prefix(self, rank: int) -> str:
        """Name prefix of `rank`'s comm.alloc segments."""
        return f"ringflow-{self.job}-{self.uid}-{rank}-a"

    def bell(self, rank: int, lane: int) -> bytes:
        """Doorbell address of `rank`'s `lane` in this communicator."""
        return doorbell.address(self.job, self.uid, rank, lane)

    def kind(self, peer: int) -> str:
        """'shm' or 'tcp'."""
        return "shm" if peer in self.shm_peers else "tcp"

    def out(self, peer: int, key: str, deadline: float) -> ShmOut | TcpOut:
        """The sending connection to peer for key (created on first use)."""
        c = self._out.get((peer, key))
        if c is not None:
            return c
        bell = self.bell(peer, lane_of(key, sending=False))
        if peer in self.shm_peers:
            name = segment_name(self.job, self.uid, self.rank, peer, key)
            c = ShmOut(name, NSLOTS, self.slot_bytes, peer, bell, self.regions,
                       spare_core=not doorbell.oversubscribed(self.local_ranks))
            self._created.append(name)
            doorbell.ring(bell)
        else:
            card = self.cards[peer]
            channel = int(key[1:]) if key[1:].lstrip("-").isdigit() else 0
            sock = dial((card.address, card.port), self.secret,
                        {"uid": self.uid, "rank": self.rank, "key": key}, self.tos,
                        min(deadline, time.monotonic() + 60.0), f"rank {peer}")
            c = TcpOut(sock, peer, channel & 0xFFFFFFFF)
        self._out[(peer, key)] = c
        return c

    def inn(self, peer: int, key: str) -> ShmIn | TcpIn:
        """The receiving connection from peer for key (opened when the peer's side appears)."""
        c = self._in.get((peer, key))
        if c is not None:
            return c
        if peer in self.shm_peers:
            c = ShmIn(segment_name(self.job, self.uid, peer, self.rank, key), peer,
                      self.bell(peer, lane_of(key, sending=True)), self.region_prefix(peer))
        else:
            c = TcpIn(self.listener, peer, key)
        self._in[(peer, key)] = c
        return c

    def cma_links(self) -> int:
        """Incoming shared-memory connections whose sender this rank proved it can read (single copy)."""
        from .shm import W_CMA
        return sum(1 for c in self._in.values() if isinstance(c, ShmIn) and c.m is not None and c.m.ctl[W_CMA] == 1)

    def flush(self, deadline: float, skip: set[int]) -> None:
        """Wait (until deadline) for same-host peers to consume what this rank sent them."""
        for (peer, _key), c in list(self._out.items()):
            if isinstance(c, ShmOut) and peer not in skip:
                while c.head > c.m.ctl[8] and time.monotonic() < deadline:
                    time.sleep(0.001)

    def close(self) -> None:
        """Close every connection and remove every segment name this rank created."""
        errors = []
        for c in list(self._out.values()) + list(self._in.values()):
            try:
                c.close()
            except OSError as exc:
                errors.append(exc)
        self._out.clear()
        self._in.clear()
        from .shm import unlink_quiet
        for name in self._created:
            unlink_quiet(name)
        self._created.clear()
        self.regions.close()
        if errors:
            raise RingflowSystemError(f"closing connections: {errors[0]}")


def buffsize() -> int:
    """RINGFLOW_BUFFSIZE in bytes."""
    return int(config.get("BUFFSIZE"))
