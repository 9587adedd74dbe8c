"""The sizes of a `ringflow sim` table: nccl-tests' -b/-e/-f, or grown until bus bandwidth saturates."""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")

AUTO_FROM_BYTES = 128 << 20   # without --max: the table runs to at least this size ...
AUTO_CAP_BYTES = 64 << 30     # ... and grows by --factor up to this one (a GPU's memory), no further
SATURATED_WITHIN = 0.02       # ... stopping where busbw is within 2 % of its asymptote


def gain_limit(factor: int) -> float:
    """Busbw gain per size step under which the last size is within SATURATED_WITHIN of the asymptote.

    For a latency + size / bandwidth cost, busbw(S) = B S / (S + h): growing S by `factor` gains
    (factor - 1) (1 - busbw(fS) / B), so a gain under (factor - 1) x SATURATED_WITHIN puts fS within it."""
    return (factor - 1) * SATURATED_WITHIN


def saturated(busbw_GBps: list[float], factor: int) -> bool:
    """True when the last step of the sweep gained less than gain_limit(factor) (or lost bandwidth)."""
    if len(busbw_GBps) < 2 or busbw_GBps[-2] <= 0:
        return False
    return busbw_GBps[-1] <= busbw_GBps[-2] * (1 + gain_limit(factor))


def sweep(sizes: list[int], factor: int, run: Callable[[int], R], busbw_GBps: Callable[[R], float],
          grow: bool) -> tuple[list[R], bool]:
    """Run every size; with `grow`, keep multiplying the last by `factor` until busbw saturates or the next
    size would pass AUTO_CAP_BYTES. Returns the results and whether the last size's busbw saturated."""
    results = [run(s) for s in sizes]
    bw = [busbw_GBps(r) for r in results]
    size = sizes[-1] if sizes else 0
    while grow and size and not saturated(bw, factor) and size * factor <= AUTO_CAP_BYTES:
        size *= factor
        results.append(run(size))
        bw.append(busbw_GBps(results[-1]))
    return results, saturated(bw, factor)
