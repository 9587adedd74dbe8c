"""Real ranks run the self-test matrix (every collective x dtype x op x count, p2p, async, groups,
every registered algorithm) against NumPy references: shared memory for 1-4 ranks, TCP only,
torch tensors, and two emulated hosts (network namespaces) mixing TCP between and shm within."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringflow.runtime.job import auth

ROOT = Path(__file__).resolve().parents[1]


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RINGFLOW_SHM_DISABLE", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def _results(out: Path, n: int) -> list[dict]:
    res = []
    for r in range(n):
        f = out / f"rank{r}.json"
        assert f.exists(), f"rank {r} wrote no results"
        res.append(json.loads(f.read_text()))
    return res


def _assert_clean(results: list[dict], min_cases: int) -> None:
    for res in results:
        assert res["cases"] >= min_cases, f"rank {res['rank']} ran only {res['cases']} cases"
        assert not res["failures"], f"rank {res['rank']}: {len(res['failures'])} failures:\n" + \
            "\n".join(res["failures"][:8])


def run_suite(n: int, suite: str, out: Path, extra_env: dict[str, str] | None = None,
              timeout_s: float = 150.0) -> list[dict]:
    """Launch n ranks under `ringflow run` running one self-test suite; their result files."""
    cmd = [sys.executable, "-m", "ringflow", "run", "-n", str(n), "--timeout", str(timeout_s), "-m",
           "ringflow.testing.selftest", "--suite", suite, "--out", str(out)]
    proc = subprocess.run(cmd, env=_env(extra_env), capture_output=True, text=True, timeout=timeout_s + 30)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return _results(out, n)


@pytest.mark.parametrize("n", [1, 2, pytest.param(3, marks=pytest.mark.long), pytest.param(4, marks=pytest.mark.long)])
def test_shared_memory_matrix(n: int, tmp_path: Path) -> None:
    """Every collective x dtype x op x count, in place and not: on the native executor where it was built."""
    results = run_suite(n, "core", tmp_path)
    _assert_clean(results, 600)
    for res in results:
        assert set(res["transports"].values()) <= {"shm"}
        if res["native"] and n > 1:
            assert res["native_runs"] > 0, "the native executor was built but never ran a plan"


@pytest.mark.long
@pytest.mark.parametrize("n", [2, 3, 4])
def test_shared_memory_matrix_in_python(n: int, tmp_path: Path) -> None:
    """The same matrix with the native executor off (RINGFLOW_NATIVE=0): the pure-Python fallback."""
    results = run_suite(n, "core", tmp_path, {"RINGFLOW_NATIVE": "0"})
    _assert_clean(results, 600)
    assert all(res["native_runs"] == 0 and not res["native"] for res in results)


@pytest.mark.long
def test_shared_memory_matrix_oversubscribed(tmp_path: Path) -> None:
    """8 ranks on a host with fewer cores: waits must sleep, not spin, or this takes minutes."""
    results = run_suite(8, "core", tmp_path, timeout_s=280.0)
    _assert_clean(results, 600)


@pytest.mark.long
def test_single_copy_is_used_and_slots_still_work(tmp_path: Path) -> None:
    """Large same-host messages go by single copy (process_vm_readv) where the kernel allows it; with
    RINGFLOW_CMA_DISABLE=1 the same matrix passes through the shared-memory slots."""
    on = run_suite(2, "core", tmp_path / "on")
    _assert_clean(on, 600)
    if not all(res["cma_links"] for res in on):
        pytest.skip("this kernel refuses process_vm_readv between sibling processes (ptrace policy)")
    assert all(res["cma_reads"] > 0 for res in on), "no message went by single copy"
    off = run_suite(3, "core", tmp_path / "off", {"RINGFLOW_CMA_DISABLE": "1"})
    _assert_clean(off, 600)
    assert all(res["cma_reads"] == 0 and res["cma_links"] == 0 for res in off)


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.long)])
def test_tcp_only_matrix(n: int, tmp_path: Path) -> None:
    results = run_suite(n, "tcp", tmp_path, {"RINGFLOW_SHM_DISABLE": "1", "RINGFLOW_TRAFFIC_CLASS": "184"})
    _assert_clean(results, 100)
    for res in results:
        assert set(res["transports"].values()) == {"tcp"}


@pytest.mark.long
def test_torch_tensors(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    _assert_clean(run_suite(2, "torch", tmp_path), 3)


@pytest.mark.long
def test_two_hosts_in_network_namespaces(tmp_path: Path) -> None:
    """Ranks 0,1 in one namespace and 2,3 in another: TCP between the 'hosts', shm within each."""
    from ringflow.testing import netns
    reason = netns.available()
    if reason is not None:
        pytest.skip(f"multi-host emulation unavailable: {reason}")
    secret = auth.new_secret()
    with netns.NetnsCluster(2) as cl:
        store = f"{cl.address(0)}:29517"
        procs = []
        for r in range(4):
            env = _env({"RINGFLOW_RANK": str(r), "RINGFLOW_WORLD_SIZE": "4", "RINGFLOW_STORE_ADDR": store,
                        "RINGFLOW_SECRET": secret, "RINGFLOW_JOB_ID": "nstest" + cl.tag})
            cmd = cl.command(r // 2, [sys.executable, "-m", "ringflow.testing.selftest", "--suite", "tcp",
                                      "--out", str(tmp_path), "--timeout", "60"])
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = []
        try:
            for p in procs:
                try:
                    outs.append(p.communicate(timeout=120)[0])
                except subprocess.TimeoutExpired:
                    p.kill()
                    outs.append(f"(rank killed after 120 s)\n{p.communicate()[0]}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        assert all(p.returncode == 0 for p in procs), "\n".join(f"--- rank {r}:\n{o[-3000:]}"
                                                               for r, o in enumerate(outs))
    results = _results(tmp_path, 4)
    _assert_clean(results, 100)
    for res in results:
        r = res["rank"]
        for peer, kind in res["transports"].items():
            assert kind == ("shm" if int(peer) // 2 == r // 2 else "tcp"), (r, peer, kind)
