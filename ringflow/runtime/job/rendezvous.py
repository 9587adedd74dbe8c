"""Joining a job: the store, the job's shared state, and the identity of this host.

`join` reads the launcher's environment (or explicit arguments), starts or reaches the rendezvous
store, and returns what every communicator of the job shares (`SharedState`) with the namespace of
this generation of the job (ranks that re-join after a failure get a new one).
"""
from __future__ import annotations

import os
import socket
import threading

from ... import config
from ...errors import InvalidArgument, RingflowError, RingflowSystemError, Timeout
from .. import logs
from . import auth
from .env import detect
from .store import PortInUse, Store, StoreServer

IN_USE_PROBE_S = 2.0   # rank 0 finds its store port taken: how long what holds it has to answer as the store


def host_id() -> str:
    """Identity of this host *and network namespace*: ranks with equal ids share memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = "?"
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = 0
    return f"{socket.gethostname()}|{boot}|{netns}"




class SharedState:
    """What a communicator and the groups split from it share: store, job, secret, options."""

    def __init__(self, store: Store, server: StoreServer | None, job: str, secret: bytes, timeout_s: float,
                 tos: int | None) -> None:
        self.store, self.server, self.job, self.secret = store, server, job, secret
        self.timeout_s, self.tos = timeout_s, tos
        self.users = 0
        self.lock = threading.Lock()


def join(rank: int | None = None, world_size: int | None = None, store_addr: str | None = None, *,
         timeout: float | None = None, traffic_class: int | None = None,
         secret: str | None = None) -> tuple[SharedState, str, int, int]:
    """Join (or start) a job: its shared state, the world namespace, this rank and the world size;
    arguments default to the launcher's environment."""
    info = detect(rank, world_size, store_addr, secret)
    logs.setup(info.rank)
    timeout_s = float(config.get("TIMEOUT") if timeout is None else timeout)
    tos = config.get("TRAFFIC_CLASS") if traffic_class is None else int(traffic_class)
    if tos is not None and not -1 <= tos <= 255:
        raise InvalidArgument(f"traffic_class={tos}", "an IP TOS byte 0..255 (DSCP << 2), or -1 for unset")
    tos = None if tos is None or tos < 0 else tos
    sec = auth.secret_bytes(info.secret)
    server = None
    in_use: PortInUse | None = None
    host, port = info.store_host, info.store_port
    if info.rank == 0 and port == 0:
        server = StoreServer(host, port, sec)
        host, port = server.address
    elif info.rank == 0:
        try:
            server = StoreServer(host, port, sec)
        except PortInUse as exc:
            in_use = exc  # somebody (the launcher, `ringflow store`) already serves it, or another program holds it
        except RingflowSystemError:
            pass  # not an address of this host: the store runs elsewhere
    if in_use is None:
        store = Store(host, port, sec, timeout=timeout_s)
    else:  # what holds the port listens now: a ringflow store answers at once
        try:
            store = Store(host, port, sec, timeout=timeout_s, connect_timeout=min(timeout_s, IN_USE_PROBE_S))
        except (RingflowSystemError, Timeout) as exc:
            why = getattr(exc, "message", exc)
            raise RingflowSystemError(f"{in_use.message}, and what listens there is not this job's store ({why})",
                                      in_use.hint) from None
    try:
        arrivals = store.add(f"ringflow/{info.job_id}/arrivals", 1)
    except RingflowError:
        store.close()
        raise
    gen = (arrivals - 1) // info.world_size
    return SharedState(store, server, info.job_id, sec, timeout_s, tos), f"{info.job_id}.g{gen}", info.rank, \
        info.world_size
