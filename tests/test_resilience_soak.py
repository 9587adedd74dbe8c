"""Soak: 100,000 back-to-back mixed small collectives, then 1,000 communicator create/destroy cycles
(split, new_group, split + shrink, full init) on 2 real ranks (a quarter of that on 3 ranks under the log-depth
argument check), every result checked, with resident memory, open file descriptors and threads measured from
/proc and asserted flat."""
from __future__ import annotations

import glob
from pathlib import Path

import pytest
from resilience_ranks import Job  # noqa: E402

pytestmark = [pytest.mark.usefixtures("no_leaked_shared_memory")]


OPS, CYCLES = 100_000, 1_000
# Tolerances, after the first checkpoint of each phase (10% in: caches, schedules, lazy imports are warm):
RSS_GROWTH_KIB = 4096  # resident memory may grow at most 4 MiB over the rest of the phase
FD_SLACK = 2  # a socket or doorbell in the middle of closing when sampled
THREAD_SLACK = 1  # a connection-admission thread that has done its work but not yet exited


def _flat(points: list[dict], what: str) -> dict:
    base, last = points[1], points[-1]
    peak_fds = max(p["fds"] for p in points[1:])
    assert peak_fds <= base["fds"] + FD_SLACK, f"{what}: fds grew {base['fds']} -> {peak_fds}"
    assert last["rss_kib"] - base["rss_kib"] <= RSS_GROWTH_KIB, f"{what}: RSS grew {base} -> {last}"
    assert last["threads"] <= base["threads"] + THREAD_SLACK, f"{what}: threads {base['threads']} -> {last['threads']}"
    return {"rss_growth_kib": last["rss_kib"] - base["rss_kib"], "fds": (base["fds"], last["fds"])}


@pytest.mark.long
@pytest.mark.parametrize("n,ops,cycles,env", [
    (2, OPS, CYCLES, {}), (3, OPS // 4, CYCLES // 4, {"RINGFLOW_CHECK_ROUNDS": "log"})],
    ids=["2-ranks", "3-ranks-log-depth-check"])
def test_soak_collectives_and_communicator_cycles_keep_memory_and_fds_flat(tmp_path: Path, n: int, ops: int,
                                                                           cycles: int, env: dict[str, str]) -> None:
    with Job(n, "soak", tmp_path, ["--ops", str(ops), "--cycles", str(cycles), "--timeout", "60"], env=env) as job:
        assert job.wait(240) == [0] * n, job.logs()
        for r in range(n):
            res = job.result(r)
            assert res["wrong"] == 0
            assert res["made"] >= cycles  # split + shrink cycles make two communicators
            assert len(res["ops"]) == 11 and res["ops"][-1]["i"] == ops
            assert len(res["cycles"]) == 11 and res["cycles"][-1]["i"] == cycles
            _flat(res["ops"], f"rank {r} collectives")
            _flat(res["cycles"], f"rank {r} create/destroy cycles")
        assert glob.glob(f"/dev/shm/ringflow-{job.job_id}-*") == []
