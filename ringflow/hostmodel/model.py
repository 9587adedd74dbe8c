"""The host cost model: the time of one runtime collective call on this machine, from eleven named parameters.

    time_us = (call_us + sum over steps of max(slowest rank's price, price of all ranks' features / cores)) * sharing
    price(f) = step_us*[exchanges] + crowded_step_us*[exchanges]*crowding
               + msg_us*messages + peer_us*distinct peers
               + copy_us_per_MiB*memcpy MiB + kernel_us_per_MiB*(single-copy or socket) MiB
               + reduce_us_per_MiB*reduced MiB + l2_miss_us_per_MiB*MiB beyond the private cache
               + llc_miss_us_per_MiB*MiB beyond the shared cache
    sharing = 1 + core_share * crowding,   crowding = max(0, 1 - cores / ranks)

crowding is the share of a rank's peers that are off a core at any moment when ranks outnumber cores. The
features come from the runtime's compiled plans (`features.call_features`); the cache sizes and the core
count are read from the machine, not fitted. One parameter set per transport ('shm', 'tcp'); the shared-memory
model may carry a wake-up cost (`wakeup.WakeupCost`) for calls whose ranks arrive far apart, which a replay adds.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from ..algorithms.layout import CallShape
from ..algorithms.schedule import Schedule
from ..errors import ConfigError, InvalidArgument
from .features import FEATURES, TRANSPORTS, CacheSizes, CallFeatures, cache_sizes, call_features, crowding, host_cores
from .wakeup import WakeupCost

FORMAT = "ringflow-host-model"
VERSION = 1
# a model calibrated up to N ranks prices jobs of up to this many times N ranks (beyond: not supported)
EXTRAPOLATION_FACTOR = 2


@dataclass(frozen=True)
class HostParams:
    """The fitted parameters of one transport (times in microseconds; per-byte costs in us per MiB)."""

    call_us: float = 0.0              # fixed cost of one call: dispatch, binding, completion
    step_us: float = 0.0              # a step in which a rank exchanges messages: posting, handshake, wake-up
    crowded_step_us: float = 0.0      # a step's wait for descheduled peers, times the share of peers off a core
    msg_us: float = 0.0               # one message (or TCP stripe) sent or received: slot/frame header, flag
    peer_us: float = 0.0              # each distinct peer a rank talks to in a step: one more connection polled
    copy_us_per_MiB: float = 0.0      # memcpy: into and out of shared-memory slots, local copies, snapshots
    kernel_us_per_MiB: float = 0.0    # kernel copies: process_vm_readv single copy (shm), socket send/recv (tcp)
    reduce_us_per_MiB: float = 0.0    # elementwise reduction of received data into the destination
    l2_miss_us_per_MiB: float = 0.0   # extra for bytes touched beyond the core-private cache (working set / rank)
    llc_miss_us_per_MiB: float = 0.0  # extra for bytes touched beyond the shared last-level cache (all ranks)
    core_share: float = 0.0           # relative slowdown of the whole call, times the share of peers off a core

    @staticmethod
    def linear_names() -> tuple[str, ...]:
        """The parameters that enter the time linearly (all but core_share), in feature order after call_us."""
        return ("call_us", "step_us", "crowded_step_us", "msg_us", "peer_us", "copy_us_per_MiB", "kernel_us_per_MiB",
                "reduce_us_per_MiB", "l2_miss_us_per_MiB", "llc_miss_us_per_MiB")

    def theta(self) -> np.ndarray:
        """The per-feature prices (features.FEATURES order)."""
        return np.array([getattr(self, n) for n in self.linear_names()[1:]], dtype=float)

    def to_dict(self) -> dict[str, float]:
        """JSON form."""
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> HostParams:
        """From `to_dict` output (unknown keys are an error)."""
        names = {f.name for f in fields(cls)}
        bad = set(d) - names
        if bad:
            raise ConfigError(f"unknown host-model parameters {sorted(bad)}", "recalibrate: ringflow calibrate")
        return cls(**{k: float(v) for k, v in d.items()})


assert len(HostParams.linear_names()) - 1 == len(FEATURES)

PARAM_MEANINGS: dict[str, str] = {
    "call_us": "fixed cost of one call: dispatch, binding, completion",
    "step_us": "a step in which a rank exchanges messages: posting, handshake, wake-up",
    "crowded_step_us": "a step's wait for descheduled peers, times crowding = max(0, 1 - cores / ranks)",
    "msg_us": "one message (or TCP stripe) sent or received: slot or frame header, flag, poll",
    "peer_us": "each distinct peer a rank talks to in one step",
    "copy_us_per_MiB": "memcpy per MiB: into and out of shared-memory slots, local copies, snapshots",
    "kernel_us_per_MiB": "kernel copy per MiB: single-copy process_vm_readv (shm), socket send + receive (tcp)",
    "reduce_us_per_MiB": "elementwise reduction per MiB of received data",
    "l2_miss_us_per_MiB": "extra per MiB touched beyond the core-private cache (a rank's buffers)",
    "llc_miss_us_per_MiB": "extra per MiB touched beyond the shared last-level cache (all ranks' buffers)",
    "core_share": "relative slowdown of the whole call (cache and scheduler contention), times crowding",
}


def sharing_factor(nranks: int, cores: int, share: float) -> float:
    """How much slower a call runs when `nranks` ranks share `cores` cores (`features.crowding`)."""
    return 1.0 + share * crowding(nranks, cores)


@dataclass
class HostCostModel:
    """Predicts one runtime call's time (us) on this host over one transport; the runtime's CostModel."""

    transport: str
    params: HostParams
    cores: int
    calibrated_ranks: tuple[int, ...]
    caches: CacheSizes
    margin: float = 1.0
    fit_stats: dict = field(default_factory=dict)
    wakeup: WakeupCost | None = None    # extra cost of a call whose first rank slept waiting (None: not priced)

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise InvalidArgument(f"unknown transport {self.transport!r}", "use 'shm' or 'tcp'")
        if self.margin < 1.0:
            raise InvalidArgument(f"margin {self.margin} is below 1", "a margin is a ratio >= 1")
        self.calibrated_ranks = tuple(sorted(int(n) for n in self.calibrated_ranks))

    def supports(self, nranks: int) -> bool:
        """True for a job of `nranks` ranks on this host up to EXTRAPOLATION_FACTOR x the largest calibrated."""
        return bool(self.calibrated_ranks) and 1 <= nranks <= EXTRAPOLATION_FACTOR * max(self.calibrated_ranks)

    def features(self, schedule: Schedule, shape: CallShape, inplace: bool) -> CallFeatures:
        """The call's features on this host (this model's cores and caches)."""
        return call_features(schedule, shape, inplace, self.transport, self.cores, self.caches)

    def predict_features_us(self, feats: CallFeatures) -> float:
        """Predicted time (us) of a call from its features."""
        p = self.params
        return (p.call_us + feats.priced(p.theta())) * sharing_factor(feats.nranks, self.cores, p.core_share)

    def predict_us(self, schedule: Schedule, shape: CallShape, inplace: bool) -> float:
        """Predicted time (us) of one runtime call of `schedule` with `shape`."""
        return self.predict_features_us(self.features(schedule, shape, inplace))

    def to_dict(self) -> dict:
        """JSON form of this transport's model."""
        d = {"params": self.params.to_dict(), "margin": self.margin, "cores": self.cores,
             "calibrated_ranks": list(self.calibrated_ranks), "caches": self.caches.to_dict(), "fit": self.fit_stats}
        if self.wakeup is not None:
            d["wakeup"] = self.wakeup.to_dict()
        return d

    @classmethod
    def from_dict(cls, transport: str, d: dict) -> HostCostModel:
        """From `to_dict` output."""
        try:
            return cls(transport, HostParams.from_dict(d["params"]), int(d["cores"]),
                       tuple(d["calibrated_ranks"]), CacheSizes(**d["caches"]), float(d["margin"]),
                       dict(d.get("fit") or {}), WakeupCost.from_dict(d["wakeup"]) if d.get("wakeup") else None)
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"malformed host model for {transport}: {exc}",
                              "recalibrate: ringflow calibrate") from None

    def save(self, path: str) -> None:
        """Write (or update) this transport's entry of a host-model file."""
        doc = read_file(path) if os.path.exists(path) else new_document()
        doc["transports"][self.transport] = self.to_dict()
        write_file(path, doc)

    @classmethod
    def load(cls, path: str, transport: str) -> HostCostModel:
        """One transport's model from a host-model file."""
        doc = read_file(path)
        entry = doc["transports"].get(transport)
        if entry is None:
            raise ConfigError(f"{path} has no {transport} model (it has {sorted(doc['transports'])})",
                              f"calibrate with --transports {transport}")
        return cls.from_dict(transport, entry)


def new_document(meta: dict | None = None) -> dict:
    """An empty host-model file document."""
    return {"format": FORMAT, "version": VERSION, "cores": host_cores(), "caches": cache_sizes().to_dict(),
            "meta": dict(meta or {}), "transports": {}}


def read_file(path: str) -> dict:
    """A host-model file's document; ConfigError where it is not one."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read host model {path}: {exc}",
                          "write it with `ringflow calibrate -o FILE`") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "transports" not in doc:
        raise ConfigError(f"{path} is not a ringflow host model", "write it with `ringflow calibrate -o FILE`")
    if doc.get("version") != VERSION:
        raise ConfigError(f"{path} is host-model version {doc.get('version')}, this code reads {VERSION}",
                          "recalibrate: ringflow calibrate")
    return doc


def write_file(path: str, doc: dict) -> None:
    """Write a host-model document atomically."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
    os.replace(tmp, path)
