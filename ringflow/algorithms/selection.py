"""Which schedule the runtime runs for one call: the tuner's candidates, re-ranked, or priced by a cost model.

The tuner (`tuner.choose`) prices candidates with a flat alpha-beta line that treats local copies
and reductions as free. `flat_choice` re-prices its best candidates with the bytes each rank copies
and reduces locally (they run on the same cores and memory as the transfers). A `CostModel` (for
example the calibrated host model of `ringflow.hostmodel`) can price every candidate instead:
`model_decision` then runs the one it predicts fastest, where it beats the flat choice by more than
the model's own `margin` (its relative error: a smaller predicted gain is within what it cannot tell).
Every rank computes the same answer from the same inputs, so ranks agree without talking.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast, runtime_checkable

from .. import config
from ..errors import InvalidArgument
from . import check_rounds, registry, staging, tuner
from .cost import DEFAULT_ALPHA_US, DEFAULT_BETA_GBPS, DEFAULT_MSG_US, schedule_cost, traffic
from .layout import CallShape
from .plan import compile_plan
from .schedule import Collective, OpKind, Schedule
from .verify_messages import missing, opens_with_check, verifiable

RERANK_TOP = 6  # the tuner's best candidates re-priced with their local copy cost


@runtime_checkable
class CostModel(Protocol):
    """What the runtime needs of a model that prices its calls (e.g. `ringflow.hostmodel.HostCostModel`)."""

    margin: float

    def supports(self, nranks: int) -> bool:
        """True if the model was calibrated for a job of `nranks` ranks."""
        ...

    def predict_us(self, schedule: Schedule, shape: CallShape, inplace: bool) -> float:
        """Predicted time (us) of one runtime call of `schedule` with this shape."""
        ...


_LOCAL_BYTES: dict[tuple[int, CallShape, bool, bool, bool], tuple[Schedule, int]] = {}
_LOCAL_BYTES_MAX = 4096


def local_copy_bytes(schedule: Schedule, shape: CallShape, inplace: bool = False) -> int:
    """Max over ranks of the bytes a rank's local work touches outside the transfers: COPY and REDUCE ops
    (a reduce counted 1.5x: 2 reads, 1 write) and the snapshot copies of sends whose source a receive of
    the same step overwrites (in-place calls). Cached per schedule object, shape, in-place-ness and
    RINGFLOW_RECEIVER_CHECK (which decides the verify messages the plans carry)."""
    key = (id(schedule), shape, inplace, bool(config.get("RECEIVER_CHECK")), check_rounds.log_depth(schedule.nranks))
    hit = _LOCAL_BYTES.get(key)
    if hit is not None and hit[0] is schedule:
        return hit[1]
    worst = 0
    for r in range(schedule.nranks):
        plan = compile_plan(schedule, shape, r, inplace)
        tot = 0.0
        for step in plan.steps:
            for lo in step.locals:
                tot += lo.n * shape.itemsize * (1.0 if lo.kind == OpKind.COPY else 1.5)
            for x in step.xfers:
                if x.snapshot:
                    tot += x.nbytes
        worst = max(worst, int(tot))
    if len(_LOCAL_BYTES) >= _LOCAL_BYTES_MAX:
        _LOCAL_BYTES.clear()
    _LOCAL_BYTES[key] = (schedule, worst)
    return worst


def call_shape(coll: Collective, nranks: int, nbytes: int, dtype_size: int) -> CallShape:
    """The shape of a call moving `nbytes` (per-rank collectives: `nbytes` over all ranks)."""
    return CallShape(coll, nranks, tuner.count_for(coll, nbytes, nranks, dtype_size), dtype_size)


def candidate_pool(choice: tuner.Choice, single_channel: bool) -> list[tuner.Candidate]:
    """The tuner's candidates the runtime may run (below RINGFLOW_SINGLE_RING_THRESHOLD: one-channel ones)."""
    pool = [c for c in choice.candidates if c.nchannels == 1] if single_channel else list(choice.candidates)
    return pool or list(choice.candidates)


def candidate_schedule(choice: tuner.Choice, cand: tuner.Candidate, coll: Collective, nranks: int,
                       root: int | None) -> Schedule:
    """The schedule of one tuner candidate (its segments and channels)."""
    return registry.get_schedule(coll, cand.algorithm, nranks, root=root, nsegs=cand.nsegs,
                                 nchannels=cand.nchannels, rings=choice.rings if cand.nchannels > 1 else None)


def variants(schedule: Schedule) -> list[Schedule]:
    """The ways to run one candidate: as written and, where the argument check would otherwise open the call
    with a CHECK exchange, with its first step staged (`staging.staged`: one copy of the first step's
    receives instead of a round before the data)."""
    st = staging.staged(schedule) if opens_with_check(schedule) else None
    return [schedule] if st is None else [schedule, st]


def check_messages(schedule: Schedule) -> tuple[int, int]:
    """(steps, messages) the argument check adds to a call of `schedule`: under the log-depth pattern its rounds
    (`check_rounds.check_cost`); else the CHECK exchange (one step in which every rank sends to and receives from
    every peer), or the verify messages completing its first step (the most messages any rank then handles in
    that step, less the most before; a step if that one moved no data); (0, 0) for a self-checking one."""
    n = schedule.nranks
    if check_rounds.log_depth(n):
        return check_rounds.check_cost(schedule)
    if opens_with_check(schedule):
        return 1, 2 * (n - 1)
    if not verifiable(schedule):
        return 0, 0
    before = [sum(1 for op in schedule.steps(r)[0] if op.peer is not None) for r in range(n)]
    after = [k + sum(map(len, missing(schedule, r))) for r, k in enumerate(before)]
    return (0 if max(before) else 1), max(after) - max(before)   # a first step with no data becomes one


def call_messages(schedule: Schedule, shape: CallShape) -> tuple[int, int]:
    """(steps, messages) of one runtime call of `schedule`: the schedule's steps that move data and the sum over
    steps of the most messages any rank sends + receives, the argument check's included (`check_messages`)."""
    tr = traffic(schedule, shape)
    steps, msgs = check_messages(schedule)
    return tr.steps + steps, tr.messages + msgs


def check_price_s(schedule: Schedule) -> float:
    """The flat tuner's price of the argument check of a call of `schedule`: its steps and messages
    (`check_messages`) at the tuner's per-step and per-message figures (0 if it checks itself)."""
    steps, msgs = check_messages(schedule)
    return (steps * DEFAULT_ALPHA_US + msgs * DEFAULT_MSG_US) * 1e-6


def flat_choice(choice: tuner.Choice, coll: Collective, nranks: int, root: int | None, nbytes: int,
                dtype_size: int, single_channel: bool = False, inplace: bool = False) -> Schedule:
    """The cheapest of the tuner's RERANK_TOP best candidates (each as written and staged, `variants`) once each
    is charged its local copies and reductions at the shared-memory bandwidth the tuner assumes
    (`cost.DEFAULT_BETA_GBPS`) and its argument check's steps and messages (`check_price_s`)."""
    cands = sorted(candidate_pool(choice, single_channel), key=lambda c: c.time_s)[:RERANK_TOP]
    shape = call_shape(coll, nranks, nbytes, dtype_size)
    best: Schedule | None = None
    best_t = float("inf")
    for c in cands:
        for s in variants(candidate_schedule(choice, c, coll, nranks, root)):
            t = c.time_s + local_copy_bytes(s, shape, inplace) / (DEFAULT_BETA_GBPS * 1e9) + check_price_s(s)
            if t < best_t:
                best, best_t = s, t
    if best is None:
        raise RuntimeError(f"the tuner offered no candidate for {coll.value} on {nranks} ranks")
    return best


@dataclass(frozen=True)
class FlatCostModel:
    """The flat tuner's pricing as a `CostModel`: per step `alpha_us`, per message a rank sends or receives
    `msg_us`, bytes at `beta_GBps`, local copies and reductions at the same bandwidth, the argument check's steps
    and messages included (the single-host defaults of `algorithms.cost` unless given)."""

    alpha_us: float = DEFAULT_ALPHA_US
    msg_us: float = DEFAULT_MSG_US
    beta_GBps: float = DEFAULT_BETA_GBPS
    margin: float = 1.0

    def __post_init__(self) -> None:
        if min(self.alpha_us, self.msg_us) < 0 or self.beta_GBps <= 0 or self.margin < 1.0:
            raise InvalidArgument(f"FlatCostModel(alpha_us={self.alpha_us}, msg_us={self.msg_us}, "
                                  f"beta_GBps={self.beta_GBps}, margin={self.margin})",
                                  "need alpha_us >= 0, msg_us >= 0, beta_GBps > 0 and margin >= 1")

    def supports(self, nranks: int) -> bool:
        """Any rank count: the flat model has no calibrated range."""
        return nranks >= 1

    def predict_us(self, schedule: Schedule, shape: CallShape, inplace: bool) -> float:
        """Predicted time (us) of one call of `schedule`: its steps, messages, bytes, local work and check."""
        c = schedule_cost(schedule, shape, alpha_us=self.alpha_us, msg_us=self.msg_us, beta_GBps=self.beta_GBps)
        steps, msgs = check_messages(schedule)
        return (c.time_s * 1e6 + steps * self.alpha_us + msgs * self.msg_us
                + local_copy_bytes(schedule, shape, inplace) / (self.beta_GBps * 1e3))


@dataclass(frozen=True)
class ModelDecision:
    """One call's choice on a cost model: the flat choice and its price, every candidate with its price,
    and the schedule that runs."""

    flat: Schedule
    flat_us: float
    candidates: tuple[tuple[tuner.Candidate, Schedule, float], ...]
    chosen: Schedule

    @property
    def chosen_us(self) -> float:
        """The predicted time of the schedule that runs."""
        if self.chosen is self.flat:
            return self.flat_us
        return next(t for _, s, t in self.candidates if s is self.chosen)


def decide(flat: Schedule, pool: Sequence[tuner.Candidate], schedules: Sequence[Schedule], shape: CallShape,
           inplace: bool, model: CostModel) -> ModelDecision:
    """The candidate `model` prices fastest where it beats `flat` by more than `model.margin`, else `flat`
    (ties: the earlier candidate, so every rank agrees)."""
    t_flat = model.predict_us(flat, shape, inplace)
    times = [model.predict_us(s, shape, inplace) for s in schedules]
    chosen = flat
    if times:
        i = min(range(len(times)), key=lambda k: (times[k], k))
        if t_flat > max(1.0, model.margin) * times[i]:
            chosen = schedules[i]
    return ModelDecision(flat, t_flat, tuple(zip(pool, schedules, times, strict=True)), chosen)


MAX_DECISIONS = 4096  # priced call shapes kept per cost model (each prices a dozen candidates)
_DECISIONS: dict[int, tuple[CostModel | None, dict[tuple[object, ...], object]]] = {}
_DECISIONS_LOCK = threading.Lock()
V = TypeVar("V")


def _cached(model: CostModel | None, key: tuple[object, ...], make: Callable[[], V]) -> V:
    """The decision for `key` on `model` (None: the flat pricing), computed once (groups of a job sharing one model
    price a call once)."""
    with _DECISIONS_LOCK:
        entry = _DECISIONS.get(id(model))
        if entry is None or entry[0] is not model:
            entry = (model, {})
            _DECISIONS[id(model)] = entry
        hit = entry[1].get(key)
    if hit is None:
        hit = make()
        with _DECISIONS_LOCK:
            if len(entry[1]) >= MAX_DECISIONS:
                entry[1].clear()
            entry[1][key] = hit
    return cast(V, hit)


def model_decision(coll: Collective, nbytes: int, nranks: int, root: int | None, dtype_size: int, inplace: bool,
                   single_ring_bytes: int, model: CostModel) -> ModelDecision:
    """What the runtime decides for one call priced on `model`, with every price (cached per call)."""
    choice = tuner.choose(coll, nbytes, nranks, dtype_size=dtype_size, root=root)

    def price() -> ModelDecision:
        single = nbytes < single_ring_bytes
        flat = flat_choice(choice, coll, nranks, root, nbytes, dtype_size, single_channel=single, inplace=inplace)
        pairs = [(c, v) for c in candidate_pool(choice, single)
                 for v in variants(candidate_schedule(choice, c, coll, nranks, root))]
        pool, scheds = [c for c, _ in pairs], [v for _, v in pairs]
        return decide(flat, pool, scheds, call_shape(coll, nranks, nbytes, dtype_size), inplace, model)
    return _cached(model, (coll, nbytes, nranks, root, dtype_size, inplace, single_ring_bytes, check_rounds.current()),
                   price)


def pick_schedule(coll: Collective, nbytes: int, nranks: int, root: int | None, dtype_size: int, inplace: bool,
                  single_ring_bytes: int, model: CostModel | None = None) -> Schedule:
    """The schedule the runtime runs for one call: `flat_choice`, or with a cost `model` its `model_decision`."""
    tc = Collective.ALL_TO_ALL if coll == Collective.ALL_TO_ALLV else coll
    choice = tuner.choose(tc, nbytes, nranks, dtype_size=dtype_size, root=root)
    if coll == Collective.ALL_TO_ALLV:
        names = registry.algorithms_for(coll)
        algo = choice.algorithm if choice.algorithm in names else names[0]
        return registry.get_schedule(coll, algo, nranks, root=root)
    if model is not None:
        return model_decision(coll, nbytes, nranks, root, dtype_size, inplace, single_ring_bytes, model).chosen
    return flat_choice(choice, coll, nranks, root, nbytes, dtype_size, single_channel=nbytes < single_ring_bytes,
                       inplace=inplace)


# the calls whose time the argument check's pattern sets: one element (per rank block) of each collective
PATTERN_CALLS = (Collective.ALL_REDUCE, Collective.BROADCAST, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
                 Collective.ALL_TO_ALL)


def _smallest_call_us(coll: Collective, nranks: int, model: CostModel | None) -> float:
    """The predicted time of the smallest call of `coll` on `nranks` ranks as the best of the tuner's RERANK_TOP
    candidates (each as written and staged, `variants`) prices under the current check pattern: by `model`, or
    without one at the flat tuner's figures and check price (`check_price_s`; one element's local copies are
    nothing to price)."""
    root = 0 if coll.has_root else None
    nbytes = 4 if coll in (Collective.ALL_REDUCE, Collective.BROADCAST) else 4 * nranks
    choice = tuner.choose(coll, nbytes, nranks, dtype_size=4, root=root)
    shape = call_shape(coll, nranks, nbytes, 4)
    best = float("inf")
    for c in sorted(candidate_pool(choice, True), key=lambda c: c.time_s)[:RERANK_TOP]:
        for s in variants(candidate_schedule(choice, c, coll, nranks, root)):
            t = model.predict_us(s, shape, False) if model is not None else (c.time_s + check_price_s(s)) * 1e6
            best = min(best, t)
    return best


def pattern_prices_us(nranks: int, model: CostModel | None = None) -> dict[str, float]:
    """Per check pattern (`check_rounds.PATTERNS`), the summed predicted time of the smallest call of each of
    PATTERN_CALLS on `nranks` ranks (`_smallest_call_us`)."""
    out: dict[str, float] = {}
    for pattern in check_rounds.PATTERNS:
        with check_rounds.using(pattern):
            out[pattern] = sum(_smallest_call_us(coll, nranks, model) for coll in PATTERN_CALLS)
    return out


def pattern_for(nranks: int, model: CostModel | None = None, knob: str | None = None) -> str:
    """The argument check's pattern for a communicator of `nranks` ranks (`check_rounds`): `knob` (default
    RINGFLOW_CHECK_ROUNDS) where it names one, else pairs unless `pattern_prices_us` prices the log-depth rounds
    faster by more than the model's `margin` (its own error, as `decide` asks of a schedule; 1 for the flat
    pricing), remembered per rank count and model. Every rank computes the same answer from the same model."""
    if nranks < check_rounds.MIN_RANKS or config.get("CHECKS_DISABLE"):
        return "pairs"
    forced = str(config.get("CHECK_ROUNDS") if knob is None else knob)
    if forced != "auto":
        return forced

    def price() -> str:
        prices = pattern_prices_us(nranks, model)
        margin = max(1.0, model.margin) if model is not None else 1.0
        return "log" if prices["log"] * margin < prices["pairs"] else "pairs"
    return _cached(model, ("check pattern", nranks, bool(config.get("RECEIVER_CHECK")), config.get("ALGO")), price)
