"""Validation against Narayanan et al. 2021, Table 1 (Megatron-LM weak scaling on Selene's A100s).

Published figures ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
SC21, arXiv:2104.04473, Table 1): model size, heads, hidden, layers, TP, PP, GPUs, global batch, achieved
teraFLOP/s per GPU and % of the A100's 312 TFLOP/s peak. Micro-batch sizes and interleaving come from the
paper's own run script, NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh`` (MBS; ``--recompute-method
uniform`` = full activation recomputation on every row; ``--num-layers-per-virtual-pipeline-stage`` gives
the interleaving v = layers / (pp x that)). Their FLOP count (Eq. 3) includes the recomputation forward,
which is our *hardware* FLOPs (HFU numerator), so the comparison is on ``hw_tflops_per_gpu``.

Cluster: Selene DGX A100 nodes, 8 A100-80GB on NVSwitch, 8 HDR InfiniBand 200 Gb/s HCAs per node (paper
Sec. 5), i.e. `build_cluster("dgx-a100", nodes, fabric="rail", nic_gbps=200)`. The 2021 code had no
FlashAttention and no sequence parallelism, and used dropout (GPT).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layout import Layout
from .models import load_model


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


TABLE1: tuple[NarayananRow, ...] = (
    NarayananRow("megatron-gpt-1.7b", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 16, 1),
    NarayananRow("megatron-gpt-3.6b", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 16, 1),
    NarayananRow("megatron-gpt-7.5b", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 16, 1),
    NarayananRow("megatron-gpt-18.4b", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 8, 1),
    NarayananRow("megatron-gpt-39.1b", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 4, 1),
    NarayananRow("megatron-gpt-76.1b", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 2, 3),
    NarayananRow("megatron-gpt-145.6b", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 2, 2),
    NarayananRow("megatron-gpt-310.1b", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 1, 2),
    NarayananRow("megatron-gpt-529.6b", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 1, 3),
    NarayananRow("megatron-gpt-1t", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 1, 1),
)


def row_layout(row: NarayananRow) -> Layout:
    """The layout of one Table 1 run (2021 Megatron: full recompute, no SP, no FlashAttention)."""
    dp = row.gpus // (row.tp * row.pp)
    # torch DDP overlaps the gradient all-reduce with backward; Megatron's 'local' DDP (rows with PP)
    # all-reduced after the backward pass (run_table_1.sh: DDP=torch for the first four rows, else local)
    overlap = row.pp == 1
    return Layout(tp=row.tp, pp=row.pp, dp=dp, micro_batch=row.micro_batch, global_batch=row.batch,
                  seq_len=2048, zero=0, recompute="full", sequence_parallel=False, interleave=row.interleave,
                  overlap_grad_reduce=overlap, flash_attention=False, precision="bf16",
                  grad_bytes=4 if not overlap else 2)


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
    for row in TABLE1:
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
