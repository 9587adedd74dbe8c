"""Figures for `ringflow train --plot` and `ringflow plan --plot` (matplotlib imported lazily)."""
from __future__ import annotations

from typing import Any

from ..plotting import pyplot


def _plt() -> Any:
    return pyplot()


def plot_train(result: Any, curve: list[dict[str, float]] | None, path: str) -> None:
    """Step-time breakdown as a stacked bar, and the scale factor T_n/(nT) against GPUs."""
    plt = _plt()
    ncols = 2 if curve else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4))
    ax = axes[0] if curve else axes
    bottom = 0.0
    for k, v in result.breakdown.items():
        if v <= 0:
            continue
        ax.bar([0], [v], bottom=bottom, label=k)
        bottom += v
    ax.set_xticks([])
    ax.set_ylabel("seconds per step")
    ax.set_title(f"{result.model}: {result.step_time_s:.2f} s/step, MFU {100 * result.mfu:.1f}%")
    ax.legend(fontsize=8)
    if curve:
        ax2 = axes[1]
        ax2.plot([c["gpus"] for c in curve], [c["scale_factor"] for c in curve], marker="o")
        ax2.set_xscale("log", base=2)
        ax2.set_ylim(0, 1.1)
        ax2.set_xlabel("GPUs")
        ax2.set_ylabel("scale factor T_n / (n T)")
        ax2.set_title("weak scaling in data parallelism")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_plan(plan: Any, path: str) -> None:
    """Every fitting layout: step time against memory per GPU, coloured by TP degree."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rs = plan.ranked
    sc = ax.scatter([r.memory.total_bytes / 1e9 for r in rs], [r.step_time_s for r in rs],
                    c=[r.layout.tp for r in rs], s=12, cmap="viridis")
    fig.colorbar(sc, ax=ax, label="TP")
    for i, r in enumerate(rs[:5]):
        L = r.layout
        ax.annotate(f"#{i + 1} {L.tp}x{L.pp}x{L.dp} z{L.zero}", (r.memory.total_bytes / 1e9, r.step_time_s),
                    fontsize=7)
    ax.set_xlabel("memory per GPU (GB)")
    ax.set_ylabel("step time (s)")
    ax.set_title("planner trade-off: step time vs memory (layouts that fit)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
