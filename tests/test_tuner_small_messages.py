"""The runtime's choice among the small-message paths follows its cost model, with no size constant in between.

For every rank count and small size, the schedule that runs is the candidate the model prices fastest (the model's
margin set to 1, so any predicted gain counts). As the model's price of a message rises, the chosen schedule never
handles more messages per rank (argument check included); as the price of a step rises, it never takes more steps:
where the choice moves between one step with a message per peer (one_shot), log-depth schedules (recursive doubling,
binomial) and sharded ones is the model's to say, not a size's."""
from __future__ import annotations

import pytest

from ringflow import config
from ringflow.algorithms import selection
from ringflow.algorithms.schedule import Collective, Schedule
from ringflow.hostmodel.features import F_MSGS, F_STEP, CacheSizes
from ringflow.hostmodel.model import HostCostModel, HostParams

AR, BC = Collective.ALL_REDUCE, Collective.BROADCAST
RANKS = (2, 3, 4, 8)
SIZES = (8, 4096)
PRICES_US = (0.0, 0.5, 2.0, 8.0)


def host_model(step_us: float, msg_us: float) -> HostCostModel:
    """A shared-memory host model of 8 cores pricing a step and a message as given (bytes cheap, as small messages
    are on any host)."""
    p = HostParams(call_us=1.0, step_us=step_us, msg_us=msg_us, copy_us_per_MiB=80.0, reduce_us_per_MiB=120.0)
    return HostCostModel("shm", p, 8, RANKS, CacheSizes(1 << 20, 32 << 20), margin=1.0)


def root(coll: Collective) -> int | None:
    return 0 if coll == BC else None


def decision(coll: Collective, nbytes: int, n: int, model: HostCostModel) -> selection.ModelDecision:
    return selection.model_decision(coll, nbytes, n, root(coll), 4, True, int(config.get("SINGLE_RING_THRESHOLD")),
                                    model)


def per_rank(model: HostCostModel, s: Schedule, nbytes: int, feature: int) -> float:
    """The most of one feature (messages, steps) any rank has in one call of `s`, its check exchange included."""
    f = model.features(s, selection.call_shape(s.collective, s.nranks, nbytes, 4), True)
    return float(f.steps[..., feature].sum(axis=0).max())


@pytest.mark.parametrize("coll", [AR, BC])
def test_the_schedule_that_runs_is_the_candidate_the_model_prices_fastest(coll: Collective) -> None:
    for prices in ((1.0, 0.1), (0.3, 2.0)):
        model = host_model(*prices)
        for n in RANKS:
            for nbytes in SIZES:
                d = decision(coll, nbytes, n, model)
                cheapest = min([d.flat_us] + [t for _, _, t in d.candidates])
                assert d.chosen_us == pytest.approx(cheapest), (prices, n, nbytes, d.chosen.algorithm)
                single = int(config.get("SINGLE_RING_THRESHOLD"))
                assert selection.pick_schedule(coll, nbytes, n, root(coll), 4, True, single, model) is d.chosen


@pytest.mark.parametrize("coll", [AR, BC])
def test_dearer_messages_never_choose_more_messages_and_dearer_steps_never_more_steps(coll: Collective) -> None:
    seen = set()
    for n in RANKS[1:]:
        for nbytes in SIZES:
            by_msg = [(m, decision(coll, nbytes, n, m).chosen) for m in (host_model(1.0, p) for p in PRICES_US)]
            msgs = [per_rank(m, s, nbytes, F_MSGS) for m, s in by_msg]
            assert msgs == sorted(msgs, reverse=True), (n, nbytes, [s.algorithm for _, s in by_msg], msgs)
            by_step = [(m, decision(coll, nbytes, n, m).chosen) for m in (host_model(p, 0.5) for p in PRICES_US)]
            steps = [per_rank(m, s, nbytes, F_STEP) for m, s in by_step]
            assert steps == sorted(steps, reverse=True), (n, nbytes, [s.algorithm for _, s in by_step], steps)
            seen |= {s.algorithm for _, s in by_msg + by_step}
    if coll == AR:   # the prices reach choices on both sides (a broadcast's binomial tree wins at every price)
        assert len(seen) > 2, seen
