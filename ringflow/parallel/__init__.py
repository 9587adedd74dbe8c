"""Real distributed training on the ringflow runtime: data, tensor and pipeline parallel, parameter servers.

Modules (each one job): `nn` (NumPy layers with hand-written backward),
`transformer` (LayerNorm, GELU, attention), `data` (synthetic data set),
`buckets` (gradient bucket plan), `ddp` (bucketed overlapped all-reduce for
NumPy models and torch modules), `async_dp` (no-wait data parallel),
`tensor` (Megatron column/row-parallel layers in a transformer block),
`pp_schedule` + `pipeline` (GPipe and 1F1B), `mailbox` (non-blocking tagged
messages), `param_server` (BSP / ASP / SSP servers).
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "NumpyDDP": "ddp", "TorchDDP": "ddp", "overlap_fraction": "ddp",
    "plan_buckets": "buckets", "Bucket": "buckets",
    "train_async_dp": "async_dp",
    "ColumnParallelLinear": "tensor", "RowParallelLinear": "tensor", "TransformerBlock": "tensor",
    "PipelineStage": "pipeline", "schedule": "pp_schedule", "simulate": "pp_schedule",
    "theoretical_bubble": "pp_schedule",
    "ShardServer": "param_server", "train_param_server": "param_server",
    "mlp": "nn", "Sequential": "nn", "make_classification": "data",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'ringflow.parallel' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ringflow.parallel.{mod}"), name)
