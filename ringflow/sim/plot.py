"""busbw-versus-size plots (matplotlib imported lazily)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..plotting import pyplot
from ..units import format_size


def size_ticks(lo_bytes: float, hi_bytes: float, most: int = 9) -> list[int]:
    """Powers of two from lo to hi for a log size axis, every 2nd, 4th ... power so at most `most` remain,
    preferring the round sizes 1 B, 1 KiB, 1 MiB, 1 GiB when the step allows."""
    lo = max(0, math.floor(math.log2(max(lo_bytes, 1))))
    hi = max(lo, math.ceil(math.log2(max(hi_bytes, 1))))
    step = 1
    while (hi - lo) // step + 1 > most:
        step = step * 2 if step < 8 else step + 2   # 1, 2, 4, 8, 10 (one tick per KiB / MiB / GiB), 12 ...
    start = lo if step < 10 else -(-lo // 10) * 10
    return [1 << e for e in range(start, hi + 1, step)]


def size_axis(ax: Any, sizes: Sequence[float]) -> None:
    """A log2 x axis labelled in sizes (8B, 1KiB, 1MiB, 1GiB) rather than powers of two."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    ax.set_xscale("log", base=2)
    ticks = size_ticks(min(sizes), max(sizes)) if sizes else [1]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: format_size(x)))
    ax.set_xlabel("size")


def plot_busbw(series: Mapping[str, Sequence[Mapping[str, Any]]], path: str, title: str = "") -> None:
    """One line per series of rows (size_bytes, busbw_GBps) against size; saved in the format of the suffix."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, rows in series.items():
        xs = [r["size_bytes"] for r in rows]
        ys = [r["busbw_GBps"] for r in rows]
        ax.plot(xs, ys, marker="o", ms=3, label=name)
    size_axis(ax, [r["size_bytes"] for rows in series.values() for r in rows])
    ax.set_ylabel("busbw (GB/s)")
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_references(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """Published vs predicted busbw, one pair of bars per reference (`ringflow validate gpu --plot`)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(max(7.0, 0.7 * len(rows)), 4.4))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["reference_GBps"] for r in rows], width=0.4, label="published (NCCL)")
    bars = ax.bar([x + 0.2 for x in xs], [r["predicted_GBps"] for r in rows], width=0.4,
                  label="ringflow simulator (hatched: the figure a default was fitted to)")
    for bar, r in zip(bars, rows, strict=True):
        if r.get("fitted"):
            bar.set_hatch("//")
    for x, r in zip(xs, rows, strict=True):
        ax.annotate(f"{r['error']:+.0%}", (x + 0.2, r["predicted_GBps"]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["name"] for r in rows], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("all-reduce busbw (GB/s)")
    ax.set_title("published NCCL results vs the simulator")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_ylim(0, 1.3 * max(max(r["reference_GBps"], r["predicted_GBps"]) for r in rows))
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
