"""Columns of a 2-D array as one int64 key each, ordered like the columns themselves.

`np.unique(rows, axis=1)` sorts the columns as structured records, which is some hundred times slower than
sorting integers; the simulator's tables hold up to millions of columns (an NVL72 NVLS table). Each row is
replaced by the rank of its value among the row's distinct values, and the ranks are combined in mixed radix,
so equal columns get equal keys and the keys sort the columns lexicographically (first row first), as
`np.unique(..., axis=1)` does.
"""
from __future__ import annotations

import numpy as np

_LIMIT = 1 << 62


def column_keys(rows: np.ndarray) -> np.ndarray:
    """One int64 per column of `rows` (2-D): equal columns, equal keys; key order is lexicographic column order."""
    rows = np.asarray(rows)
    if rows.ndim != 2:
        raise ValueError(f"column_keys takes a 2-D array, got {rows.ndim} dimensions")
    key = np.zeros(rows.shape[1], dtype=np.int64)
    span = 1
    for row in rows:
        values, code = np.unique(row, return_inverse=True)
        code = code.reshape(-1).astype(np.int64)
        if span * values.size >= _LIMIT:   # re-number the keys so far (their order kept) before they overflow
            prefix, key = np.unique(key, return_inverse=True)
            key = key.reshape(-1).astype(np.int64)
            span = prefix.size
        key = key * values.size + code
        span *= max(values.size, 1)
    return key
