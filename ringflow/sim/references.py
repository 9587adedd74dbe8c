"""Published NCCL measurements on DGX-class servers, and what the simulator predicts for them.

Every reference names its source.  ``fitted`` marks the figure a default parameter was derived
from (its error is small by construction); the others are independent checks.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reference:
    """One published figure: what was measured, the value, where it comes from."""

    name: str
    what: str
    busbw_GBps: float
    source: str
    build: Callable[[], Any]   # -> Topology
    size_bytes: int
    algorithm: str | None      # None: the simulator's own choice
    fitted: bool = False
    modelled: bool = True
    note: str = ""
    endpoints: str | None = None   # "gpu0": one rank per node on its GPU 0
    nranks: int | None = None      # the first n GPUs (default: all)
    collective: str = "all_reduce"


def _preset(name: str) -> Callable[[], Any]:
    def f() -> Any:
        from ..topology import load_topology
        return load_topology(name)
    return f


def _cluster(name: str, nodes: int, keep_nics: int | None = None) -> Callable[[], Any]:
    def f() -> Any:
        from ..topology import build_cluster, load_topology
        base = load_topology(name)
        if keep_nics is not None:   # servers wired with fewer NICs than the DGX (HGX builds)
            base = base.copy()
            nics = base.nics()
            step = len(nics) // keep_nics
            for n in [x for i, x in enumerate(nics) if i % step]:
                base.graph.remove_node(n)
            base.invalidate()
            base.name = f"{name}-{keep_nics}nic"
        return build_cluster(base, nodes, fabric="rail")
    return f


def _h800() -> Any:
    """DGX H100 with H800 GPUs: 8 NVLink4 links per GPU to the NVSwitches, 400 GB/s both directions
    (NVIDIA H800 SXM5 datasheet), instead of 18 (900 GB/s)."""
    from ..hardware import nvlink_gen
    from ..topology import load_topology
    topo = load_topology("dgx-h100")
    per_dir = 8 * nvlink_gen(4).link_GBps
    for _u, _v, d in topo.graph.edges(data=True):
        if d.get("tier") == "nvlink":
            d["bw_GBps"], d["nlinks"] = per_dir, 8
    topo.invalidate()
    topo.name = "dgx-h800"
    return topo


GiB = 2**30
REFERENCES: tuple[Reference, ...] = (
    Reference("H100x8 ring", "DGX H100, 8 GPUs, all_reduce NCCL_ALGO=RING, large messages", 370.0,
              "S. Jeaugey (NVIDIA), https://github.com/NVIDIA/nccl-tests/issues/212", _preset("dgx-h100"),
              8 * GiB, "ring", fitted=True, note="NVLink efficiency 0.822 = 370/450 comes from this figure"),
    Reference("H100x8 NVLS", "DGX H100, 8 GPUs, all_reduce default (NVLink SHARP)", 480.0,
              "https://github.com/NVIDIA/nccl-tests/issues/212 (~480); 476 in "
              "https://github.com/NVIDIA/nccl-tests/issues/290", _preset("dgx-h100"), 8 * GiB, None,
              note="the simulator's own choice (nvls); nothing fitted to it: the ring's NVLink efficiency "
                   "x NCCL's NVLS efficiency for Hopper (0.85, src/graph/tuning.cc)"),
    *(Reference(f"H100x{n} NVLS", f"DGX H100, {n} of its 8 GPUs, all_reduce NCCL_ALGO=NVLS, 2-4 GiB", bw,
                "shh2000, https://github.com/NVIDIA/nccl/issues/1455 (busbw 370 on 2-4 GPUs, then 420, 440, "
                "460, 480 on 5-8)", _preset("dgx-h100"), 4 * GiB, "nvls", nranks=n,
                note="(n + 1) / n of the buffer each way: busbw grows with n as 2 (n - 1) / (n + 1)")
      for n, bw in ((5, 420.0), (6, 440.0), (7, 460.0))),
    Reference("H200x8", "HGX H200, 8 GPUs (NVLink4, NVSwitch gen3 as DGX H100), all_reduce default, -e 4G", 475.0,
              "vitduck, https://github.com/NVIDIA/nccl-tests/issues/272 (peak 475, NCCL 2.20.3)",
              _preset("dgx-h100"), 4 * GiB, None, note="the simulator's own choice (nvls)"),
    Reference("H800x8", "8 x H800 SXM (8 NVLink4 links, 200 GB/s per direction), all_reduce default", 215.0,
              "yupatrick22, https://github.com/NVIDIA/nccl/issues/1374", _h800, 4 * GiB, None,
              note="the simulator's own choice (nvls) on DGX H100 with 8 of its 18 NVLinks per GPU"),
    *(Reference(f"B300x8 {label}", f"HGX B300, 8 GPUs (NVLink5 900 GB/s per direction, as 8 GPUs of gb200-nvl72), "
                f"all_reduce {label}", bw, "shenyt-sanshui, https://github.com/NVIDIA/nccl/issues/2140 (NVLS off "
                "695, on 845)", _preset("gb200-nvl72"), 4 * GiB, algo, nranks=8,
                note="NVLS at NCCL's Blackwell efficiency 0.74; the ring at the H100-fitted NVLink efficiency")
      for label, bw, algo in (("ring", 695.0, "ring"), ("NVLS", 845.0, "nvls"))),
    *(Reference(f"H100x8 AG {label}", f"DGX H100, 8 GPUs, all_gather NCCL_ALGO={label.upper()}, 1 GiB", bw,
                "telala, https://github.com/NVIDIA/nccl/issues/1506 (1 GB: ring 350, NVLS 300)", _preset("dgx-h100"),
                GiB, algo, collective="all_gather",
                note="NVLS sends S / n and receives S per GPU (sim.nvls): slower than the ring, as published")
      for label, bw, algo in (("ring", 350.0, "ring"), ("NVLS", 300.0, "nvls"))),
    Reference("H100x8 RS ring", "DGX H100, 8 GPUs, reduce_scatter NCCL_ALGO=RING, 8 GiB", 362.16,
              "haobaba5353, https://github.com/NVIDIA/nccl/issues/1047", _preset("dgx-h100"), 8 * GiB, "ring",
              collective="reduce_scatter"),
    Reference("A100x8", "8 x A100 SXM NVSwitch, all_reduce default, -e 4G", 232.54,
              "lcw2, https://github.com/NVIDIA/nccl-tests/issues/175 and the same report in "
              "https://github.com/NVIDIA/nccl/issues/1048 ('singleNode ... 232.54GB/s')", _preset("dgx-a100"),
              4 * GiB, "ring"),
    Reference("A100 2 nodes x 4 HDR", "2 x (8 A100 + 4 x HDR 200G), all_reduce, large messages", 86.0,
              "lcw2, https://github.com/NVIDIA/nccl-tests/issues/175 and https://github.com/NVIDIA/nccl/issues/1048 "
              "(86 GB/s; 91 GB/s in "
              "https://github.com/NVIDIA/nccl-tests/issues/100)", _cluster("dgx-a100", 2, keep_nics=4),
              4 * GiB, "ring"),
    Reference("A100 3 nodes x 4 HDR", "3 x (8 A100 + 4 x HDR 200G), all_reduce, peak of -e 128M", 96.0,
              "https://github.com/NVIDIA/nccl-tests/issues/119 (peak 96, average 84.8)",
              _cluster("dgx-a100", 3, keep_nics=4), 128 * 2**20, None,
              note="NCCL's default choice is compared with the simulator's own choice"),
    Reference("NDR NIC", "2 x DGX H100, one GPU per node (GPU0 -> NIC0), all_reduce ring", 47.0,
              "AddyLaddy (NVIDIA), https://github.com/NVIDIA/nccl-tests/issues/290: 46-48 GB/s per NIC",
              _cluster("dgx-h100", 2), 8 * GiB, "ring", fitted=True,
              note="IB efficiency 0.94 = 47/50 comes from this figure", endpoints="gpu0"),
)


def evaluate(refs: tuple[Reference, ...] = REFERENCES) -> list[dict[str, Any]]:
    """Predicted busbw and error (predicted / reference - 1) for every reference."""
    from .api import simulate
    rows = []
    for ref in refs:
        topo = ref.build()
        eps = None
        if ref.endpoints == "gpu0":
            eps = [topo.gpus(h)[0] for h in topo.hosts()]
        res = simulate(topo, ref.collective, ref.size_bytes, algorithm=ref.algorithm, endpoints=eps, nranks=ref.nranks)
        pred = res.busbw_GBps
        rows.append({"name": ref.name, "what": ref.what, "collective": ref.collective, "reference_GBps": ref.busbw_GBps,
                     "predicted_GBps": pred, "error": pred / ref.busbw_GBps - 1, "algorithm": res.algorithm,
                     "protocol": res.protocol, "size_bytes": ref.size_bytes, "source": ref.source,
                     "fitted": ref.fitted, "modelled": ref.modelled, "note": ref.note})
    return rows
