"""Gradient buckets for data parallel: reverse parameter order, a small first bucket, then capped ones.

Backward produces gradients from the last layer to the first, so buckets are
filled in reverse parameter order: the first bucket holds the last layers'
gradients and can be all-reduced while backward still runs. It is kept small
(PyTorch DDP: 1 MiB) so communication starts early; later buckets close once
they reach `bucket_cap_nbytes` (PyTorch DDP default 25 MiB, `bucket_cap_mb`,
see torch.nn.parallel.DistributedDataParallel docs). A parameter never spans
two buckets. Every rank computes the same plan from the same parameter list,
so buckets are issued in the same order everywhere.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidArgument

DEFAULT_FIRST_BUCKET_NBYTES = 1 * 2**20   # torch DDP's first bucket (dist._DEFAULT_FIRST_BUCKET_BYTES)
DEFAULT_BUCKET_CAP_NBYTES = 25 * 2**20    # torch DDP's bucket_cap_mb=25 default


@dataclass(frozen=True)
class Bucket:
    """Parameters (indices into the forward-ordered list) reduced together, and their total bytes."""

    index: int
    params: tuple[int, ...]
    nbytes: int


def plan_buckets(param_nbytes: Sequence[int], bucket_cap_nbytes: int = DEFAULT_BUCKET_CAP_NBYTES,
                 first_bucket_nbytes: int = DEFAULT_FIRST_BUCKET_NBYTES) -> list[Bucket]:
    """Group parameters (given in forward order) into buckets, walking them in reverse order."""
    if bucket_cap_nbytes <= 0 or first_bucket_nbytes <= 0:
        raise InvalidArgument(f"bucket sizes must be > 0 (cap={bucket_cap_nbytes}, first={first_bucket_nbytes})",
                              "pass positive byte counts, e.g. '25MiB' parsed with ringflow.units.parse_size")
    buckets: list[Bucket] = []
    cur: list[int] = []
    cur_nbytes = 0
    for i in range(len(param_nbytes) - 1, -1, -1):
        cur.append(i)
        cur_nbytes += int(param_nbytes[i])
        cap = first_bucket_nbytes if not buckets else bucket_cap_nbytes
        if cur_nbytes >= cap:
            buckets.append(Bucket(len(buckets), tuple(cur), cur_nbytes))
            cur, cur_nbytes = [], 0
    if cur:
        buckets.append(Bucket(len(buckets), tuple(cur), cur_nbytes))
    return buckets
