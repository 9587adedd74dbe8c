"""Presets audited against vendor documents (hardware.systems), dgx-a100 NIC line rate, fabric options and errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ringflow.cli import build_app
from ringflow.errors import InvalidArgument, TopologyError
from ringflow.hardware import GPU_MODELS, NVSWITCH_GENERATIONS, SYSTEMS, nvlink_gen, pcie_GBps, system_spec
from ringflow.sim.flow import maxmin_rates
from ringflow.topology import PRESETS, LinkType, NodeKind, Topology, build_cluster, load_topology
from ringflow.topology.fabric_plan import FabricSpec

# The audited vendor figures, one row per preset: GPU model, GPUs, NVLink gen, NVLinks per GPU, NVSwitch chips,
# CPU sockets, compute NICs, NIC Gb/s, storage NICs. Each figure's document is in SystemSpec.sources.
VENDOR = {
    "dgx1-p100": ("P100", 8, 1, 4, 0, 2, 4, 100, 2),        # DGX-1 white paper: 4 x EDR IB, dual 10GbE
    "dgx1-v100": ("V100", 8, 2, 6, 0, 2, 4, 100, 2),        # DGX-1 V100 white paper
    "dgx2": ("V100", 16, 2, 6, 12, 2, 8, 100, 2),           # DGX-2 user guide: 12 NVSwitches, 8 x 100G
    "dgx-a100": ("A100", 8, 3, 12, 6, 2, 8, 200, 2),        # DGX A100 user guide / datasheet (640GB)
    "a100-40gb": ("A100-40GB", 8, 3, 12, 6, 2, 8, 200, 1),  # DGX A100 datasheet (320GB): 1 dual-port storage NIC
    "dgx-h100": ("H100", 8, 4, 18, 4, 2, 8, 400, 2),        # DGX H100/H200 user guide
    "dgx-h200": ("H200", 8, 4, 18, 4, 2, 8, 400, 2),
    "h800": ("H800", 8, 4, 8, 4, 2, 8, 400, 0),             # arXiv:2505.09343: 400 GB/s NVLink, 8 x 400G CX7
    "h20": ("H20", 8, 4, 18, 4, 2, 8, 400, 0),
    "dgx-b200": ("B200", 8, 5, 18, 2, 2, 8, 400, 2),        # DGX B200 user guide: 2 NVLink switch chips
    "hgx-b300": ("B300", 8, 5, 18, 2, 2, 8, 800, 2),        # HGX B300: 8 x ConnectX-8 800G
    "gb200-nvl72": ("GB200", 72, 5, 18, 18, 36, 72, 400, 18),
    "gb300-nvl72": ("GB300", 72, 5, 18, 18, 36, 72, 800, 18),
}
FIGURES = ("gpus", "nvlink", "nvswitch", "cpu", "pcie", "nics", "storage")


@pytest.fixture(scope="module")
def topos() -> dict[str, Topology]:
    return {name: load_topology(name) for name in VENDOR}


def _gpu_nvlinks(t: Topology, g: str) -> int:
    return sum(d["nlinks"] for _, d in t.graph._succ[g].items() if d["type"] == LinkType.NVLINK and not d.get("c2c"))


def test_every_vendor_preset_has_a_sourced_spec() -> None:
    assert set(VENDOR) == set(SYSTEMS) and set(SYSTEMS) <= set(PRESETS)
    for s in SYSTEMS.values():
        for fig in FIGURES:
            assert "http" in s.source(fig), (s.name, fig)
        assert s.gpu in GPU_MODELS and "http" in GPU_MODELS[s.gpu].source
    with pytest.raises(InvalidArgument, match="no source"):
        system_spec("dgx-a100").source("price")
    with pytest.raises(InvalidArgument, match="pcie-8gpu"):
        system_spec("pcie-8gpu")


@pytest.mark.parametrize("name", list(VENDOR))
def test_preset_matches_vendor_figures(name: str, topos: dict[str, Topology]) -> None:
    model, ngpu, gen, links, chips, sockets, nics, gbps, storage = VENDOR[name]
    s = system_spec(name)
    assert (s.gpu, s.gpus, s.nvlink_gen, s.nvlinks_per_gpu, s.nvswitch_chips, s.sockets, s.nics, s.nic_gbps,
            s.storage_nics) == VENDOR[name]
    t = topos[name]
    gpus = t.gpus()
    assert len(gpus) == ngpu and {t.graph.nodes[g]["model"] for g in gpus} == {model}
    assert {_gpu_nvlinks(t, g) for g in gpus} == {links}
    assert {d["gen"] for _, _, d in t.graph.edges(data=True) if d["type"] == LinkType.NVLINK and "gen" in d} == {gen}
    assert sum(t.graph.nodes[n]["chips"] for n in t.nodes(NodeKind.NVSWITCH)) == chips
    assert len(t.nodes(NodeKind.CPU)) == sockets
    assert len(t.nics()) == nics and {t.graph.nodes[n]["speed_gbps"] for n in t.nics()} == {gbps}
    assert sum(t.graph.nodes[c].get("storage_nics", 0) for c in t.nodes(NodeKind.CPU)) == storage
    if chips:   # through the NVSwitch fabric every GPU pair gets the GPU's whole NVLink bandwidth
        assert t.bottleneck_GBps(gpus[0], gpus[-1]) == pytest.approx(links * nvlink_gen(gen).link_GBps)
        gens = {t.graph.nodes[n]["generation"] for n in t.nodes(NodeKind.NVSWITCH)}
        assert {NVSWITCH_GENERATIONS[x].nvlink_gen for x in gens} == {gen}


def test_new_gpu_models_figures() -> None:
    h800, h100 = GPU_MODELS["H800"], GPU_MODELS["H100"]
    assert 2 * h800.nvlinks * nvlink_gen(4).link_GBps == 400.0              # 400 GB/s both directions
    assert (h800.bf16_tflops, h800.fp8_tflops, h800.memory_GB) == (h100.bf16_tflops, h100.fp8_tflops, 80)
    assert 2 * GPU_MODELS["H20"].nvlinks * nvlink_gen(4).link_GBps == 900.0 and GPU_MODELS["H20"].pcie_gen == 5
    assert GPU_MODELS["H20"].fp8_tflops == 2 * GPU_MODELS["H20"].bf16_tflops
    a40, a80 = GPU_MODELS["A100-40GB"], GPU_MODELS["A100"]
    assert a40.memory_GB == 40 and a40.memory_GBps < a80.memory_GBps and a40.bf16_tflops == a80.bf16_tflops
    for m in ("B300", "GB300"):
        assert GPU_MODELS[m].memory_GB == 288 and GPU_MODELS[m].nvlink_gen == 5
    assert GPU_MODELS["GB300"].fp8_tflops == 720_000 / 72 / 2                     # 720 PF sparse per 72 GPUs


def _concurrent_rates(t: Topology, pairs: list[tuple[str, str]]) -> np.ndarray:
    """Max-min fair rates (GB/s) of one flow per pair, all at once, on their routed paths (flow engine)."""
    ids: dict[tuple[str, str], int] = {}
    pf, pl = [], []
    for i, (a, b) in enumerate(pairs):
        for e in t.path_edges(t.path(a, b)):
            pf.append(i)
            pl.append(ids.setdefault(e, len(ids)))
    cap = np.array([t.graph.edges[e]["bw_GBps"] for e in ids])
    return maxmin_rates(np.array(pf), np.array(pl), cap, len(pairs))


@pytest.mark.parametrize("name", ["dgx-a100", "a100-40gb", "dgx-h100", "h800", "dgx-b200", "hgx-b300"])
def test_all_nics_send_at_line_rate_at_once(name: str) -> None:
    t = build_cluster(name, 2)
    rates = _concurrent_rates(t, list(zip(t.gpus(0), t.gpus(1), strict=True)))
    line = system_spec(name).nic_gbps / 8
    assert rates == pytest.approx(np.full(8, line))


def test_dgx_a100_every_gpu_and_nic_has_its_own_x16() -> None:
    t = load_topology("dgx-a100")
    x16 = pcie_GBps(4, 16)
    seen: set[tuple[str, str]] = set()
    for i in range(8):
        g, n = t.find(f"GPU{i}"), t.find(f"NIC{i}")
        assert t.path_class_smi(g, n) == "PXB"                     # as nvidia-smi prints it on a DGX A100
        edges = t.path_edges(t.path(g, n))
        assert all(t.graph.edges[e]["bw_GBps"] == pytest.approx(x16) for e in edges)
        assert not seen & set(edges)                               # no link shared with another GPU-NIC pair
        seen |= set(edges)
    assert t.graph.nodes[t.find("CPU0")]["storage_nics"] == 2       # storage NICs: not on the compute fabric
    assert len(build_cluster("dgx-a100", 2).nics()) == 16


def test_nvl72_racks_are_18_trays() -> None:
    for name, gbps in (("gb200-nvl72", 400), ("gb300-nvl72", 800)):
        t = load_topology(name)
        assert t.hosts() == [0]
        for kind, per_tray in ((NodeKind.GPU, 4), (NodeKind.CPU, 2), (NodeKind.NIC, 4)):
            trays = [t.graph.nodes[n]["tray"] for n in t.nodes(kind)]
            assert sorted(set(trays)) == list(range(18)) and all(trays.count(x) == per_tray for x in set(trays))
        g0 = t.gpus()[0]
        assert t.path_class_nccl(g0, t.gpus()[-1]) == "NVL"
        nic0 = t.find("NIC0")
        assert t.graph.nodes[nic0]["speed_gbps"] == gbps
        assert t.bottleneck_GBps(g0, nic0) >= gbps / 8
    t = load_topology("gb300-nvl72")                                 # ConnectX-8's own PCIe switch: GPU-NIC PIX
    assert t.path_class_smi(t.find("GPU5"), t.find("NIC5")) == "PIX"


def test_fabric_spec_sizes_and_errors() -> None:
    assert FabricSpec.make(tiers=2, radix=64).max_endpoints() == 2048           # R^2 / 2
    assert FabricSpec.make(tiers=3, radix=64).max_endpoints() == 65536          # R^3 / 4
    assert FabricSpec.make(tiers=3, radix=64, oversub=(1, 3)).max_endpoints() > 65536
    for kw, msg in (({"tiers": 4}, "tiers=4"), ({"radix": 2}, "radix"), ({"oversub": (0.5,)}, "oversubscription"),
                    ({"oversub": (1, 2)}, "2 oversubscription values for 2 tiers"), ({"planes": 0}, "planes"),
                    ({"kind": "torus"}, "fabric")):
        with pytest.raises(TopologyError, match=msg):
            FabricSpec.make(**kw)
    with pytest.raises(TopologyError, match=r"need 4,800 leaf ports.*at most 64 leaves = 2,048 endpoints") as e:
        build_cluster("dgx-h100", 600, tiers=2)
    assert "--tiers 3" in e.value.hint and "--planes" in e.value.hint
    with pytest.raises(TopologyError, match="16 planes but each server has 8 NICs"):
        build_cluster("dgx-h100", 2, planes=16)


def test_oversubscription_per_tier_and_radix_bound() -> None:
    flat = build_cluster("dgx-a100", 40, fabric="fat-tree", tiers=3, radix=16)
    thin = build_cluster("dgx-a100", 40, fabric="fat-tree", tiers=3, radix=16, oversubscription=(1, 3))

    def cap(t: Topology, tier: str) -> float:
        return sum(d["bw_GBps"] for u, v, d in t.graph.edges(data=True)
                   if d["tier"] == tier and t.graph.nodes[u]["tier"] < t.graph.nodes[v]["tier"])
    assert cap(flat, "leaf-spine") == cap(thin, "leaf-spine")
    assert cap(flat, "spine-core") == cap(flat, "leaf-spine")                        # 1:1 at the spines
    for sp in [s for s in thin.nodes(NodeKind.NET_SWITCH) if thin.graph.nodes[s]["tier"] == 1]:
        links = {tier: sum(d["nlinks"] for _, v, d in thin.graph.out_edges(sp, data=True)
                           if thin.graph.nodes[v]["tier"] == tier) for tier in (0, 2)}
        assert links[2] == 4 and links[0] <= 12                                      # 12 down : 4 up at radix 16
    assert thin.meta["cluster"]["oversubscription_per_tier"] == [1.0, 3.0]
    for t in (flat, thin, build_cluster("dgx-h100", 160, tiers=3, radix=32)):
        for s in t.nodes(NodeKind.NET_SWITCH):
            assert sum(d["nlinks"] for _, _, d in t.graph.out_edges(s, data=True)) <= t.meta["cluster"]["radix"]
    a, b = thin.find("GPU0", host=0), thin.find("GPU0", host=39)
    assert "spine-core" in [thin.graph.edges[e]["tier"] for e in thin.path_edges(thin.path(a, b))]


def test_planes_are_independent_fabrics() -> None:
    t = build_cluster("dgx-h100", 8, planes=4)
    assert t.meta["cluster"]["planes"] == 4
    for nic in t.nics():
        leaf = next(s for s in t.graph._succ[nic] if t.kind(s) == NodeKind.NET_SWITCH)
        assert t.graph.nodes[leaf]["plane"] == t.graph.nodes[nic]["index"] % 4
    for u, v in t.graph.edges():
        if t.kind(u) == NodeKind.NET_SWITCH and t.kind(v) == NodeKind.NET_SWITCH:
            assert t.graph.nodes[u]["plane"] == t.graph.nodes[v]["plane"]
    a, b = t.find("GPU2", host=0), t.find("GPU2", host=7)
    sw = [n for n in t.path(a, b) if t.kind(n) == NodeKind.NET_SWITCH]
    assert sw and {t.graph.nodes[s]["plane"] for s in sw} == {2}
    assert t.bottleneck_GBps(a, t.find("GPU5", host=7)) == pytest.approx(50.0)   # other plane: crosses a server


@pytest.fixture(scope="module")
def app():
    return build_app()


def test_sim_and_train_take_the_fabric_options(app) -> None:
    res = CliRunner().invoke(app, ["sim", "all_reduce", "--topo", "dgx-a100", "--nodes", "4", "--tiers", "3",
                                   "--radix", "16", "--oversub", "1,2", "--planes", "2", "--min", "1MiB", "--max",
                                   "1MiB", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["nranks"] == 32
    res = CliRunner().invoke(app, ["train", "--topo", "h800", "--nodes", "4", "--planes", "2", "--oversub", "2",
                                   "--tp", "8", "--pp", "2", "--global-batch", "64", "--comm", "alpha-beta", "--json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["sim", "all_reduce", "--topo", "dgx-a100", "--nodes", "4", "--oversub", "1,x"])
    assert isinstance(res.exception, InvalidArgument) and "--oversub" in str(res.exception)
    res = CliRunner().invoke(app, ["train", "--topo", "dgx-h100", "--nodes", "4", "--tiers", "2", "--oversub", "1,2"])
    assert isinstance(res.exception, TopologyError) and "--tiers 3" in res.exception.hint
