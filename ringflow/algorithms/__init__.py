"""Collective algorithms as schedules (see `schedule` for the glossary)."""
from __future__ import annotations

from .cost import Cost, Traffic, schedule_cost, traffic
from .layout import CallShape, block_counts, buffer_elements, chunk_bounds, ref_bounds, split_counts
from .registry import ALGORITHMS, AlgorithmInfo, algorithms_for, get_schedule
from .schedule import SCHEMA_VERSION, Buffer, BufferLayout, ChunkRef, Collective, Op, OpKind, Schedule, ScheduleBuilder
from .tuner import Choice, choose
from .verifier import VerifyReport, check_algorithm, verify

__all__ = [
    "SCHEMA_VERSION", "Buffer", "BufferLayout", "ChunkRef", "Collective", "Op", "OpKind", "Schedule",
    "ScheduleBuilder", "CallShape", "block_counts", "buffer_elements", "chunk_bounds", "ref_bounds",
    "split_counts", "Cost", "Traffic", "schedule_cost", "traffic", "ALGORITHMS", "AlgorithmInfo", "algorithms_for",
    "get_schedule", "Choice", "choose", "VerifyReport", "check_algorithm", "verify",
]
