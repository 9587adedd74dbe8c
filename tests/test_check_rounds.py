"""The log-depth argument check (`algorithms.check_rounds`): ceil(log2 n) dissemination rounds instead of an exchange
with every peer, carried by the dissemination schedules' own messages, picked per communicator by its cost model.
On real ranks, disagreeing calls all raise InvalidArgument with their arrays untouched and the communicator stays
usable, on the native and the Python executor, over shared memory and TCP."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringflow.algorithms import check_rounds
from ringflow.algorithms.layout import CallShape
from ringflow.algorithms.plan import compile_plan
from ringflow.algorithms.registry import get_schedule
from ringflow.algorithms.schedule import Collective, OpKind
from ringflow.algorithms.selection import (
    FlatCostModel,
    check_messages,
    pattern_for,
    pattern_prices_us,
    pick_schedule,
)
from ringflow.algorithms.verifier import verify
from ringflow.algorithms.verify_messages import opens_with_check, verifiable

ROOT = Path(__file__).resolve().parents[1]
AR, BC, BAR = Collective.ALL_REDUCE, Collective.BROADCAST, Collective.BARRIER


def _sched(coll: Collective, algo: str, n: int, root: int | None = None):
    return get_schedule(coll, algo, n, root=root if coll.has_root else None)


def test_dissemination_schedules_give_exact_results_and_carry_the_rounds() -> None:
    for n in range(1, 10):
        for coll, root in ((AR, None), (BC, 0), (BC, n - 1), (BAR, None)):
            s = _sched(coll, "dissemination", n, root)
            verify(s)
            assert check_rounds.disseminates(s) == (n >= 3), (coll, n)


def test_schedules_that_write_user_arrays_before_the_last_round_do_not_carry_the_rounds() -> None:
    for n in (4, 5, 8):
        assert not check_rounds.disseminates(_sched(AR, "ring", n))
        assert not check_rounds.disseminates(_sched(BC, "binomial", n, 0))      # receives land in OUT at once
        assert not check_rounds.disseminates(_sched(Collective.ALL_GATHER, "bruck", n))
    # pairwise exchange on 3 or 4 ranks sends to r+1 then r+2 into scratch: the rounds' own pattern
    assert check_rounds.disseminates(_sched(Collective.REDUCE_SCATTER, "pairwise", 4))
    assert not check_rounds.disseminates(_sched(Collective.REDUCE_SCATTER, "pairwise", 5))   # r+3, not r+4


@settings(max_examples=300, deadline=None)
@given(st.integers(3, 40).flatmap(lambda n: st.lists(st.integers(0, 2), min_size=n, max_size=n)))
def test_after_the_last_round_every_rank_knows_whether_all_ranks_called_alike(sigs: list[int]) -> None:
    """The rounds as the runtime runs them: a rank sends its own call while clean, a relay once it found or was
    told of a mismatch (what it sends in a round is what it knew before that round's receive)."""
    n = len(sigs)
    found = [False] * n
    for k in range(check_rounds.rounds(n)):
        sent = [None if found[r] else sigs[r] for r in range(n)]   # None: a RELAY frame
        for r in range(n):
            got = sent[check_rounds.round_peers(n, r, k)[1]]
            found[r] = found[r] or got is None or got != sigs[r]
    assert found == [len(set(sigs)) > 1] * n


def _round_messages(plan, k: int) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    xs = plan.steps[k].xfers
    return ([(x.peer, x.key) for x in xs if x.kind == OpKind.SEND],
            [(x.peer, x.key) for x in xs if x.kind != OpKind.SEND])


def test_under_the_log_pattern_every_rank_moves_one_message_each_way_per_round_whatever_it_runs() -> None:
    for n in (3, 5, 8):
        K = check_rounds.rounds(n)
        with check_rounds.using("log"):
            for coll, algo, root in ((AR, "dissemination", None), (BC, "dissemination", 2), (AR, "one_shot", None),
                                     (AR, "ring", None), (BC, "binomial", 1)):
                s = _sched(coll, algo, n, root)
                carried = check_rounds.disseminates(s)
                assert not verifiable(s) and opens_with_check(s) != carried
                assert check_messages(s)[0] == (0 if carried else K)
                for r in range(n):
                    plan = compile_plan(s, CallShape(coll, n, 64, 4, None), r, False)
                    assert plan.self_checking == carried and plan.check_rounds == (K if carried else 0)
                    for k in range(plan.check_rounds):   # data or a zero-byte filler: one each way
                        to, frm = check_rounds.round_peers(n, r, k)
                        assert _round_messages(plan, k) == ([(to, "c0")], [(frm, "c0")]), (algo, n, r, k)
        # the pairs pattern is as before: a self-checking one-shot, verify messages elsewhere
        assert not opens_with_check(_sched(AR, "one_shot", n)) and verifiable(_sched(BC, "dissemination", n, 2))


@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_the_check_pattern_is_the_one_the_cost_model_prices_lower(n: int) -> None:
    steps_dear = FlatCostModel()                            # the flat tuner's 10 us per step, 0.16 us per message
    msgs_dear = FlatCostModel(alpha_us=1.0, msg_us=1.0)     # messages as dear as steps
    for model in (None, steps_dear, msgs_dear, FlatCostModel(alpha_us=1.0, msg_us=1.0, margin=1.5)):
        prices = pattern_prices_us(n, model)   # log must win by more than the model's own error
        best = "log" if prices["log"] * (model.margin if model else 1.0) < prices["pairs"] else "pairs"
        assert pattern_for(n, model, "auto") == best
    assert pattern_for(n, steps_dear, "auto") == "pairs"
    assert pattern_for(n, msgs_dear, "auto") == ("log" if n >= 4 else "pairs")
    assert pattern_for(n, None, "log") == "log" and pattern_for(n, msgs_dear, "pairs") == "pairs"
    with check_rounds.using("log"):   # there, a small all-reduce runs on the rounds themselves
        s = pick_schedule(AR, 4, n, None, 4, False, 1 << 18, msgs_dear)
        assert s.algorithm == "dissemination" and check_messages(s) == (0, 0)


def test_algo_choose_calibrated_names_the_pattern_the_host_model_picks(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    from ringflow.cli import main
    from ringflow.hostmodel.features import cache_sizes
    from ringflow.hostmodel.model import HostCostModel, HostParams
    for name, params, want, algo in (
            ("steps", HostParams(call_us=2.0, step_us=10.0, msg_us=0.16), "pairs", "one_shot"),
            ("msgs", HostParams(call_us=2.0, step_us=1.0, msg_us=1.2, peer_us=0.3), "log", "dissemination")):
        path = tmp_path / f"{name}.json"
        HostCostModel("shm", params, 16, (2, 4, 8, 16), cache_sizes(), 1.1).save(str(path))
        with pytest.raises(SystemExit) as exc:
            main(["algo", "choose", "all_reduce", "--size", "8", "-n", "16", "--calibrated", str(path), "--json"])
        assert exc.value.code == 0
        got = json.loads(capsys.readouterr().out)
        prices = got["check_pattern_prices_us"]
        assert got["check_pattern"] == want == min(prices, key=prices.get) and got["chosen"]["algorithm"] == algo


def test_two_ranks_keep_the_pairs_pattern() -> None:
    assert pattern_for(2, FlatCostModel(alpha_us=0.0, msg_us=100.0), "log") == "pairs"
    with check_rounds.using("log"):
        assert not check_rounds.log_depth(2) and verifiable(_sched(BC, "binomial", 2, 0))


def _run(script: str, n: int, tmp: Path, env: dict[str, str], *args: str) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RINGFLOW_")}
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", str(n), "--timeout", "120", *script.split(),
                           *args], env={**base, "RINGFLOW_CHECK_ROUNDS": "log", **env}, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_tune_with_moves_a_communicator_between_patterns_by_its_model(tmp_path: Path) -> None:
    _run(str(ROOT / "tests" / "check_rounds_ranks.py"), 4, tmp_path, {"RINGFLOW_CHECK_ROUNDS": "auto"},
         str(tmp_path))
    for r in range(4):
        phases = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert [p["pattern"] for p in phases] == ["pairs", "log", "pairs"]
        assert [p["algorithm"] for p in phases] == ["one_shot", "dissemination", "one_shot"]
        assert all(p["exact"] and p["mismatch"] == "InvalidArgument" and p["untouched"] for p in phases), phases


@pytest.mark.parametrize("n,env", [
    (3, {}),
    pytest.param(4, {"RINGFLOW_NATIVE": "0"}, marks=pytest.mark.long),
    pytest.param(4, {"RINGFLOW_SHM_DISABLE": "1"}, marks=pytest.mark.long),
], ids=["shm-3", "python-4", "tcp-4"])
def test_log_depth_checks_on_real_ranks(n: int, env: dict[str, str], tmp_path: Path) -> None:
    # every collective x dtype x op x count against NumPy references, under the log pattern
    suite = "tcp" if env.get("RINGFLOW_SHM_DISABLE") else "core"
    _run(f"-m ringflow.testing.selftest --suite {suite} --out {tmp_path / 'matrix'}", n, tmp_path, env)
    for r in range(n):
        res = json.loads((tmp_path / "matrix" / f"rank{r}.json").read_text())
        assert res["cases"] >= 100 and not res["failures"], res["failures"][:5]
    # the last rank disagrees on one argument per case: every rank raises, nothing is delivered, and the
    # communicator still gives exact results
    (tmp_path / "mismatch").mkdir()
    _run(str(ROOT / "tests" / "receiver_check_ranks.py"), n, tmp_path, env, str(tmp_path / "mismatch"))
    for r in range(n):
        res = json.loads((tmp_path / "mismatch" / f"rank{r}.json").read_text())
        assert res["pattern"] == "log" and len(res["cases"]) == 21
        for name, case in res["cases"].items():
            assert case["type"] == "InvalidArgument", (r, name, case)
            assert case["unchanged"], f"rank {r}: {name} delivered data"
            assert case["elapsed_s"] < 10.0, (r, name, case)
        assert res["exact_after"] is True
