"""Faults between emulated hosts (network namespaces joined by veth pairs, ringflow.testing.netns):
a link brought down mid-collective gives every rank a typed error within the timeout, and 1%
random packet loss (nftables) leaves collectives correct. Skipped with the reason where
namespaces cannot be made."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from resilience_ranks import Job, dropped_packets, mtu_packets, tcp_retransmits  # noqa: E402

from ringflow.testing import netns

pytestmark = [pytest.mark.usefixtures("no_leaked_shared_memory")]


pytestmark += [pytest.mark.netns, pytest.mark.long]
TIMEOUT_S = 20.0  # the communicator timeout the ranks run with


@pytest.fixture()
def cluster():
    reason = netns.available()
    if reason is not None:
        pytest.skip(f"multi-host emulation unavailable: {reason}")
    with netns.NetnsCluster(2) as cl:
        yield cl


def test_link_down_mid_collective_gives_every_rank_a_typed_error(cluster: netns.NetnsCluster, tmp_path: Path) -> None:
    per_host = 2
    with Job(4, "loop", tmp_path, ["--count", str(1 << 18), "--timeout", str(TIMEOUT_S), "--max-s", "90"],
             store_addr=f"{cluster.address(0)}:29623", wrap=lambda r, a: cluster.command(r // per_host, a)) as job:
        job.wait_ready(timeout_s=60)
        t_down = time.monotonic()
        cluster.link(1, False)
        assert job.wait(TIMEOUT_S + 30) == [0, 0, 0, 0], job.logs()
        for r in range(4):
            res = job.result(r)
            err = res["error"]
            assert err is not None and err["in_call"] == "all_reduce", res
            assert err["type"] in ("RemoteError", "Timeout"), err
            assert err["t"] - t_down < TIMEOUT_S, f"rank {r}: {err['t'] - t_down:.1f}s"
            assert res["wrong"] == 0
            if err["type"] == "RemoteError":  # names a peer: across the cut link, or a same-host rank that exited
                assert err["rank"] is not None and err["rank"] != r, err
        # the first error on each side is the heartbeat timeout naming a rank across the cut link
        first = min((job.result(r)["error"]["t"], r) for r in range(4))[1]
        assert job.result(first)["error"]["rank"] // per_host != first // per_host


def test_one_percent_packet_loss_keeps_collectives_correct(cluster: netns.NetnsCluster, tmp_path: Path) -> None:
    if shutil.which("nft") is None:
        pytest.skip("nftables (nft) is not installed")
    mtu_packets(cluster)
    before = tcp_retransmits(cluster)
    for h in range(2):
        cluster.set_loss(h, 1.0)
    sizes = [4096, 1 << 20, 8 << 20]
    with Job(2, "lossbench", tmp_path, ["--sizes", ",".join(map(str, sizes)), "--iters", "6", "--warm", "1",
                                        "--timeout", "60"],
             store_addr=f"{cluster.address(0)}:29624", wrap=lambda r, a: cluster.command(r, a)) as job:
        assert job.wait(120) == [0, 0], job.logs()
        for r in range(2):
            rows = job.result(r)["rows"]
            assert [row["size_bytes"] for row in rows] == sizes
            assert all(row["wrong"] == 0 for row in rows), rows
    dropped = dropped_packets(cluster)
    assert dropped > 0, "the loss rule dropped nothing"
    assert tcp_retransmits(cluster) - before >= dropped // 2, "TCP did not recover the dropped packets by resending"
