"""Seed 004's traffic table, the 3-D total, switch sizing, and ringflow's real algorithms beside them."""
from __future__ import annotations

import pytest

from ringflow.errors import InvalidArgument
from ringflow.workload import load_model
from ringflow.workload.layout import Layout
from ringflow.workload.seed_traffic import C4_SAMPLES, C4_TOKENS, seed_3d, seed_rows, switch_sizing
from ringflow.workload.traffic import exact_1d, exact_3d, storage_traffic
from ringflow.workload.validation import cluster_for

M = load_model("llama3-70b")
N = C4_SAMPLES / 2048


def _rows():
    return {r.mode: r for r in seed_rows(M.nominal(), C4_TOKENS, M.layers, M.hidden, 8, N)}


def test_seed_table_reproduced_as_printed():
    rows = _rows()
    assert rows["DP"].seed_printed == (1396, 0)
    assert rows["FSDP"].seed_printed == (175, 175)
    assert rows["TP"].seed_printed == (26622, 21840)
    assert rows["PP"].seed_printed == (17.9, 17.9)
    syncs = {m: (r.backward_syncs, r.forward_transfers) for m, r in rows.items()}
    assert syncs == {"DP": (1, 0), "FSDP": (80, 80), "TP": (160, 160 * 156e9), "PP": (7, 7)}


def test_seed_formulas_exactly():
    P, T, L, H, G = 70e9, 156e9, 80, 8192, 8
    rows = _rows()
    assert rows["DP"].backward_bytes == pytest.approx(2 * N * P * G * (G - 1))
    assert rows["FSDP"].forward_bytes == pytest.approx(2 * N * P * (G - 1))
    assert rows["TP"].backward_bytes == pytest.approx(4 * N * P * L * (G - 1))
    assert rows["TP"].forward_bytes == pytest.approx(4 * L * T * H * (G - 1) * G)
    # the seed's TP forward "21840 PB" is exactly this many bytes in units of 2^20 x 1e9
    assert rows["TP"].forward_bytes / (2**20 * 1e9) == pytest.approx(21840.0, abs=1e-6)
    assert rows["PP"].backward_bytes == pytest.approx(2 * T * H * (G - 1))


def test_3d_about_85_eb_and_switch_sizing():
    d = seed_3d(M.nominal(), C4_TOKENS, M.layers, M.hidden, N, 8, 8, 16)
    assert d["gpus"] == 1024
    assert round(d["total_EB"]) == 85
    s = switch_sizing(d["total_bytes"], 51.2, 100, 100)
    assert round(s["seed_days_per_epoch"]) in (19, 20) and s["seed_switches"] == 20
    assert s["days_per_epoch"] == pytest.approx(8 * s["seed_days_per_epoch"])
    # any capacity: twice the switch, half the days
    s2 = switch_sizing(d["total_bytes"], 102.4, 100, 100)
    assert s2["days_per_epoch"] == pytest.approx(s["days_per_epoch"] / 2)
    with pytest.raises(InvalidArgument):
        switch_sizing(1.0, 0.0)


def _topo_for(g, one_per_server):
    return cluster_for("dgx-h100", g if one_per_server else max(1, g // 8))


def test_exact_rows_differ_from_seed_where_the_seed_counts_a_full_mesh():
    seed = _rows()
    exact = {r.mode: r for r in exact_1d(M, C4_TOKENS, N, 8, _topo_for)}
    P_ratio = M.params() / M.nominal()
    # DP: full mesh G(G-1) vs an all-reduce's 2(G-1): G/2 = 4 times less
    assert seed["DP"].backward_bytes / (exact["DP"].backward_bytes / P_ratio) == pytest.approx(4.0, rel=0.01)
    # TP forward: full mesh G(G-1) vs NVLS inside an H100 server, where each GPU injects (G+1)/G of the
    # buffer (the switch sums and copies): G(G-1)/(G+1) = 56/9 times less (a ring: G/2)
    assert "nvls" in exact["TP"].algorithms
    assert seed["TP"].forward_bytes / exact["TP"].forward_bytes == pytest.approx(8 * 7 / 9, rel=0.01)
    # TP backward is activation gradients (same as forward), not parameters
    assert exact["TP"].backward_bytes == pytest.approx(exact["TP"].forward_bytes)
    # PP agrees with the seed
    assert exact["PP"].forward_bytes == pytest.approx(seed["PP"].forward_bytes, rel=1e-6)
    # tiers: TP stays on NVLink inside the server, DP and PP cross NICs
    assert set(exact["TP"].tiers) == {"nvlink"}
    assert exact["DP"].network_bytes == pytest.approx(exact["DP"].backward_bytes, rel=1e-6)


def test_exact_3d_is_far_below_the_seed_and_mostly_nvlink():
    lay = Layout(tp=8, pp=8, dp=16, global_batch=16)
    rows = {r.mode: r for r in exact_3d(M, C4_TOKENS, N, lay, cluster_for("dgx-h100", 128))}
    total = sum(r.backward_bytes + r.forward_bytes for r in rows.values())
    assert 5e18 < total < 30e18  # vs the seed's 85 EB
    assert rows["TP"].tiers.get("nic", 0.0) == 0.0
    assert rows["DP"].network_bytes > rows["PP"].network_bytes > 0


def test_storage_traffic():
    st = storage_traffic(M, C4_TOKENS, N, 1000)
    assert st["checkpoint_bytes"] == pytest.approx(14 * M.params())
    assert st["checkpoints_per_epoch"] == pytest.approx(N / 1000)
    with pytest.raises(InvalidArgument):
        storage_traffic(M, C4_TOKENS, N, 0)
