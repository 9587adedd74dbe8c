"""Narayanan et al. 2021, Table 1 (Megatron-LM weak scaling on Selene's A100s), as the registry holds it.

The rows are the ``narayanan-t1-*`` cases of ``ringflow/data/published.yaml`` (the one registry of published
cases; each row's source line is there): model size, TP, PP, GPUs, global batch, achieved teraFLOP/s per GPU
and % of the A100's 312 TFLOP/s peak from "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC21, arXiv:2104.04473); micro-batch sizes and interleaving from the paper's own run script,
NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh``. Their FLOP count (Eq. 3) includes the recomputation
forward, which is our *hardware* FLOPs (HFU numerator), so the comparison is on ``hw_tflops_per_gpu``.

Cluster: Selene DGX A100 nodes, 8 A100-80GB on NVSwitch, 8 HDR InfiniBand 200 Gb/s HCAs per node (paper
Sec. 5), i.e. `build_cluster("dgx-a100", nodes, fabric="rail", nic_gbps=200)`. The 2021 code had no
FlashAttention and no sequence parallelism, and used dropout (GPT).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .layout import Layout
from .models import load_model

TABLE1_URL = "https://arxiv.org/abs/2104.04473"


@dataclass(frozen=True)
class NarayananRow:
    """One row of Table 1 plus the run script's micro-batch and interleaving."""

    model: str
    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    tflops_per_gpu: float   # published, achieved teraFLOP/s per GPU
    peak_percent: int       # published % of theoretical peak
    micro_batch: int        # run_table_1.sh MBS
    interleave: int         # layers / (pp x num-layers-per-virtual-pipeline-stage); 1 = none
    case_id: str = ""
    layout: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _table1() -> tuple[NarayananRow, ...]:
    """The Table 1 rows of the registry, in file order."""
    from ..sim.references import read_registry
    rows = []
    for c in read_registry()["cases"]:
        if c.get("kind") != "training" or c["source"]["url"] != TABLE1_URL:
            continue
        m, lay, rep = load_model(c["model"]), c["layout"], c.get("reported") or {}
        rows.append(NarayananRow(c["model"], float(rep.get("params_b", 0.0)), m.heads, m.hidden, m.layers,
                                 lay.get("tp", 1), lay.get("pp", 1), int(c["gpus"]), lay["global_batch"],
                                 float(c["value"]), int(rep.get("peak_percent", 0)), lay["micro_batch"],
                                 lay.get("interleave", 1), c["id"], dict(lay)))
    return tuple(rows)


_ROWS: list[tuple[NarayananRow, ...]] = []


def __getattr__(name: str) -> Any:
    """``TABLE1``: the rows, read from the registry on first use (importing this module reads no file)."""
    if name != "TABLE1":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _ROWS:
        _ROWS.append(_table1())
    return _ROWS[0]


def row_layout(row: NarayananRow) -> Layout:
    """The layout of one Table 1 run as the registry gives it (2021 Megatron: full recompute, no SP, no
    FlashAttention; torch DDP overlapped without PP, Megatron's 'local' DDP after the backward pass with PP)."""
    return Layout(dp=row.gpus // (row.tp * row.pp), **row.layout)


def selene(nodes: int) -> Any:
    """Selene-like cluster: DGX A100 nodes with 8 x 200 Gb/s HDR rails."""
    return cluster_for("dgx-a100", nodes, nic_gbps=200)


def cluster_for(preset: str, nodes: int, nic_gbps: float | None = None, fabric: str = "rail") -> Any:
    """`build_cluster` with 2 switch tiers when they fit, else 3 (leaf-spine-core), cached per arguments."""
    key = (preset, nodes, nic_gbps, fabric)
    hit = _CLUSTERS.get(key)
    if hit is not None:
        return hit
    from ..errors import TopologyError
    from ..topology import build_cluster
    try:
        topo = build_cluster(preset, nodes, fabric=fabric, nic_gbps=nic_gbps)
    except TopologyError:
        topo = build_cluster(preset, nodes, fabric=fabric, nic_gbps=nic_gbps, tiers=3)
    if len(_CLUSTERS) > 16:
        _CLUSTERS.pop(next(iter(_CLUSTERS)))
    _CLUSTERS[key] = topo
    return topo


_CLUSTERS: dict[tuple, Any] = {}


def predict_table1(comm: Any = None, eff: Any = None) -> list[dict[str, Any]]:
    """Predicted vs published TFLOP/s per GPU for every row of Table 1."""
    from .compute import gpu_spec
    from .steptime import step_time
    out = []
    a100 = gpu_spec("A100")
    for row in _table1():
        model = load_model(row.model)
        topo = selene(row.gpus // 8)
        r = step_time(model, row_layout(row), topo, gpu=a100, comm=comm, eff=eff)
        pred = r.hw_tflops_per_gpu
        out.append({"model": row.model, "params_b": row.params_b, "tp": row.tp, "pp": row.pp, "gpus": row.gpus,
                    "batch": row.batch, "micro_batch": row.micro_batch, "interleave": row.interleave,
                    "published_tflops": row.tflops_per_gpu, "predicted_tflops": pred,
                    "error": pred / row.tflops_per_gpu - 1.0, "step_time_s": r.step_time_s,
                    "breakdown": r.breakdown})
    return out
