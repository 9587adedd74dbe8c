"""`ringflow diagnose` from what a hung or failed job leaves on disk under a plain `ringflow run` (its default job
directory, no recording asked for): a sleeping rank ended by SIGTERM to the launcher, the same with SIGKILL to every
rank, a rank that arrives after the others gave up, and a rank that calls with a different count. The rank side is
tests/record_ranks.py."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_record_diagnose import RANKS, site_line

from ringflow.errors import InvalidArgument
from ringflow.runtime.recording.flightring import read_ring
from ringflow.workload.diagnose import diagnose, render

ROOT = Path(__file__).resolve().parents[1]
AT = 3   # the step (and collective number) at which the fault happens


def _start(tmp_path: Path, args: list[str], record: bool = False) -> subprocess.Popen:
    """`ringflow run` of record_ranks.py on 3 ranks (with `record`: under `ringflow record -o <tmp>/rec`)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("RINGFLOW_")}
    e.update({"TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT / "tests") + os.pathsep + str(ROOT)})
    rec = [sys.executable, "-m", "ringflow", "record", "-o", str(tmp_path / "rec"), "--"] if record else []
    return subprocess.Popen([*rec, sys.executable, "-m", "ringflow", "run", "-n", "3", "--no-bind", "--",
                             sys.executable, str(RANKS), *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _job_dir(tmp_path: Path) -> Path:
    if (tmp_path / "rec").exists():
        return tmp_path / "rec"
    (d,) = (tmp_path / "ringflow-runs").iterdir()
    return d


def _run(tmp_path: Path, args: list[str]) -> tuple[Path, str]:
    p = _start(tmp_path, args)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0, err
    d = _job_dir(tmp_path)
    assert f"flight records are in {d}" in err
    return d, err


def _await_hang(tmp_path: Path, timeout_s: float = 90) -> dict[int, dict]:
    """Wait until ranks 0 and 1 are in all_reduce #AT and rank 2 (asleep) completed #AT-1; their rings."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        rings = {}
        for f in list(tmp_path.glob("ringflow-runs/*/ring-rank*.bin")) + list(tmp_path.glob("rec/ring-rank*.bin")):
            try:
                r = read_ring(f)
            except InvalidArgument:   # being made
                continue
            rings[int(r["info"]["global_rank"])] = r
        last = {g: r["calls"][-1] for g, r in rings.items() if r["calls"]}
        if len(last) == 3 and all(last[g]["seq"] == AT and last[g]["status"] == "in_flight" for g in (0, 1)) \
                and (last[2]["seq"], last[2]["status"]) == (AT - 1, "ok"):
            return rings
        time.sleep(0.2)
    raise AssertionError("the ranks did not reach the hang")


def _check_hang(d: Path) -> str:
    report = diagnose(d)
    text = render(report)
    (h,) = report["hangs"]
    assert (h["seq"], h["waiting"], [m["rank"] for m in h["missing"]]) == (AT, [0, 1], [2]), text
    assert h["missing"][0]["last_seq"] == AT - 1 and site_line("sleep") in h["missing"][0]["last_site"], text
    assert "never entered: rank 2; last call #2 all_reduce of 256 x float32" in text
    assert report["mismatches"] == [] and "stragglers" not in report
    return text


@pytest.mark.parametrize("record", [False, pytest.param(True, marks=pytest.mark.long)], ids=["run", "record"])
def test_a_sleeping_rank_is_named_after_sigterm_to_the_launcher(tmp_path: Path, record: bool) -> None:
    """Under `ringflow record` too (SIGTERM to it): its rank files hold no calls yet, the rings hold them."""
    p = _start(tmp_path, ["sleep", "--steps", "6", "--at", str(AT), "--timeout", "120"], record)
    _await_hang(tmp_path)
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGTERM, err
    d = _job_dir(tmp_path)
    assert f"flight records are in {d}" in err
    text = _check_hang(d)
    report = diagnose(d)
    assert report["records"]["job"] == {"ended": "SIGTERM to the launcher", "exit_code": 143}
    head = "record file without calls (they are written every 1,024 calls and at exit); " if record else ""
    for e in report["records"]["ranks"]:   # every ring marked ended by the forwarded SIGTERM (C recorder)
        ring = f"{head}ring only of world, all {AT + 1 if e['rank'] < 2 else AT} calls (ended by signal 15)"
        # a waiting rank may see a peer the signal reached first leave, and record that RemoteError before its own
        # signal arrives
        late = (f"{ring}; flight record (RemoteError)",) if e["rank"] < 2 else ()
        assert e["records"] in (ring, *late), text
        assert e["end"] == "killed by SIGTERM (SIGTERM from the launcher)", text
    print(text)


@pytest.mark.long
def test_a_sleeping_rank_is_named_after_sigkill_to_every_rank(tmp_path: Path) -> None:
    p = _start(tmp_path, ["sleep", "--steps", "6", "--at", str(AT), "--timeout", "120"])
    rings = _await_hang(tmp_path)
    time.sleep(1.0)
    for r in rings.values():
        os.kill(int(r["info"]["pid"]), signal.SIGKILL)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 128 + signal.SIGKILL, err
    d = _job_dir(tmp_path)
    text = _check_hang(d)
    report = diagnose(d)
    assert re.fullmatch(r"rank \d killed by SIGKILL \(not sent by the launcher\)", report["records"]["job"]["ended"])
    for e in report["records"]["ranks"]:
        assert "(not marked ended: killed, or stopped while blocked in a call)" in e["records"], text
        assert e["end"] == "killed by SIGKILL (not sent by the launcher)", text
    print(text)


@pytest.mark.long
def test_a_rank_that_arrives_after_the_others_gave_up_is_named_late(tmp_path: Path) -> None:
    late_s, timeout_s = 6.0, 2.0
    d, _ = _run(tmp_path, ["late", "--steps", "5", "--at", str(AT), "--late", str(late_s), "--timeout",
                           str(timeout_s)])
    report = diagnose(d)
    text = render(report)
    (h,) = report["hangs"]
    assert (h["seq"], h["waiting"], h["missing"]) == (AT, [0, 1], []), text
    (late,) = h["late"]
    assert (late["rank"], late["after"], late["others_status"]) == (2, [0, 1], ["Timeout"]), text
    assert late_s - 1.0 < late["late_s"] < late_s + 2.5, text
    assert timeout_s - 0.1 < late["others_gave_up_after_s"] < timeout_s + 1.5, text
    assert re.search(r"rank 2 entered all_reduce #3 \d+\.\d s after ranks 0-1, which gave up after their "
                     r"\d+\.\d s timeout", text), text
    assert "one of them is slow inside it" not in text
    print(text)


def test_a_call_with_a_different_count_is_named_with_both_counts(tmp_path: Path) -> None:
    d, _ = _run(tmp_path, ["mismatch", "--steps", "5", "--at", str(AT), "--timeout", "5"])
    report = diagnose(d)
    text = render(report)
    (mm,) = report["mismatches"]
    assert (mm["seq"], mm["expected_by"], mm["expected"]) == (AT, [0, 1], "all_reduce of 256 x float32"), text
    (o,) = mm["outliers"]
    assert (o["rank"], o["op"]) == (2, "all_reduce of 128 x float32"), text
    assert o["how"] == "called all_reduce with count 128 where the others gave 256", text
    assert site_line("mismatch") in mm["expected_site"]
    print(text)
