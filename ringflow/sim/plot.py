"""busbw-versus-size plots (matplotlib imported lazily)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def plot_busbw(series: Mapping[str, Sequence[Mapping[str, Any]]], path: str, title: str = "") -> None:
    """One line per series of rows (size_bytes, busbw_GBps); log2 x axis; saved as PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, rows in series.items():
        xs = [r["size_bytes"] for r in rows]
        ys = [r["busbw_GBps"] for r in rows]
        ax.plot(xs, ys, marker="o", ms=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
