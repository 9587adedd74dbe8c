"""Counts and alpha-beta cost of schedules, on a flat switch and on topologies; the tuner and RINGFLOW_ALGO."""
from __future__ import annotations

import pytest

from ringflow import config
from ringflow.algorithms import cost, registry, tuner
from ringflow.algorithms.layout import CallShape
from ringflow.algorithms.schedule import Collective
from ringflow.errors import ConfigError, TopologyError, UnknownAlgorithm
from ringflow.topology import LinkType, NodeKind, Topology, load_topology

AR = Collective.ALL_REDUCE


def test_traffic_per_pair_of_ring_allreduce() -> None:
    n, count = 4, 1024
    tr = cost.traffic(registry.get_schedule(AR, "ring", n), CallShape(AR, n, count))
    S = count * 4
    assert tr.steps == 2 * (n - 1)
    assert set(tr.pair_bytes) == {(j, (j + 1) % n) for j in range(n)}
    assert all(v == 2 * (n - 1) * S // n for v in tr.pair_bytes.values())
    assert tr.bytes_sent == tr.bytes_recv == (2 * (n - 1) * S // n,) * n


def test_flat_cost_is_alpha_beta_closed_form() -> None:
    n, count = 8, 1 << 20
    S = count * 4
    c = cost.schedule_cost(registry.get_schedule(AR, "ring", n), CallShape(AR, n, count), alpha_us=3.0, beta_GBps=20.0,
                           msg_us=0.0)
    assert c.steps == 14 and c.bytes_per_rank == 2 * (n - 1) * S // n
    assert c.time_s == pytest.approx(14 * 3e-6 + 2 * (n - 1) / n * S / 20e9)
    one = cost.schedule_cost(registry.get_schedule(AR, "one_shot", n), CallShape(AR, n, count), alpha_us=3.0,
                             beta_GBps=20.0, msg_us=0.0)
    assert one.time_s == pytest.approx(3e-6 + (n - 1) * S / 20e9)


def _two_hosts(uplink_GBps: float) -> Topology:
    """Two hosts of two GPUs each on a local switch; the switches share one uplink."""
    t = Topology("two-hosts")
    for h in range(2):
        sw = t.add_node(f"h{h}/sw", NodeKind.NET_SWITCH, host=h, tier=0)
        for i in range(2):
            g = t.add_node(f"h{h}/gpu{i}", NodeKind.GPU, host=h, index=i)
            t.add_link(g, sw, LinkType.NVLINK, 100.0, 1.0)
    t.add_link("h0/sw", "h1/sw", LinkType.IB, uplink_GBps, 2.0)
    return t


def test_topology_cost_shares_bottleneck_links() -> None:
    t = _two_hosts(10.0)
    shape = CallShape(Collective.ALL_TO_ALL, 4, 1 << 18)  # 1 MiB per peer
    s = registry.get_schedule(Collective.ALL_TO_ALL, "pairwise", 4)
    c = cost.schedule_cost(s, shape, t, alpha_us=0.0)
    # step 1 (shift 2): both host-0 ranks send 1 MiB across the one uplink each way -> 2 MiB / 10 GB/s,
    # plus the path latency 1 + 2 + 1 us
    per = 1 << 20
    assert c.step_times_s[1] == pytest.approx(4.0e-6 + 2 * per / 10e9)
    faster = cost.schedule_cost(s, shape, _two_hosts(40.0), alpha_us=0.0)
    assert faster.time_s < c.time_s
    with pytest.raises(TopologyError, match="endpoints"):
        cost.schedule_cost(registry.get_schedule(AR, "ring", 8), CallShape(AR, 8, 8), t)


def test_tuner_small_vs_large_on_dgx_h100() -> None:
    topo = load_topology("dgx-h100")
    small = tuner.choose(AR, 1024, 8, topo)
    large = tuner.choose(AR, 256 << 20, 8, topo)
    assert registry.info(small.algorithm).closed_form(AR, 8).steps <= 2      # latency-bound: fewest steps
    lf = registry.info(large.algorithm).closed_form(AR, 8, large.nsegs, large.nchannels)
    assert lf.bytes_fraction == registry.F(2 * 7, 8)                         # bandwidth-optimal bytes
    assert small.candidates[0].time_s == small.time_s
    assert [c.time_s for c in large.candidates] == sorted(c.time_s for c in large.candidates)
    assert {c.algorithm for c in large.candidates} >= set(registry.algorithms_for(AR)) - {
        "hierarchical", "one_shot", "dissemination", "param_server", "sharded_ps"}   # n-copy scratch: not at 256 MiB


def test_tuner_skips_scratch_hungry_candidates_unless_asked() -> None:
    big = tuner.choose(AR, 256 << 20, 8)
    assert all(c.scratch_bytes <= 2 * (256 << 20) for c in big.candidates)
    assert "one_shot" not in {c.algorithm for c in big.candidates}
    assert "one_shot" in {c.algorithm for c in tuner.choose(AR, 4096, 8).candidates}
    sharded = next(c for c in big.candidates if c.algorithm == "sharded_ps")
    assert sharded.scratch_bytes == 256 << 20  # n copies of its own 1/n block: S, not n S
    with config.override(ALGO="one_shot"):
        forced = tuner.choose(AR, 256 << 20, 8)
    assert forced.algorithm == "one_shot" and forced.candidates[0].scratch_bytes == 8 * (256 << 20)


def test_tuner_multi_host_has_hierarchical_and_channels() -> None:
    topo = load_topology("2xdgx-h100")
    ch = tuner.choose(AR, 64 << 20, 16, topo)
    algos = {c.algorithm for c in ch.candidates}
    assert "hierarchical" in algos
    assert max(c.nchannels for c in ch.candidates if c.algorithm == "ring") > 1  # one ring per NIC rail
    assert ch.time_s == min(c.time_s for c in ch.candidates)
    sched = ch.schedule()
    assert sched.algorithm == ch.algorithm and sched.nchannels == ch.nchannels


def test_tuner_without_topology_and_cache() -> None:
    a = tuner.choose(AR, 1 << 20, 8)
    assert a is tuner.choose(AR, (1 << 20) - 5, 8)  # same size bucket -> the cached object
    assert tuner.choose(Collective.BARRIER, 0, 5).algorithm == "dissemination"
    assert tuner.choose(Collective.ALL_TO_ALLV, 4096, 4).algorithm == "pairwise"
    assert tuner.choose("broadcast", 1 << 26, 8).nsegs > 1  # pipelining pays for large broadcasts


def test_ringflow_algo_restricts_choice() -> None:
    with config.override(ALGO="ring"):
        assert tuner.choose(AR, 1024, 8).algorithm == "ring"
        assert tuner.choose(Collective.ALL_TO_ALL, 1024, 8).algorithm in registry.algorithms_for("all_to_all")
    with config.override(ALGO="allreduce:tree;allgather:bruck"):
        assert tuner.choose(AR, 1 << 24, 8).algorithm == "tree"
        assert tuner.choose(Collective.ALL_GATHER, 1 << 24, 8).algorithm == "bruck"
    with config.override(ALGO="^one_shot,sharded_ps,param_server"):
        assert tuner.choose(AR, 1024, 8).algorithm not in ("one_shot", "sharded_ps", "param_server")


def test_ringflow_algo_errors_list_valid_names() -> None:
    with config.override(ALGO="rnig"):
        with pytest.raises(UnknownAlgorithm, match="valid algorithms: ring, tree"):
            tuner.choose(AR, 1024, 8)
    with config.override(ALGO="allreduce:bruck"):
        with pytest.raises(UnknownAlgorithm, match="does not implement all_reduce.*ring"):
            tuner.choose(AR, 1024, 8)
    with config.override(ALGO="allreduse:ring"):
        with pytest.raises(ConfigError, match="allreduse"):
            tuner.choose(AR, 1024, 8)
    with pytest.raises(UnknownAlgorithm, match="valid algorithms"):
        registry.get_schedule(AR, "nope", 4)
