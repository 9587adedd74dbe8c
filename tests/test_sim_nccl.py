"""NCCL's GPU algorithms as verified schedules (switch participants), NCCL's tuning model, PXN routes."""
from __future__ import annotations

import dataclasses

import pytest

from ringflow.algorithms import registry
from ringflow.algorithms.layout import CallShape
from ringflow.algorithms.schedule import Buffer, ChunkRef, Collective, Op, OpKind, Schedule
from ringflow.algorithms.verifier import check_algorithm, verify
from ringflow.errors import InvalidArgument, UnknownAlgorithm, VerificationError
from ringflow.sim import nccl_tuner as nt
from ringflow.topology import build_cluster, load_topology

AR, AG, RS = Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER
CASES = [(c, a.name) for a in registry.NCCL_ALGORITHMS.values() for c in a.collectives]


@pytest.mark.parametrize("collective,algorithm", CASES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8, 9, 16])
@pytest.mark.parametrize("nsegs", [1, 3])
def test_nccl_schedules_verify(collective: Collective, algorithm: str, n: int, nsegs: int) -> None:
    # builds, proves (counts 0, 1, n-1, 7n+3; in place for all-reduce) and matches the closed form
    out = check_algorithm(collective, algorithm, n, nsegs=nsegs)
    assert out["algorithm"] == algorithm
    assert out["in_place_checked"] == (collective == AR)


def test_grouped_algorithms_take_host_groups() -> None:
    groups = [[0, 2, 4], [1, 3, 5]]   # two servers of 3, interleaved rank numbers
    for coll, algo in ((AR, "nvls_tree"), (AR, "collnet_direct"), (AR, "collnet_chain"),
                       (Collective.ALL_TO_ALL, "pxn")):
        s = registry.get_schedule(coll, algo, 6, nsegs=2, host_groups=groups)
        verify(s, [CallShape(coll, 6, k) for k in (0, 5, 31)])
        assert s.nswitches == (0 if algo == "pxn" else (2 if algo == "nvls_tree" else 1))


def test_gpu_only_algorithms_stay_out_of_the_runtime_registry() -> None:
    for name in registry.NCCL_ALGORITHMS:
        assert name not in registry.ALGORITHMS
        for c in registry.info(name).collectives:
            assert name not in registry.algorithms_for(c)
            assert name in registry.gpu_algorithms_for(c)
    with pytest.raises(UnknownAlgorithm):
        registry.info("no_such_algorithm")


def test_switch_schedule_round_trips_json() -> None:
    s = registry.get_schedule(AR, "nvls", 4, nsegs=2)
    again = Schedule.from_json(s.dumps())
    assert again.nswitches == 1 and again.programs == s.programs
    verify(again)
    assert "switch" in s.table()


def test_nvls_moves_n_plus_1_over_n_per_gpu() -> None:
    from ringflow.algorithms.cost import traffic
    n = 8
    s = registry.get_schedule(AR, "nvls", n, nsegs=4)
    tr = traffic(s, CallShape(AR, n, 8 * 4 * 16))
    S = 8 * 4 * 16 * 4
    assert set(tr.bytes_sent) == {S * (n + 1) // n} and set(tr.bytes_recv) == {S * (n + 1) // n}
    # a ring moves 2(n-1)/n S per GPU: NVLS moves less, which is why NVLS's busbw is higher
    ring = traffic(registry.get_schedule(AR, "ring", n), CallShape(AR, n, 8 * 4 * 16))
    assert tr.bytes_per_rank < ring.bytes_per_rank


def _with_op(s: Schedule, who: int, step: int, op: Op) -> Schedule:
    progs = [list(p) for p in s.programs]
    progs[who][step] = tuple(progs[who][step]) + (op,)
    return dataclasses.replace(s, programs=tuple(tuple(p) for p in progs))


def test_verifier_refuses_a_switch_with_input() -> None:
    s = registry.get_schedule(AR, "nvls", 3)
    bad = _with_op(s, 3, 1, Op(OpKind.COPY, src=ChunkRef(Buffer.IN, 0), dst=ChunkRef(Buffer.SCRATCH, 0)))
    with pytest.raises(VerificationError, match="switch"):
        verify(bad)


def test_verifier_catches_a_switch_summing_twice() -> None:
    s = registry.get_schedule(AR, "nvls", 3)
    bad = _with_op(s, 3, 0, Op(OpKind.REDUCE, src=ChunkRef(Buffer.SCRATCH, 3), dst=ChunkRef(Buffer.SCRATCH, 0)))
    with pytest.raises(VerificationError, match="reduced twice"):
        verify(bad)


# ------------------------------------------------------------------------------------------------ NCCL tuner
@pytest.fixture(scope="module")
def dgx() -> object:
    return load_topology("dgx-h100")


def test_dgx_h100_all_reduce_choice_follows_nccls_rules(dgx: object) -> None:
    # NCCL 2.23+ tuning.cc on 1 x DGX H100 (8 GPUs, NVLS-capable): LL for small calls, NVLS (Simple only) for large
    sys_ = nt.system_for(dgx, 8)
    assert sys_.nvls and sys_.nnodes == 1 and sys_.compcap == 90
    small = nt.choose(sys_, AR, 4096)
    assert small.protocol == "ll" and small.algorithm in ("ring", "tree")
    large = nt.choose(sys_, AR, 1 << 30)
    assert (large.algorithm, large.protocol) == ("nvls", "simple")
    # the model's own terms: the small call is latency-bound (time ~ NCCL's latency), the large one bandwidth-bound
    lat = nt.latency_us(sys_, AR, small.algorithm, small.protocol)
    assert small.time_us == pytest.approx(lat, rel=0.05)
    assert ("nvls_tree", "simple") not in large.candidates       # one node: NVLS-Tree disabled
    assert ("collnet_direct", "simple") not in large.candidates  # no SHARP


def test_dgx_h100_all_gather_keeps_ring_for_large(dgx: object) -> None:
    sys_ = nt.system_for(dgx, 8)
    big = nt.choose(sys_, AG, 1 << 30)
    assert big.algorithm == "ring" and ("nvls", "simple") in big.candidates
    assert big.candidates[("nvls", "simple")] > big.time_us


def test_multinode_rules_nvls_tree_pat_collnet() -> None:
    cl = build_cluster("dgx-h100", 4)
    sys_ = nt.system_for(cl, 32)
    assert sys_.nnodes == 4 and sys_.nics_per_node == 8
    assert sys_.run_channels() == 2 * 8                    # NCCL: one searched channel per NIC, doubled
    assert nt.system_for(load_topology("dgx-h100"), 8).run_channels() == 24   # nccl#578, #1367
    c = nt.choose(sys_, AR, 64 << 20)
    assert ("nvls", "simple") not in c.candidates        # NVLS across servers needs CollNet (SHARP)
    assert ("nvls_tree", "simple") in c.candidates
    sharp = nt.choose(nt.system_for(cl, 32, collnet=True), AR, 64 << 20)
    assert ("collnet_direct", "simple") in sharp.candidates and ("nvls", "simple") in sharp.candidates
    one_per_node = nt.system_for(cl, 4, endpoints=[cl.gpus(host=h)[0] for h in range(4)])
    assert one_per_node.nics_per_node == 1
    assert ("pat", "simple") in nt.choose(one_per_node, AG, 1 << 20).candidates
    assert ("pat", "simple") not in nt.choose(sys_, AG, 1 << 20).candidates   # PAT: one GPU per node only


def test_nccl_tuner_refuses_all_to_all(dgx: object) -> None:
    with pytest.raises(InvalidArgument):
        nt.choose(nt.system_for(dgx, 8), Collective.ALL_TO_ALL, 1024)


def test_nvls_busbw_beats_ring_on_h100(dgx: object) -> None:
    from ringflow.sim.api import simulate
    size = 256 << 20
    nvls = simulate(dgx, AR, size, algorithm="nvls", nranks=8)
    ring = simulate(dgx, AR, size, algorithm="ring", nranks=8)
    assert nvls.busbw_GBps > 1.15 * ring.busbw_GBps
    sys_ = nt.system_for(dgx, 8)   # NCCL's model agrees on the direction
    assert nt.algo_time_us(sys_, AR, "nvls", "simple", size) < nt.algo_time_us(sys_, AR, "ring", "simple", size)


def test_nccl_rows_simulate_the_chosen_algorithm(dgx: object) -> None:
    rows = nt.nccl_rows(dgx, AR, [4096, 64 << 20], 8)
    assert [r["algorithm"] for r in rows][-1] == "nvls"
    assert all(r["sim_time_us"] is not None and r["sim_time_us"] > 0 for r in rows)
    assert rows[0]["busbw_GBps"] < rows[1]["busbw_GBps"]


def test_cli_sim_nccl_json(dgx: object) -> None:
    import json

    from typer.testing import CliRunner

    from ringflow.cli import build_app
    app = build_app()
    res = CliRunner().invoke(app, ["sim", "all_reduce", "--topo", "dgx-h100", "--nccl", "-b", "1KiB", "-e", "4MiB",
                                   "-f", "64", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert {r["engine"] for r in rows} == {"nccl-model"} and all(r["protocol"] for r in rows)
    bad = CliRunner().invoke(app, ["sim", "all_reduce", "--topo", "dgx-h100", "--nccl", "--algo", "ring"])
    assert bad.exit_code != 0


# ------------------------------------------------------------------------------------------------------- PXN
def test_pxn_route_uses_the_rail_nic() -> None:
    from ringflow.algorithms.nccl_pxn import pxn_route, rail_nic
    cl = build_cluster("dgx-h100", 2)
    src, dst = cl.gpus(host=0)[0], cl.gpus(host=1)[3]
    route = pxn_route(cl, src, dst)
    peer = cl.gpus(host=0)[3]
    assert route[0] == src and route[-1] == dst and peer in route
    nics = [x for x in route if x in set(cl.nics())]
    rail = cl.graph.nodes[rail_nic(cl, dst)]["rail"]
    assert nics and all(cl.graph.nodes[x]["rail"] == rail for x in nics)
    assert rail_nic(cl, src) not in route          # the source's own NIC (another rail) is not used
    assert pxn_route(cl, src, cl.gpus(host=0)[5]) == cl.path(src, cl.gpus(host=0)[5])


def test_pxn_all_to_all_never_crosses_rails() -> None:
    groups = [list(range(4)), list(range(4, 8))]
    s = registry.get_schedule(Collective.ALL_TO_ALL, "pxn", 8, host_groups=groups)
    for r, _step, op in s.ops():
        if op.kind == OpKind.SEND and op.peer is not None and (r < 4) != (op.peer < 4):
            assert r % 4 == op.peer % 4      # inter-server messages stay on their rail


def test_pat_is_chosen_and_simulated_with_one_gpu_per_node() -> None:
    cl = build_cluster("dgx-h100", 8)
    eps = [cl.gpus(host=h)[0] for h in range(8)]
    rows = nt.nccl_rows(cl, AG, [64 << 10], 8, endpoints=eps)
    # NCCL 2.23+: PAT (Simple) for mid-size all-gathers at one GPU per node: log2(8) network steps
    assert (rows[0]["algorithm"], rows[0]["protocol"]) == ("pat", "simple")
    assert rows[0]["sim_time_us"] is not None and rows[0]["sim_time_us"] > 0
    big = nt.choose(nt.system_for(cl, 8, endpoints=eps), AG, 64 << 20)
    assert big.algorithm == "ring" and big.candidates[("pat", "simple")] > big.time_us   # PAT's 0.75 bandwidth


def test_switch_schedules_simulate_on_the_cluster() -> None:
    from ringflow.sim.api import simulate
    from ringflow.sim.nvls import simulate_switch_algorithm, switch_nodes
    cl = build_cluster("dgx-h100", 2)
    size = 64 << 20
    ring = simulate(cl, AR, size, algorithm="ring", nranks=16)
    sharp = simulate_switch_algorithm(cl, "collnet_direct", 16, size)
    tree = simulate_switch_algorithm(cl, "nvls_tree", 16, size)
    assert sharp.nranks == tree.nranks == 16 and len(sharp.rank_finish_us) == 16
    nic = {r: {d["tier"]: d["bytes"] for d in res.tiers()}["nic"] for r, res in (("ring", ring), ("sharp", sharp))}
    assert nic["sharp"] < 0.75 * nic["ring"]     # the switch sums: each server sends its partial once
    s = registry.get_schedule(AR, "nvls_tree", 16, host_groups=[list(range(8)), list(range(8, 16))])
    assert switch_nodes(cl, s, cl.endpoints()[:16]) == ["h0/nvsw0", "h1/nvsw0"]
    assert tree.time_us > 0


def test_simulate_takes_switch_algorithms_by_name() -> None:
    """sim.api.simulate places a switch algorithm's switches like `ringflow sim --nccl` does; other collectives
    get a typed error naming the fix."""
    from ringflow.errors import InvalidArgument
    from ringflow.sim.api import simulate
    from ringflow.sim.nvls import simulate_switch_algorithm
    from ringflow.topology.cluster import build_cluster
    topo = build_cluster("dgx-h100", 2)
    got = simulate(topo, "all_reduce", 64 * 2**20, algorithm="nvls_tree")
    want = simulate_switch_algorithm(topo, "nvls_tree", 16, 64 * 2**20)
    assert got.time_us == want.time_us > 0
    with pytest.raises(InvalidArgument, match="an all_reduce algorithm"):
        simulate(topo, "all_gather", 64 * 2**20, algorithm="nvls_tree")


def test_nvl72_racks_drive_at_most_32_channels_and_a_ring_runs_at_its_nvlink_share() -> None:
    racks = build_cluster("gb200-nvl72", 2)
    sys_ = nt.system_for(racks, 144)
    assert sys_.nics_per_node == 72
    assert sys_.channels() == nt.GRAPH_MAX_CHANNELS == 32          # NCCL's ring graph: MAXCHANNELS / 2
    assert sys_.run_channels() == 32                               # duplicates stay within the graph's 32
    nic_GBps = sys_.bw_inter_GBps / 32
    assert 40 < nic_GBps <= 50                                     # ConnectX-7 400 Gb/s, 32 of the 72 driven
    ring_busbw = nt.bandwidth_GBps(sys_, AR, "ring", "simple") * 2 * 143 / 144
    assert ring_busbw == pytest.approx(sys_.bw_intra_GBps, rel=1e-6)   # the NVLink share bounds every channel
    h100 = nt.system_for(build_cluster("dgx-h100", 2), 16)
    h100_ring = nt.bandwidth_GBps(h100, AR, "ring", "simple") * 2 * 15 / 16
    assert h100_ring == pytest.approx(min(h100.bw_intra_GBps, h100.bw_inter_GBps), rel=1e-6)


@pytest.mark.parametrize("coll", ["broadcast", "reduce"])
def test_the_simulation_of_nccls_ring_broadcast_is_pipelined_like_nccls(coll: str) -> None:
    # NCCL pipelines its ring broadcast and reduce in chunks; simulated store-and-forward, 1 GiB on one DGX H100
    # took 7x NCCL's own prediction
    row = nt.nccl_rows(load_topology("dgx-h100"), coll, [1 << 30], 8)[0]
    assert row["algorithm"] == "ring"
    assert row["time_us"] <= row["sim_time_us"] < 1.5 * row["time_us"]
