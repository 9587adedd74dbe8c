"""The whole hardware catalog as rows (for `ringflow hw list`), each with its source."""
from __future__ import annotations

from typing import TypedDict

from .cpu_links import SOCKET_LINKS
from .gpus import GPU_MODELS
from .network import NET_LINKS
from .nvlink import NVLINK_GENERATIONS, NVSWITCH_GENERATIONS
from .pcie import PCIE_GENERATIONS
from .systems import SYSTEMS


class _GpuFigures(TypedDict, total=False):
    """The extra figures of a GPU model's row."""

    bf16_tflops: float | None
    fp16_tflops: float
    fp8_tflops: float | None
    memory_GB: float
    memory_GBps: float


class CatalogRow(_GpuFigures):
    """One catalog entry (GB/s are None where a figure does not apply, e.g. for GPU models)."""

    kind: str
    name: str
    per_dir_GBps: float | None
    bidir_GBps: float | None
    detail: str
    source: str


def catalog_rows() -> list[CatalogRow]:
    """Every catalog entry as a flat dict: kind, name, per-direction and bidirectional GB/s, details, source."""
    rows: list[CatalogRow] = []
    for g in PCIE_GENERATIONS.values():
        rows.append({"kind": "pcie", "name": f"PCIe Gen{g.gen} x16", "per_dir_GBps": round(g.throughput_GBps(16), 6),
                     "bidir_GBps": round(g.bidirectional_GBps(16), 6),
                     "detail": f"{float(g.rate_GTps):g} GT/s, {g.encoding}, "
                               f"x1 = {g.throughput_GBps(1) * 1000:.1f} MB/s",
                     "source": g.source})
    for n in NVLINK_GENERATIONS.values():
        rows.append({"kind": "nvlink", "name": f"NVLink{n.gen} ({n.gpu})", "per_dir_GBps": n.link_GBps,
                     "bidir_GBps": n.link_bidir_GBps,
                     "detail": f"per link; {n.links_per_gpu} links/GPU = {n.gpu_bidir_GBps:g} GB/s bidir",
                     "source": n.source})
    for s in NVSWITCH_GENERATIONS.values():
        rows.append({"kind": "nvswitch", "name": f"NVSwitch gen{s.gen} ({s.system})", "per_dir_GBps": s.gpu_GBps,
                     "bidir_GBps": s.gpu_bidir_GBps, "detail": f"per GPU; {s.ports} NVLink{s.nvlink_gen} ports/chip",
                     "source": s.source})
    for q in SOCKET_LINKS.values():
        rows.append({"kind": "socket", "name": q.name, "per_dir_GBps": q.link_GBps, "bidir_GBps": q.bidir_GBps,
                     "detail": f"per link, {q.rate_GTps:g} GT/s", "source": q.source})
    for e in NET_LINKS.values():
        rows.append({"kind": e.family, "name": e.name, "per_dir_GBps": e.GBps, "bidir_GBps": e.bidir_GBps,
                     "detail": f"{e.gbps:g} Gb/s per port, {e.lanes} lanes", "source": e.source})
    for m in GPU_MODELS.values():
        bf16 = "-" if m.bf16_tflops is None else f"{m.bf16_tflops:g}"
        fp8 = "-" if m.fp8_tflops is None else f"{m.fp8_tflops:g}"
        rows.append({"kind": "gpu", "name": m.name, "per_dir_GBps": None, "bidir_GBps": None,
                     "detail": (f"dense TFLOP/s BF16 {bf16} FP16 {m.fp16_tflops:g} FP8 {fp8}; "
                                f"{m.memory_GB:g} GB at {m.memory_GBps:g} GB/s; NVLink{m.nvlink_gen} x{m.nvlinks}"),
                     "bf16_tflops": m.bf16_tflops, "fp16_tflops": m.fp16_tflops, "fp8_tflops": m.fp8_tflops,
                     "memory_GB": m.memory_GB, "memory_GBps": m.memory_GBps, "source": m.source})
    for y in SYSTEMS.values():
        sw = f", {y.nvswitch_chips} NVSwitch gen{y.nvswitch_gen}" if y.nvswitch_gen else ""
        store = f"; storage {y.storage_nics} x {y.storage_nic_gbps:g}G {y.storage_nic_model}" if y.storage_nics else ""
        rows.append({"kind": "system", "name": y.name, "per_dir_GBps": None, "bidir_GBps": None,
                     "detail": (f"{y.gpus} x {y.gpu}, NVLink{y.nvlink_gen} x{y.nvlinks_per_gpu}{sw}; {y.sockets} x "
                                f"{y.cpu}; PCIe Gen{y.pcie_gen}; {y.nics} x {y.nic_gbps:g}G {y.nic_model}{store}"),
                     "source": "; ".join(dict.fromkeys(doc for _, doc in y.sources))})
    return rows
