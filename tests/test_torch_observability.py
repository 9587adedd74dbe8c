"""ringflow through torch.distributed speaks torch: errors name both calls and give torch's fixes
(destroy_process_group, new_group, the group's timeout), RINGFLOW_DEBUG logs as under ringflow.init,
RINGFLOW_TIMEOUT replaces torch's default timeout or fails loudly, and RINGFLOW_DUMP_DIR gets the flight records.

Ranks are plain processes with a `file://` init method (tests/torch_observability_ranks.py).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch (optional extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent
RANKS = ROOT / "tests" / "torch_observability_ranks.py"
RINGFLOW_API = ("shrink", "new communicator", "ringflow.init")


def launch(tmp_path: Path, mode: str, n: int, env: dict[str, str]) -> list[tuple[dict, str]]:
    """Run n ranks of one mode; each rank's JSON line and stderr."""
    init = tmp_path / f"init.{mode}.{n}"
    base = {k: v for k, v in os.environ.items() if not k.startswith("RINGFLOW_")}
    procs = [subprocess.Popen([sys.executable, str(RANKS), mode, str(r), str(n), str(init)], cwd=ROOT,
                              env={**base, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(n)]
    res = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0 and out.strip(), f"rc {p.returncode}\n{out}\n{err[-3000:]}"
            res.append((json.loads(out.strip().splitlines()[-1]), err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return res


def test_errors_name_both_calls_and_torch_fixes_with_debug_logs_and_flight_records(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    (r0, err0), (r1, _) = launch(tmp_path, "errors", 2, {"RINGFLOW_DEBUG": "INFO", "RINGFLOW_DUMP_DIR": str(dump)})
    for res, me, peer, mine, theirs in ((r0, 0, 1, 8, 6), (r1, 1, 0, 6, 8)):
        c = res["count"]
        assert c["type"] == "DistBackendError", c
        assert f"rank {peer} called all_reduce of {theirs} x float32 (op sum) but this rank ({me}) called " \
               f"all_reduce of {mine} x float32 (op sum)" in c["text"], c["text"]
        assert "torch.distributed collective" in c["text"] and "{" not in c["text"], c["text"]
        assert c["detail"]["peer_call"]["count"] == theirs and c["detail"]["this_call"]["count"] == mine
    t = r0["timeout"]
    assert "Timeout: all_reduce of 8 x float32 (op sum)" in t["text"] and "rank 1 has not entered it" in t["text"]
    assert "the process group's timeout" in t["text"] and "{" not in t["text"], t["text"]
    assert t["detail"]["waiting_on"] == [1] and t["detail"]["peers"]["1"]["call"] == "barrier", t["detail"]
    a = r0["after_timeout"]
    assert "Aborted" in a["text"] and "dist.destroy_process_group()" in a["text"] and "dist.new_group" in a["text"]
    for case in (r0["count"], t, a, r1["count"]):
        assert not any(w in case["text"] for w in RINGFLOW_API), case["text"]
    # RINGFLOW_DEBUG=INFO: the same lines as under ringflow.init, prefixed with the process's rank
    assert "[0] INFO ringflow: version" in err0 and "[0] INFO ringflow: communicator pg rank 0/2 ready" in err0, err0
    assert (dump / "flight-rank0.json").exists() and (dump / "flight-rank1.json").exists()
    reason = json.loads((dump / "flight-rank0.json").read_text())["reason"]
    assert reason.startswith("Timeout: all_reduce of 8 x float32"), reason


def test_ringflow_timeout_replaces_torchs_default_or_fails_the_group_creation_when_malformed(tmp_path: Path) -> None:
    """RINGFLOW_TIMEOUT=7.5 is the group's timeout, unset leaves torch's default, malformed values fail
    init_process_group (four one-rank jobs side by side)."""
    values = ["7.5", None, "abc", "-1"]
    dirs = [tmp_path / f"v{i}" for i in range(len(values))]
    for d in dirs:
        d.mkdir()
    with ThreadPoolExecutor(len(values)) as pool:
        runs = list(pool.map(lambda dv: launch(dv[0], "timeout", 1, {} if dv[1] is None else
                                               {"RINGFLOW_TIMEOUT": dv[1]}), zip(dirs, values, strict=True)))
    (set_res, _), = runs[0]
    assert set_res["timeout_s"] == 7.5 and set_res["comm_timeout_s"] == 7.5, set_res
    (default_res, _), = runs[1]
    assert default_res["timeout_s"] == 1800.0, default_res   # torch's default, as gloo
    for (res, _), in runs[2:]:
        assert res["init"]["type"] == "DistBackendError", res
        assert "ConfigError" in res["init"]["text"] and "RINGFLOW_TIMEOUT" in res["init"]["text"], res
