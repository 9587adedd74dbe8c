"""Small all-reduces across NVLink racks: the simulated NVLS-Tree pays one message per step between a GPU and its
switch (NCCL's scatter and gather primitives), so its 8-byte time is a few hops, as NCCL's own model says."""
from __future__ import annotations

import numpy as np
import pytest

from ringflow.algorithms import registry
from ringflow.algorithms.schedule import Collective
from ringflow.sim import nccl_tuner
from ringflow.sim.api import endpoints_of
from ringflow.sim.nvls import server_switches, simulate_switch_algorithm, switch_schedule_table
from ringflow.sim.nvls_tree import tree_table
from ringflow.topology import build_cluster

AR = Collective.ALL_REDUCE


def test_rows_between_a_gpu_and_its_switch_are_one_message_each() -> None:
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    s = registry.get_schedule(AR, "nvls_tree", 8, nsegs=4, host_groups=groups)
    tab = switch_schedule_table(s)
    assert np.all(tab.nmsg == 1)
    assert np.array_equal(tree_table(groups, 4).nmsg, np.ones(tab.ntransfers, dtype=np.int64))
    into = (tab.step == 0) & (tab.src == 0) & (tab.dst == 8)     # GPU 0's four blocks of segment 0, one row
    assert into.sum() == 1 and tab.frac[into][0] == pytest.approx(4 / 16)


def test_an_eight_byte_all_reduce_over_two_nvl72_racks_costs_a_few_hops() -> None:
    """144 GPUs: 4 NVLink steps (scatter, reduced block, final block, multicast) and 2 network steps, not 72
    messages per scatter; within 30 % of NCCL's model (53 us: 25 + 2 x 14)."""
    topo = build_cluster("gb200-nvl72", 2)
    res = simulate_switch_algorithm(topo, "nvls_tree", 144, 8)
    want = nccl_tuner.choose(nccl_tuner.system_for(topo, 144), AR, 8)
    assert want.algorithm == "nvls_tree"
    assert res.time_us == pytest.approx(want.time_us, rel=0.3)
    assert res.time_us < 80


def test_small_nvls_tree_time_grows_with_the_tree_depth_not_the_rack_size() -> None:
    """Two racks of 72 GPUs and two of 8 (an NVL72 partition, the same step pattern) take the same latency-bound
    time at 8 bytes: the per-step cost does not scale with the GPUs behind a switch."""
    big = build_cluster("gb200-nvl72", 2)
    eps = endpoints_of(big)
    small_eps = [g for h in big.hosts() for g in big.gpus(h)[:8]]
    t_big = simulate_switch_algorithm(big, "nvls_tree", len(eps), 8).time_us
    t_small = simulate_switch_algorithm(big, "nvls_tree", 16, 8, endpoints=small_eps).time_us
    assert t_big == pytest.approx(t_small, rel=0.05)
    groups = [list(g) for g in big.host_groups(small_eps)]
    assert len(server_switches(big, groups, small_eps)) == 2


@pytest.mark.long
def test_an_eight_byte_nvls_tree_over_twenty_racks_is_a_few_hops_per_tree_level() -> None:
    """1,440 GPUs (3 switch tiers): NCCL's model says 25 + 2 x log2(20) x 14 = 137 us; the simulation stays a
    few hops per level of the tree of servers (its two children a step apart), never 72 messages a step."""
    topo = build_cluster("gb200-nvl72", 20, tiers=3)
    res = simulate_switch_algorithm(topo, "nvls_tree", 1440, 8)
    sys_ = nccl_tuner.system_for(topo, 1440)
    want = nccl_tuner.algo_time_us(sys_, AR, "nvls_tree", "simple", 8)
    assert want is not None
    assert res.time_us == pytest.approx(want, rel=0.3)
