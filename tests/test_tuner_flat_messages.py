"""The flat cost model prices each message a rank sends or receives (LogGP's o) beside each step, and the runtime's
default choice among the small-message schedules follows it: as a message gets dearer the chosen schedule never
handles more messages per rank, as a step gets dearer it never takes more steps, with no size constant in between.
The argument check is priced with the same figures: its CHECK exchange or verify messages give every rank a message
from and to every peer, which is what keeps one_shot the cheapest small all-reduce while the check is on."""
from __future__ import annotations

import pytest

from ringflow import config
from ringflow.algorithms import cost, registry, selection
from ringflow.algorithms.layout import CallShape
from ringflow.algorithms.schedule import Collective, Schedule
from ringflow.errors import InvalidArgument
from ringflow.hostmodel.features import F_MSGS, F_STEP, CacheSizes
from ringflow.hostmodel.model import HostCostModel, HostParams

AR, BC = Collective.ALL_REDUCE, Collective.BROADCAST
RANKS = (3, 4, 8, 16)
SIZES = (8, 4096)
PRICES_US = (0.0, 0.25, 1.0, 4.0, 16.0)
SINGLE = int(config.get("SINGLE_RING_THRESHOLD"))


def root(coll: Collective) -> int | None:
    return 0 if coll.has_root else None


def chosen(coll: Collective, nbytes: int, n: int, model: selection.FlatCostModel) -> Schedule:
    return selection.model_decision(coll, nbytes, n, root(coll), 4, True, SINGLE, model).chosen


def counts(s: Schedule, nbytes: int) -> tuple[int, int]:
    return selection.call_messages(s, selection.call_shape(s.collective, s.nranks, nbytes, 4))


def test_a_step_costs_alpha_plus_o_per_message_of_its_busiest_rank() -> None:
    n, shape = 8, CallShape(AR, 8, 2)
    one = cost.schedule_cost(registry.get_schedule(AR, "one_shot", n), shape, alpha_us=1.0, msg_us=0.5,
                             beta_GBps=1e9)
    assert one.messages == 2 * (n - 1) and one.time_s == pytest.approx((1.0 + 0.5 * 2 * (n - 1)) * 1e-6)
    rd = cost.schedule_cost(registry.get_schedule(AR, "recursive_doubling", n), shape, alpha_us=1.0, msg_us=0.5,
                            beta_GBps=1e9)
    assert rd.steps == 3 and rd.messages == 6 and rd.time_s == pytest.approx(3 * (1.0 + 0.5 * 2) * 1e-6)
    free = cost.schedule_cost(registry.get_schedule(AR, "one_shot", n), shape, alpha_us=1.0, msg_us=0.0,
                              beta_GBps=1e9)
    assert free.time_s == pytest.approx(1e-6)


def test_the_check_adds_a_message_to_and_from_every_peer() -> None:
    for n in RANKS:
        for coll in (AR, BC):
            for algo in registry.algorithms_for(coll):
                if algo == "hierarchical":
                    continue
                s = registry.get_schedule(coll, algo, n, root=root(coll))
                for v in selection.variants(s):
                    steps, msgs = counts(v, 8)
                    assert msgs >= 2 * (n - 1), (coll, algo, n, steps, msgs)
                    with config.override(CHECKS_DISABLE=True, RECEIVER_CHECK=False):
                        assert selection.check_messages(v) == (0, 0)
                        assert counts(v, 8) <= (steps, msgs)


@pytest.mark.parametrize("checks", [True, False], ids=["check-on", "check-off"])
@pytest.mark.parametrize("coll", [AR, BC])
def test_dearer_messages_never_choose_more_messages_and_dearer_steps_never_more_steps(coll: Collective,
                                                                                      checks: bool) -> None:
    seen = set()
    with config.override(CHECKS_DISABLE=not checks, RECEIVER_CHECK=checks):
        for n in RANKS:
            for nbytes in SIZES:
                by_msg = [chosen(coll, nbytes, n, selection.FlatCostModel(alpha_us=1.0, msg_us=p)) for p in PRICES_US]
                msgs = [counts(s, nbytes)[1] for s in by_msg]
                assert msgs == sorted(msgs, reverse=True), (n, nbytes, [s.algorithm for s in by_msg], msgs)
                by_step = [chosen(coll, nbytes, n, selection.FlatCostModel(alpha_us=p, msg_us=0.5)) for p in PRICES_US]
                steps = [counts(s, nbytes)[0] for s in by_step]
                assert steps == sorted(steps, reverse=True), (n, nbytes, [s.algorithm for s in by_step], steps)
                seen |= {s.algorithm for s in by_msg + by_step}
    if coll == AR and not checks:   # without the check a dear message moves the choice off one_shot
        assert "one_shot" in seen and len(seen) > 1, seen


def test_without_the_check_a_dear_message_prefers_log_steps_to_one_fan_out_step() -> None:
    with config.override(CHECKS_DISABLE=True, RECEIVER_CHECK=False):
        for n in (8, 16):
            cheap = chosen(AR, 8, n, selection.FlatCostModel(alpha_us=1.0, msg_us=0.0))
            dear = chosen(AR, 8, n, selection.FlatCostModel(alpha_us=1.0, msg_us=1.0))
            assert counts(cheap, 8) == (1, 2 * (n - 1))
            assert counts(dear, 8)[1] < 2 * (n - 1) and counts(dear, 8)[0] > 1


def test_the_runtime_default_runs_the_flat_models_cheapest_candidate() -> None:
    model = selection.FlatCostModel()
    for coll in (AR, BC):
        for n in (2, *RANKS):
            for nbytes in SIZES:
                s = selection.pick_schedule(coll, nbytes, n, root(coll), 4, True, SINGLE)
                d = selection.model_decision(coll, nbytes, n, root(coll), 4, True, SINGLE, model)
                shape = selection.call_shape(coll, n, nbytes, 4)
                assert model.predict_us(s, shape, True) == pytest.approx(d.chosen_us), (coll, n, nbytes)


def test_a_flat_model_with_a_negative_price_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="msg_us >= 0"):
        selection.FlatCostModel(msg_us=-1.0)


def test_the_flat_model_and_the_calibrated_host_model_count_the_same_steps_and_messages() -> None:
    host = HostCostModel("shm", HostParams(call_us=1.0, step_us=1.0, msg_us=0.5), 16, (2, 3, 4, 8),
                         CacheSizes(1 << 20, 32 << 20))
    for coll in (AR, BC, Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL, Collective.REDUCE):
        for algo in registry.algorithms_for(coll):
            if algo == "hierarchical":
                continue
            for n in (2, 3, 4, 8):
                for v in selection.variants(registry.get_schedule(coll, algo, n, root=root(coll))):
                    shape = selection.call_shape(coll, n, 64 * n, 4)
                    f = host.features(v, shape, True).steps
                    seen = (int((f[..., F_STEP].max(axis=1) > 0).sum()), int(f[..., F_MSGS].max(axis=1).sum()))
                    assert selection.call_messages(v, shape) == seen, (coll, algo, n, v.algorithm)
