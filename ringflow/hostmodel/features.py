"""Per-call features of one runtime collective call, read from the runtime's own compiled plans.

For every step of a call and every rank, a vector of what that rank does in the step (see `FEATURES`):
whether it exchanges messages at all (and, where ranks outnumber cores, the share of its peers that are
off a core at a time, `crowding`: such a step waits for them to be scheduled), how many messages and
distinct peers it handles, and the bytes it moves by each mechanism the transport uses (memcpy through
shared-memory slots, single-copy kernel reads, socket copies, reductions), plus the share of those bytes
that fall outside the private and the shared cache. The cost model prices a call as the sum over steps of
the slowest rank's priced vector, or of all ranks' vectors pooled on the cores where that is more.

Which mechanism a message takes follows the transports' own rules (their constants are imported, not
copied): shared-memory messages from the single-copy size up are read by the receiver with
`process_vm_readv` (`protocol.CMA_COPY_MIN_BYTES` where the receiver copies a source the sender has not just
written, `protocol.CMA_MIN_BYTES` otherwise); TCP messages from `executor.STRIPE_MIN_BYTES` up are striped over
the communicator's streams; a schedule that does not check itself (or that may stripe) runs a check
exchange with every peer before its data moves, or under the log-depth pattern (`check_rounds`) its rounds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..algorithms import check_rounds
from ..algorithms.layout import CallShape
from ..algorithms.plan import Plan, compile_plan
from ..algorithms.schedule import Buffer, OpKind, Schedule
from ..errors import InvalidArgument
from ..runtime.call.executor import STRIPE_MIN_BYTES, stripes
from ..runtime.transport import protocol

TRANSPORTS = ("shm", "tcp")
MiB = float(2**20)

# one column per feature; the cost model has one parameter per column (model.PARAMS)
FEATURES = ("step", "crowded_step", "msgs", "peers", "copy_MiB", "kernel_MiB", "reduce_MiB", "l2_miss_MiB",
            "llc_miss_MiB")
F_STEP, F_CROWDED, F_MSGS, F_PEERS, F_COPY, F_KERNEL, F_REDUCE, F_L2, F_LLC = range(len(FEATURES))


def tcp_streams() -> int:
    """Streams a large TCP transfer is striped over (the communicator's constant, or RINGFLOW_NCHANNELS)."""
    from .. import config
    from ..runtime.call.communicator import TCP_STREAMS
    knob = int(config.get("NCHANNELS") or 0)
    return knob if knob > 0 else TCP_STREAMS


@dataclass(frozen=True)
class CacheSizes:
    """This machine's cache sizes (bytes), read from sysfs: the private cache of a core and the shared last level."""

    private_bytes: int
    shared_bytes: int

    def to_dict(self) -> dict[str, int]:
        """JSON form."""
        return {"private_bytes": self.private_bytes, "shared_bytes": self.shared_bytes}


def _parse_cache_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * mult


@lru_cache(maxsize=1)
def cache_sizes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> CacheSizes:
    """The largest core-private cache and the last-level cache of cpu0 (defaults where sysfs is missing)."""
    private, shared = 0, 0
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        entries = []
    for e in entries:
        if not e.startswith("index"):
            continue
        try:
            with open(os.path.join(root, e, "type")) as fh:
                kind = fh.read().strip()
            with open(os.path.join(root, e, "size")) as fh:
                size = _parse_cache_size(fh.read())
            with open(os.path.join(root, e, "shared_cpu_list")) as fh:
                cpus = fh.read().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        if "-" in cpus or "," in cpus:
            shared = max(shared, size)
        else:
            private = max(private, size)
    return CacheSizes(private or 2**20, shared or max(private, 2**20) * 8)


def crowding(nranks: int, cores: int) -> float:
    """The share of a rank's peers that are off a core at any moment when `nranks` ranks share `cores` cores
    (0 where every rank has a core): a step that needs them waits for the scheduler in that proportion."""
    return max(0.0, 1.0 - max(1, cores) / max(1, nranks))


def host_cores() -> int:
    """Cores this process may run on (the machine's ranks share them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class CallFeatures:
    """One call's features: `steps[s, r, k]` = feature k of rank r in step s (check exchange included).

    A step lasts as long as its slowest rank, or, where the ranks' work exceeds the cores, as long as the
    cores take to run all of it (the sum over ranks divided by `cores`), whichever is longer."""

    steps: np.ndarray
    nranks: int
    cores: int = 1

    def _candidates(self) -> np.ndarray:
        """Per step, every rank's features plus the all-ranks-share-the-cores row (last)."""
        pooled = self.steps.sum(axis=1, keepdims=True) / max(1, self.cores)
        return np.concatenate((self.steps, pooled), axis=1)

    def priced(self, theta: np.ndarray) -> float:
        """Sum over steps of the step's critical (slowest rank or pooled) priced features."""
        if self.steps.size == 0:
            return 0.0
        return float((self._candidates() @ theta).max(axis=1).sum())

    def critical(self, theta: np.ndarray) -> np.ndarray:
        """Per feature, the sum over steps of the critical row's feature under prices `theta`."""
        if self.steps.size == 0:
            return np.zeros(len(FEATURES))
        c = self._candidates()
        idx = (c @ theta).argmax(axis=1)
        return c[np.arange(c.shape[0]), idx].sum(axis=0)


def _buffer_bytes(schedule: Schedule, shape: CallShape, plan: Plan, rank: int, inplace: bool) -> int:
    isz = shape.itemsize
    n = shape.buffer_count(Buffer.OUT, rank)
    if not inplace:
        n += shape.buffer_count(Buffer.IN, rank)
    return (n + plan.scratch_elems) * isz


def _uses_kernel_copy(x_nbytes: int, cold_copy: bool, lone: bool, spare_core: bool) -> bool:
    """Whether the shared-memory transport hands this send over by address (single copy by the receiver)."""
    if x_nbytes < protocol.ZERO_COPY_MIN_BYTES:
        return False
    if lone and spare_core and x_nbytes >= protocol.PIPELINE_MIN_BYTES:
        return False
    return x_nbytes >= (protocol.CMA_COPY_MIN_BYTES if cold_copy else protocol.CMA_MIN_BYTES)


def call_features(schedule: Schedule, shape: CallShape, inplace: bool, transport: str,
                  cores: int | None = None, caches: CacheSizes | None = None) -> CallFeatures:
    """The features of one call of `schedule` with `shape` over `transport` ('shm' or 'tcp')."""
    if transport not in TRANSPORTS:
        raise InvalidArgument(f"unknown transport {transport!r}", "use 'shm' or 'tcp'")
    n = schedule.nranks
    if shape.nranks != n:
        raise InvalidArgument(f"shape is for {shape.nranks} ranks, schedule for {n}")
    cores = cores or host_cores()
    caches = caches or cache_sizes()
    plans = [compile_plan(schedule, shape, r, inplace) for r in range(n)]
    nsteps = max((len(p.steps) for p in plans), default=0)
    striped = transport == "tcp" and tcp_streams() > 1 and max(p.max_xfer_bytes for p in plans) >= STRIPE_MIN_BYTES
    checked = n > 1 and not (plans[0].self_checking and (plans[0].check_rounds or not striped))   # as needs_check
    log = check_rounds.log_depth(n)
    off = (check_rounds.rounds(n) if log else 1) if checked else 0
    out = np.zeros((nsteps + off, n, len(FEATURES)))
    if checked:   # the check's rounds (one send and one receive each) or its exchange with every peer
        out[:off, :, F_STEP] = 1.0
        out[:off, :, F_MSGS] = 2.0 if log else 2.0 * (n - 1)
        out[:off, :, F_PEERS] = [[len(set(check_rounds.round_peers(n, 0, k)))] for k in range(off)] if log else n - 1
    spare = n <= cores
    streams = tcp_streams()
    isz = shape.itemsize
    ws = [_buffer_bytes(schedule, shape, p, r, inplace) for r, p in enumerate(plans)]
    llc_miss = max(0.0, 1.0 - caches.shared_bytes / max(1, sum(ws)))
    for r, plan in enumerate(plans):
        l2_miss = max(0.0, 1.0 - caches.private_bytes / max(1, ws[r]))
        for si, st in enumerate(plan.steps):
            row = out[si + off]
            peers = set()
            for x in st.xfers:
                peers.add(x.peer)
                row[r, F_STEP] = 1.0
                if x.kind != OpKind.SEND:
                    continue
                p = x.peer
                reduces = not (x.cold_copy or x.fresh)
                if x.snapshot:
                    row[r, F_COPY] += x.nbytes
                if transport == "tcp":
                    k = len(stripes(x.nbytes, isz, streams))
                    row[r, F_MSGS] += k
                    row[p, F_MSGS] += k
                    row[r, F_KERNEL] += x.nbytes
                    row[p, F_KERNEL] += x.nbytes
                    if reduces:
                        row[p, F_REDUCE] += x.nbytes
                    continue
                row[r, F_MSGS] += 1
                row[p, F_MSGS] += 1
                if _uses_kernel_copy(x.nbytes, x.cold_copy, x.lone, spare):
                    row[p, F_KERNEL] += x.nbytes
                    if reduces:
                        row[p, F_REDUCE] += x.nbytes
                else:
                    row[r, F_COPY] += x.nbytes
                    row[p, F_REDUCE if reduces else F_COPY] += x.nbytes
            row[r, F_PEERS] = len(peers)
            for lo in st.locals:
                row[r, F_COPY if lo.kind == OpKind.COPY else F_REDUCE] += lo.n * isz
        touched = out[off:, r, F_COPY] + out[off:, r, F_KERNEL] + out[off:, r, F_REDUCE]
        out[off:, r, F_L2] = touched * l2_miss
        out[off:, r, F_LLC] = touched * llc_miss
    out[:, :, F_CROWDED] = out[:, :, F_STEP] * crowding(n, cores)
    out[:, :, F_COPY:] /= MiB
    return CallFeatures(out, n, cores)
