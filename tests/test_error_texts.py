"""Errors in words: a mismatch names both ranks' calls (collective, count, dtype, op, root) in one sentence on both
sides, whether the peer's arguments came with its message (the argument check) or not (a self-checking one-shot
call); a Timeout names the late rank and its last call in at most 300 characters; the facts stay on `detail`.

Two real ranks under `ringflow run` (tests/error_text_ranks.py), over shared memory and over TCP.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringflow.runtime.call.calltext import MAX_TIMEOUT_CHARS, phrase, timeout_sentence

ROOT = Path(__file__).resolve().parents[1]
SIZES = (8, 1 << 16)   # error_text_ranks.SMALL (one-shot, checks itself) and LARGE (argument check first)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGFLOW_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


@pytest.fixture(scope="module", params=["shm", "tcp"])
def results(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp(f"errors-{request.param}")
    env = _env({"RINGFLOW_SHM_DISABLE": "1"} if request.param == "tcp" else {})
    proc = subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", "2", "--timeout", "90",
                           str(ROOT / "tests" / "error_text_ranks.py"), str(out)], env=env, capture_output=True,
                          text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def _both_sides(results: list[dict], case: str, call0: str, call1: str) -> None:
    """Each rank's error names the other's call and its own, in words."""
    for me, peer, mine, theirs in ((0, 1, call0, call1), (1, 0, call1, call0)):
        err = results[me][case]
        assert err["type"] == "InvalidArgument", (me, case, err)
        assert err["message"].startswith(f"rank {peer} called {theirs} but this rank ({me}) called {mine}"), \
            (me, case, err["message"])
        assert "{" not in err["text"], err["text"]
        assert err["detail"]["peer"] == peer and err["detail"]["peer_call"] is not None, err["detail"]


@pytest.mark.parametrize("n", SIZES)
def test_a_count_mismatch_names_both_counts(results: list[dict], n: int) -> None:
    _both_sides(results, f"count {n}", f"all_reduce of {n} x float32 (op sum)",
                f"all_reduce of {n - 2} x float32 (op sum)")
    assert f"(count {n - 2} vs {n})" in results[0][f"count {n}"]["message"]
    assert results[0][f"count {n}"]["detail"]["peer_call"]["count"] == n - 2


@pytest.mark.parametrize("n", SIZES)
def test_a_dtype_mismatch_names_both_dtypes(results: list[dict], n: int) -> None:
    _both_sides(results, f"dtype {n}", f"all_reduce of {n} x float32 (op sum)", f"all_reduce of {n} x float64 (op sum)")
    assert results[1][f"dtype {n}"]["detail"]["peer_call"]["dtype"] == "float32"


@pytest.mark.parametrize("n", SIZES)
def test_an_op_mismatch_names_both_ops(results: list[dict], n: int) -> None:
    _both_sides(results, f"op {n}", f"all_reduce of {n} x float32 (op sum)", f"all_reduce of {n} x float32 (op max)")


@pytest.mark.parametrize("n", SIZES)
def test_a_root_mismatch_names_both_roots(results: list[dict], n: int) -> None:
    _both_sides(results, f"root {n}", f"broadcast of {n} x int32 from root 0", f"broadcast of {n} x int32 from root 1")
    assert "(root 1 vs 0)" in results[0][f"root {n}"]["message"]


def test_a_timeout_names_the_late_rank_and_its_last_call_in_one_short_sentence(results: list[dict]) -> None:
    err = results[0]["timeout"]
    assert err["type"] == "Timeout", err
    assert err["message"] == "all_reduce of 8 x float32 (op sum) (call #9) timed out waiting for rank 1: rank 1 has " \
                             "not entered it (done with call #8, barrier)", err["message"]
    assert len(err["message"]) <= MAX_TIMEOUT_CHARS and "{" not in err["text"]
    d = err["detail"]
    assert d["waiting_on"] == [1] and d["op_seq"] == 9 and d["call"]["count"] == 8, d
    assert d["peers"]["1"] == {"op_seq": 8, "in_call": False, "call": "barrier"}, d


def test_a_timeout_sentence_stays_short_however_many_ranks_are_late() -> None:
    desc = json.dumps({"collective": "all_gather", "count": 1 << 20, "dtype": "bfloat16", "op": None, "root": None})
    answers = {p: {"op_seq": p % 7, "call": desc, "in_call": p % 2 == 0} for p in range(1, 900)}
    text = timeout_sentence(desc, 12, list(range(1, 1000)), answers, list(range(900, 1000)))
    assert len(text) <= MAX_TIMEOUT_CHARS and text.startswith(f"{phrase(desc)} (call #12) timed out"), text
    assert "ranks 1, 15, 29, 43, 57, 71 and 59 more have not entered it (done with call #1, " in text, text
    assert text.endswith("(the rest in the error's detail)"), text
