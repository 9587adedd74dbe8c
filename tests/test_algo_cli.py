"""`ringflow algo` commands: list, show, verify, choose (text and --json), typed errors -> exit 2."""
from __future__ import annotations

import json

import pytest

from ringflow.algorithms import registry
from ringflow.algorithms.schedule import Schedule
from ringflow.cli import main


def _run(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ei:
        main(args)
    out = capsys.readouterr()
    return int(ei.value.code or 0), out.out, out.err


def test_list_json_has_every_pair_with_cost_line(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(["algo", "list", "--json"], capsys)
    rows = json.loads(out)
    assert code == 0
    pairs = {(r["algorithm"], r["collective"]) for r in rows}
    assert ("ring", "all_reduce") in pairs
    assert len(pairs) == sum(len(a.collectives) for a in registry.ALGORITHMS.values())
    assert next(r for r in rows if r["algorithm"] == "ring" and r["collective"] == "all_reduce")["cost"] == \
        "steps: 2(n-1); bytes per rank: 2(n-1)/n S"


def test_show_table_and_json_roundtrip(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(["algo", "show", "all_reduce", "ring", "-n", "5"], capsys)
    assert code == 0 and out.startswith("all_reduce / ring: 5 ranks, 8 steps")
    assert "r0: send in[0] ->r1; recv+ out[4]=in[4]+<-r4" in out
    args = ["algo", "show", "broadcast", "tree", "-n", "6", "--root", "2", "--nsegs", "3", "--json"]
    code, out, _ = _run(args, capsys)
    s = Schedule.from_json(json.loads(out))
    assert s.root == 2 and s.to_json() == registry.get_schedule("broadcast", "tree", 6, root=2, nsegs=3).to_json()


def test_verify_command(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(["algo", "verify", "all_reduce", "halving_doubling", "-n", "7", "--json"], capsys)
    res = json.loads(out)
    assert code == 0 and res[0]["in_place_checked"] and res[0]["bytes_fraction"] == "5/2"  # 2(4-1)/4 + 1 fold
    code, out, _ = _run(["algo", "verify", "all", "all", "-n", "6"], capsys)
    assert code == 0 and "dissemination" in out


def test_choose_command_json_and_text(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(["algo", "choose", "all_reduce", "--size", "1KiB", "-n", "8", "--topo", "dgx-h100", "--json"],
                        capsys)
    d = json.loads(out)
    assert code == 0 and d["algorithm"] == d["candidates"][0]["algorithm"] and d["topology"] == "dgx-h100"
    code, out, _ = _run(["algo", "choose", "all_reduce", "--size", "64MiB", "-n", "16", "--topo", "dgx-h100"], capsys)
    assert code == 0 and "hierarchical" in out and "16 ranks" in out


def test_typed_errors_exit_2(capsys: pytest.CaptureFixture) -> None:
    code, _, err = _run(["algo", "show", "all_reduce", "bogus", "-n", "4"], capsys)
    assert code == 2 and "UnknownAlgorithm" in err and "valid algorithms" in err
    code, _, err = _run(["algo", "verify", "all_gather", "tree", "-n", "4"], capsys)
    assert code == 2 and "does not implement all_gather" in err


def test_cost_command_pairs(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = _run(["algo", "cost", "all_reduce", "ring", "-n", "4", "--size", "1MiB", "--json"], capsys)
    d = json.loads(out)
    assert code == 0 and d["steps"] == 6 and d["bytes_per_rank"] == 3 * (1 << 20) // 2
    assert sorted((a, b) for a, b, _ in d["pair_bytes"]) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    code, out, _ = _run(["algo", "cost", "broadcast", "ring", "-n", "8", "--nsegs", "4", "--topo", "dgx1-v100"], capsys)
    assert code == 0 and "dgx1-v100" in out and "10 steps" in out
