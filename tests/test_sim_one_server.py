"""Ring all-gather and reduce-scatter inside one NVSwitch server, against what NCCL's source and its authors say.

- NCCL runs both as n - 1 steps of one chunk per channel (src/device/all_gather.h, reduce_scatter.h `runRing`),
  with the same chunk and slice steps (src/include/collectives.h: ALLGATHER_ and REDUCESCATTER_CHUNKSTEPS =
  NCCL_STEPS / 2, SLICESTEPS = NCCL_STEPS / 4): one time for both.
- Step 0 only sends (from the input), so every rank's link is busy from the first slice on: nothing fills
  across the n - 1 steps, and the time is affine in the size.
- "NCCL can get an effective NVLink bandwidth of 370GB/s, which you can observe as BusBw when running
  non-allreduce operations, or when running with NCCL_ALGO=RING" (S. Jeaugey, nccl-tests#212): one link
  efficiency for the ring all-reduce and for all-gather / reduce-scatter, whose reduction is no extra cost.
"""
from __future__ import annotations

import pytest

from ringflow.sim.api import simulate
from ringflow.sim.params import params_for
from ringflow.topology import load_topology

N = 8
SIZES = (2**27, 2**30, 2**33)


@pytest.fixture(scope="module")
def h100():
    return load_topology("dgx-h100")


def _times(topo, coll: str) -> list[float]:
    out = []
    for s in SIZES:
        res = simulate(topo, coll, s, algorithm="ring", nranks=N)
        assert res.protocol == "simple"
        out.append(res.time_us)
    return out


def test_ring_all_gather_and_reduce_scatter_take_the_same_time(h100) -> None:
    """Same steps, same chunks, same bytes per step: one time at every size."""
    assert _times(h100, "all_gather") == pytest.approx(_times(h100, "reduce_scatter"), rel=1e-12)


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_the_ring_time_is_affine_in_the_size_with_half_the_all_reduce_steps(h100, coll) -> None:
    """Slope (n - 1) / n of the buffer at the NVLink rate x its efficiency; fixed part NCCL's per-call base plus
    n - 1 per-step costs, where the ring all-reduce pays 2 (n - 1) of them: no term that fades with the size."""
    eff = params_for(h100).link_efficiency["nvlink"]
    t = _times(h100, coll)
    slope = (t[2] - t[1]) / (SIZES[2] - SIZES[1])
    assert slope == pytest.approx((N - 1) / N / (450e3 * eff), rel=1e-9)
    assert t[0] - slope * SIZES[0] == pytest.approx(t[1] - slope * SIZES[1], rel=1e-9)
    base_us = params_for(h100).protocol("simple").base_us
    ar = _times(h100, "all_reduce")
    ar_fixed = ar[1] - (ar[2] - ar[1]) / (SIZES[2] - SIZES[1]) * SIZES[1]
    assert t[1] - slope * SIZES[1] - base_us == pytest.approx((ar_fixed - base_us) / 2, rel=1e-9)


@pytest.mark.parametrize("coll", ["all_gather", "reduce_scatter"])
def test_large_ring_all_gathers_and_reduce_scatters_reach_the_ring_all_reduce_s_busbw(h100, coll) -> None:
    """One efficiency for all three (nccl-tests#212): at 8 GiB their busbw is the ring all-reduce's, within the
    per-call costs' share (the all-reduce pays twice the steps over twice the bytes)."""
    ring_ar = simulate(h100, "all_reduce", SIZES[2], algorithm="ring", nranks=N).busbw_GBps
    got = simulate(h100, coll, SIZES[2], algorithm="ring", nranks=N).busbw_GBps
    assert got == pytest.approx(ring_ar, rel=1e-3)
    assert got == pytest.approx(450 * params_for(h100).link_efficiency["nvlink"], rel=0.005)
