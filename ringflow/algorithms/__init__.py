"""Collective algorithms as schedules (see `schedule` for the glossary)."""
from __future__ import annotations

from .layout import CallShape, block_counts, buffer_elements, chunk_bounds, ref_bounds, split_counts
from .schedule import (SCHEMA_VERSION, Buffer, BufferLayout, ChunkRef, Collective, Op, OpKind, Schedule,
                       ScheduleBuilder)

__all__ = [
    "SCHEMA_VERSION", "Buffer", "BufferLayout", "ChunkRef", "Collective", "Op", "OpKind", "Schedule",
    "ScheduleBuilder", "CallShape", "block_counts", "buffer_elements", "chunk_bounds", "ref_bounds",
    "split_counts",
]
