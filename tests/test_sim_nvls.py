"""NVLS (in-switch reduction) in the simulator: traffic, time and refusals, hand-computed."""
from __future__ import annotations

import pytest

from ringflow.errors import InvalidArgument
from ringflow.sim.api import choose_algorithm, simulate
from ringflow.sim.nvls import NVLS_EFFICIENCY, nvls_table
from ringflow.sim.params import params_for
from ringflow.topology import load_topology
from ringflow.workload.validation import cluster_for

N = 8


@pytest.fixture(scope="module")
def h100():
    return load_topology("dgx-h100")


def _link(res, a: str, b: str) -> float:
    fab = res.fabric
    return float(res.link_bytes[fab._link_ids([a, b])].sum())


@pytest.mark.parametrize("chunks", [1, 4])
def test_each_gpu_streams_n_plus_1_over_n_of_the_buffer_each_way_and_both_engines_agree(h100, chunks) -> None:
    """A GPU sends every shard once to the switch and its own summed shard once more (n + 1) / n x S
    out; it gets its summed shard and all n copies back, (n + 1) / n x S in (a ring: 2 (n - 1) / n)."""
    S = 2**30
    got = {e: simulate(h100, "all_reduce", S, algorithm="nvls", nranks=N, nsegs=chunks, engine=e)
           for e in ("analytic", "flow")}
    for res in got.values():
        for g in ("h0/gpu0", "h0/gpu5"):
            assert _link(res, g, "h0/nvsw0") == pytest.approx((N + 1) / N * S, rel=1e-9)
            assert _link(res, "h0/nvsw0", g) == pytest.approx((N + 1) / N * S, rel=1e-9)
    assert got["flow"].time_us == pytest.approx(got["analytic"].time_us, rel=1e-6)


def test_the_pipeline_time_is_the_busiest_direction_per_step_at_the_nvls_rate(h100) -> None:
    """C chunks, C + 1 steps: the first only reduces (1/C of S out per GPU), the last only copies
    (1/C in), each step between carries (n + 1) / (n C) each way; bytes move at the NVLink rate x the
    link efficiency x NCCL's NVLS efficiency. The slope between two sizes leaves the fixed costs out."""
    prm = params_for(h100)
    rate_Bpus = 450e3 * prm.link_efficiency["nvlink"] * NVLS_EFFICIENCY[3]
    for C in (1, 2, 8):
        t = [simulate(h100, "all_reduce", s, algorithm="nvls", nranks=N, nsegs=C).time_us for s in (2**30, 2**31)]
        per_byte = 2 / C + (C - 1) * (N + 1) / (N * C)
        assert (t[1] - t[0]) == pytest.approx(2**30 * per_byte / rate_Bpus, rel=1e-9)


def test_the_default_h100_all_reduce_is_nvls_for_large_buffers_and_never_on_a100(h100) -> None:
    """The simulator's own choice meets NCCL's: NVLS on a Hopper server for large buffers (the
    published 480 GB/s busbw, `ringflow validate gpu`), never on Ampere's NVSwitch (no NVLS)."""
    assert choose_algorithm(h100, "all_reduce", N, 2**33) == "nvls"
    res = simulate(h100, "all_reduce", 2**33, nranks=N)
    assert res.algorithm == "nvls" and res.protocol == "simple"
    assert res.busbw_GBps == pytest.approx(480.0, rel=0.05)
    a100 = load_topology("dgx-a100")
    assert all(choose_algorithm(a100, "all_reduce", N, s) != "nvls" for s in (2**20, 2**33))


def test_nvls_is_refused_where_no_switch_can_reduce(h100) -> None:
    """Ampere's NVSwitch, ranks on two servers, collectives other than all-reduce: a typed error
    that says what to use instead."""
    with pytest.raises(InvalidArgument, match="NVSwitch gen3"):
        simulate(load_topology("dgx-a100"), "all_reduce", 2**20, algorithm="nvls", nranks=N)
    with pytest.raises(InvalidArgument, match="one server"):
        simulate(cluster_for("dgx-h100", 2), "all_reduce", 2**20, algorithm="nvls", nranks=2 * N)
    with pytest.raises(InvalidArgument, match="all_reduce, reduce_scatter and all_gather"):
        simulate(h100, "broadcast", 2**20, algorithm="nvls", nranks=N)
    with pytest.raises(InvalidArgument, match="2 or more ranks"):
        nvls_table(1, 4)


def test_the_planner_s_closed_form_takes_nvls_where_the_simulator_does(h100) -> None:
    """`AlphaBetaModel` (the planner's search model) prices an all-reduce inside an H100 server as NVLS,
    within the pipeline's fill (1/65 at 64 chunks) of the simulator; on A100 it stays the ring."""
    from ringflow.workload.commmodel import AlphaBetaModel, SimModel
    group = h100.endpoints()[:N]
    S = 2**33
    ab, sim = AlphaBetaModel().time_s("all_reduce", S, group, h100), SimModel().time_s("all_reduce", S, group, h100)
    assert ab == pytest.approx(sim, rel=0.03) and ab < 0.8 * 2 * (N - 1) / N * S / (450e9 * 0.822)
    a100 = load_topology("dgx-a100")
    g = a100.endpoints()[:N]
    from ringflow.hardware.nvlink import nvlink_efficiency_scale  # NVLink3 against NVLink4 (NCCL's figures)
    ring = 2 * (N - 1) / N * S / (300e9 * params_for(a100).link_efficiency["nvlink"] * nvlink_efficiency_scale(3))
    assert AlphaBetaModel().time_s("all_reduce", S, g, a100) == pytest.approx(ring, rel=0.01)


@pytest.mark.parametrize("coll, out_frac, in_frac", [("reduce_scatter", 1.0, 1 / N), ("all_gather", 1 / N, 1.0)])
def test_reduce_scatter_and_all_gather_stream_one_half_each(h100, coll, out_frac, in_frac) -> None:
    """NVLS reduce-scatter: a GPU sends S (every shard to the switch) and receives S / n (its sum);
    all-gather the reverse (NCCL #1083). Both engines agree, and the time grows by the busier
    direction's bytes at the NVLS rate (one chunk: one step)."""
    S = 2**30
    got = {e: simulate(h100, coll, S, algorithm="nvls", nranks=N, nsegs=1, engine=e) for e in ("analytic", "flow")}
    for res in got.values():
        for g in ("h0/gpu0", "h0/gpu3"):
            assert _link(res, g, "h0/nvsw0") == pytest.approx(out_frac * S, rel=1e-9)
            assert _link(res, "h0/nvsw0", g) == pytest.approx(in_frac * S, rel=1e-9)
    assert got["flow"].time_us == pytest.approx(got["analytic"].time_us, rel=1e-6)
    rate_Bpus = 450e3 * params_for(h100).link_efficiency["nvlink"] * NVLS_EFFICIENCY[3]
    t = [simulate(h100, coll, s, algorithm="nvls", nranks=N, nsegs=1).time_us for s in (2**30, 2**31)]
    assert t[1] - t[0] == pytest.approx(2**30 / rate_Bpus, rel=1e-9)


@pytest.mark.parametrize("coll", ["reduce_scatter", "all_gather"])
def test_large_reduce_scatters_and_all_gathers_keep_the_ring_as_nccl_does(h100, coll) -> None:
    """The busier direction carries S with NVLS against (n - 1) / n x S with a ring, at a lower
    rate: for 8 GiB the simulator's own choice is not NVLS, and the closed form agrees; for 1 MiB the
    ring's n - 1 steps cost more than NVLS's one."""
    from ringflow.workload.commmodel import AlphaBetaModel
    assert choose_algorithm(h100, coll, N, 2**33) != "nvls"
    big = {a: simulate(h100, coll, 2**33, algorithm=a, nranks=N).time_us for a in ("ring", "nvls")}
    assert big["ring"] < big["nvls"]
    small = {a: simulate(h100, coll, 2**20, algorithm=a, nranks=N).time_us for a in ("ring", "nvls")}
    assert small["nvls"] < small["ring"]
    group = h100.endpoints()[:N]
    eff = params_for(h100).link_efficiency["nvlink"]
    ring = (N - 1) / N * 2**33 / (450e9 * eff)
    assert AlphaBetaModel().time_s(coll, 2**33, group, h100) == pytest.approx(ring, rel=0.01)
