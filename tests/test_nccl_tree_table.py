"""NCCL's tree across servers from its table written in numpy, and the segment counts the analytic engine skips by
its lower bound, against the schedule flattened and every segment count simulated."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ringflow.errors import InvalidArgument
from ringflow.sim.api import endpoints_of, simulate_table
from ringflow.sim.nccl_tree import build_nccl_tree, simulate_nccl_tree, tree_table
from ringflow.sim.nvls import NVLS_CHUNKS
from ringflow.sim.transfers import from_schedule
from ringflow.topology import build_cluster


@pytest.mark.parametrize(("groups", "channels"), [
    ([[0, 1], [2, 3], [4, 5]], 2),
    ([[0, 1, 2, 3], [4, 5, 6, 7]], 4),
    ([[0, 3], [1, 4], [2, 5], [6, 7], [8, 9]], 2),   # servers' ranks interleaved, chunks of 1 / 3
    ([[0], [1], [2], [3], [4]], 1),                  # one GPU per server
])
@pytest.mark.parametrize("nsegs", [1, 3, 4])
def test_the_direct_table_has_the_schedule_s_rows(groups, channels, nsegs) -> None:
    full = from_schedule(build_nccl_tree(groups, channels, nsegs))
    got = tree_table(groups, channels, nsegs)
    assert got.mismatch(full) is None
    assert not got.lcopy.any() and not full.lcopy.any()


def test_the_table_refuses_one_server_and_no_segments() -> None:
    with pytest.raises(InvalidArgument, match="2 or more servers"):
        tree_table([[0, 1]], 1, 1)
    with pytest.raises(InvalidArgument, match="segments"):
        tree_table([[0, 1], [2, 3]], 1, 0)


def test_the_chosen_time_equals_every_segment_count_simulated_from_the_schedule() -> None:
    """Two DGX H100 servers: the fastest of the schedules' times at every segment count, bit for bit, from small
    sizes (where the bound skips segment counts) to large ones (where many segments win)."""
    topo = build_cluster("dgx-h100", 2)
    eps = endpoints_of(topo)
    groups = topo.host_groups(eps)
    tables = [from_schedule(build_nccl_tree(groups, 8, c)) for c in NVLS_CHUNKS if c <= 32]
    for protocol in (None, "ll", "simple"):
        for size in (8, 1 << 16, 1 << 20, 1 << 30):
            want = min(simulate_table(topo, t, size, endpoints=eps, protocol=protocol, checked=True).time_us
                       for t in tables)
            got = simulate_nccl_tree(topo, 16, size, protocol=protocol)
            assert got.time_us == want, (protocol, size)


def test_a_small_call_skips_the_large_segment_tables() -> None:
    """At 8 bytes the one-segment time bounds every other count out: only that table is built."""
    from ringflow.sim import nccl_tree
    topo = build_cluster("dgx-h100", 3)
    nccl_tree._cached_table.cache_clear()
    simulate_nccl_tree(topo, 24, 8)
    assert nccl_tree._cached_table.cache_info().misses == 1
    simulate_nccl_tree(topo, 24, 1 << 30)
    assert nccl_tree._cached_table.cache_info().misses > 2


def test_a_table_that_differs_from_its_schedule_is_named_by_its_first_different_field() -> None:
    groups = [[0, 1], [2, 3], [4, 5]]
    full = from_schedule(build_nccl_tree(groups, 2, 3))
    got = tree_table(groups, 2, 3)
    more = dataclasses.replace(got, nmsg=got.nmsg + (np.arange(got.ntransfers) == 5))
    assert more.mismatch(full) == "nmsg"
    assert dataclasses.replace(got, frac=got.frac * 1.01).mismatch(full) == "frac"
