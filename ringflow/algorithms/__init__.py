"""Collective algorithms as schedules (see `schedule` for the glossary).

The names below load on first use, so the runtime, which needs a few modules of this package, does not
pay for the others (the verifier, the algorithm registry's topology-aware builders) when it starts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes

if TYPE_CHECKING:
    from .cost import Cost, Traffic, schedule_cost, traffic
    from .layout import CallShape, block_counts, buffer_elements, chunk_bounds, ref_bounds, split_counts
    from .registry import ALGORITHMS, AlgorithmInfo, algorithms_for, get_schedule
    from .schedule import (
        SCHEMA_VERSION,
        Buffer,
        BufferLayout,
        ChunkRef,
        Collective,
        Op,
        OpKind,
        Schedule,
        ScheduleBuilder,
    )
    from .tuner import Choice, choose
    from .verifier import VerifyReport, check_algorithm, verify

#: module (of this package) that defines each public name
_WHERE = {
    **dict.fromkeys(("Cost", "Traffic", "schedule_cost", "traffic"), "cost"),
    **dict.fromkeys(("CallShape", "block_counts", "buffer_elements", "chunk_bounds", "ref_bounds", "split_counts"),
                    "layout"),
    **dict.fromkeys(("ALGORITHMS", "AlgorithmInfo", "algorithms_for", "get_schedule"), "registry"),
    **dict.fromkeys(("SCHEMA_VERSION", "Buffer", "BufferLayout", "ChunkRef", "Collective", "Op", "OpKind", "Schedule",
                     "ScheduleBuilder"), "schedule"),
    **dict.fromkeys(("Choice", "choose"), "tuner"),
    **dict.fromkeys(("VerifyReport", "check_algorithm", "verify"), "verifier"),
}

__all__ = [
    "SCHEMA_VERSION", "Buffer", "BufferLayout", "ChunkRef", "Collective", "Op", "OpKind", "Schedule",
    "ScheduleBuilder", "CallShape", "block_counts", "buffer_elements", "chunk_bounds", "ref_bounds",
    "split_counts", "Cost", "Traffic", "schedule_cost", "traffic", "ALGORITHMS", "AlgorithmInfo", "algorithms_for",
    "get_schedule", "Choice", "choose", "VerifyReport", "check_algorithm", "verify",
]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE, __all__)
