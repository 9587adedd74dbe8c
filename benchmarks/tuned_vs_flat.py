#!/usr/bin/env python3
"""The runtime's flat tuner versus calibrated tuning (RINGFLOW_TUNER_TOPO), same host, same run.

    .venv/bin/python benchmarks/tuned_vs_flat.py --json tuned.json --plot tuned.png

First `ringflow calibrate` (real ranks over shm and TCP, 2 and 4 of them) writes this host's
topology; then, per transport and rank count, `ringflow bench` jobs of every collective alternate
between the flat alpha-beta tuner and the calibrated one (`--repeats` of each, interleaved so both
see the same drift), timed as nccl-tests times (median of samples of back-to-back calls, the
slowest rank's time). A row shows each tuner's algorithm, its median time, algbw and busbw, and the
speed-up (flat time / tuned time). Rows where both picked the same algorithm measure the same
schedule twice: their speed-up is the noise floor.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ringflow.runtime import bench  # noqa: E402
from ringflow.sim.calibrate import calibrate  # noqa: E402
from ringflow.units import format_size  # noqa: E402


def _median_rows(jobs: list[list[dict]]) -> dict[tuple[str, int], dict]:
    """Rows of repeated jobs merged: median time (and the bandwidths recomputed from it)."""
    by: dict[tuple[str, int], list[dict]] = {}
    for rows in jobs:
        for r in rows:
            by.setdefault((r["collective"], r["size_bytes"]), []).append(r)
    out = {}
    for key, rs in by.items():
        t = float(np.median([r["time_us"] for r in rs]))
        algbw = key[1] / (t * 1e3)
        factor = rs[0]["busbw_GBps"] / rs[0]["algbw_GBps"] if rs[0]["algbw_GBps"] else 1.0
        out[key] = {"algorithm": rs[0]["algorithm"], "time_us": t, "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
                    "algorithms_seen": sorted({r["algorithm"] for r in rs})}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--collectives", default="all")
    ap.add_argument("--min", default="64KiB")
    ap.add_argument("--max", default="16MiB")
    ap.add_argument("--repeats", type=int, default=2, help="bench jobs per tuner and configuration")
    ap.add_argument("--topo", help="a calibrated topology to use instead of calibrating first")
    ap.add_argument("--quick", action="store_true", help="quick calibration")
    ap.add_argument("--cal-repeats", type=int, default=1, help="calibration jobs per transport and rank count "
                    "(their median: `ringflow calibrate --repeats`)")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--plot", help="draw the speed-ups per configuration (PNG, needs matplotlib)")
    a = ap.parse_args()
    ranks = [int(x) for x in a.ranks.split(",") if x]
    transports = [t for t in a.transports.split(",") if t]
    from rich.console import Console
    from rich.table import Table
    console = Console()
    with tempfile.TemporaryDirectory(prefix="ringflow-tuned-") as tmp:
        topo_path = a.topo
        if topo_path is None:
            console.print(f"calibrating this host ({', '.join(transports)} x {ranks} ranks)...")
            topo, _ = calibrate(nprocs=max(ranks), quick=a.quick, transports=tuple(transports),
                                rank_counts=tuple(ranks), repeats=a.cal_repeats)
            topo_path = os.path.join(tmp, "host.yaml")
            topo.save(topo_path)
        results = []
        for tr in transports:
            for n in ranks:
                env = {"RINGFLOW_SHM_DISABLE": "1" if tr == "tcp" else "0"}
                jobs: dict[str, list[list[dict]]] = {"flat": [], "tuned": []}
                for i in range(a.repeats):
                    for mode in ("flat", "tuned") if i % 2 == 0 else ("tuned", "flat"):
                        console.print(f"{tr} {n} ranks: {mode} tuner, job {i + 1}/{a.repeats}")
                        extra = dict(env, **({"RINGFLOW_TUNER_TOPO": topo_path} if mode == "tuned" else {}))
                        jobs[mode].append(bench.launch(a.collectives, n, a.min, a.max, extra_env=extra))
                flat, tuned = _median_rows(jobs["flat"]), _median_rows(jobs["tuned"])
                for key in sorted(flat):
                    f, t = flat[key], tuned[key]
                    results.append({"transport": tr, "nranks": n, "collective": key[0], "size_bytes": key[1],
                                    "flat": f, "tuned": t, "speedup": f["time_us"] / t["time_us"]})
    table = Table(title="flat tuner vs calibrated tuning (RINGFLOW_TUNER_TOPO), median of jobs")
    for col in ("tr", "n", "collective", "size", "flat algo", "flat us", "busbw", "tuned algo", "tuned us",
                "busbw", "speed-up"):
        table.add_column(col, justify="right" if col not in ("tr", "collective", "flat algo", "tuned algo") else "left")
    for r in results:
        same = r["flat"]["algorithm"] == r["tuned"]["algorithm"]
        table.add_row(r["transport"], str(r["nranks"]), r["collective"], format_size(r["size_bytes"]),
                      r["flat"]["algorithm"], f"{r['flat']['time_us']:.0f}", f"{r['flat']['busbw_GBps']:.2f}",
                      "=" if same else r["tuned"]["algorithm"], f"{r['tuned']['time_us']:.0f}",
                      f"{r['tuned']['busbw_GBps']:.2f}", f"{r['speedup']:.2f}x")
    console.print(table)
    changed = [r for r in results if r["flat"]["algorithm"] != r["tuned"]["algorithm"]]
    same = [r for r in results if r["flat"]["algorithm"] == r["tuned"]["algorithm"]]
    if changed:
        sp = np.array([r["speedup"] for r in changed])
        console.print(f"{len(changed)} of {len(results)} rows changed algorithm: speed-up median {np.median(sp):.2f}x, "
                      f"geometric mean {np.exp(np.mean(np.log(sp))):.2f}x, worst {sp.min():.2f}x, best {sp.max():.2f}x")
    if same:
        sp = np.array([r["speedup"] for r in same])
        console.print(f"{len(same)} rows ran the same algorithm twice (noise floor): {sp.min():.2f}x .. {sp.max():.2f}x")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)
        console.print(f"wrote {a.json}")
    if a.plot:
        _plot(results, a.plot)
        console.print(f"wrote {a.plot}")


def _plot(results: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = sorted({(r["transport"], r["nranks"]) for r in results})
    fig, axes = plt.subplots(1, len(configs), figsize=(4.5 * len(configs), 4), sharey=True, squeeze=False)
    for ax, (tr, n) in zip(axes[0], configs):
        for coll in sorted({r["collective"] for r in results}):
            rs = [r for r in results if (r["transport"], r["nranks"], r["collective"]) == (tr, n, coll)]
            line, = ax.plot([r["size_bytes"] for r in rs], [r["speedup"] for r in rs], marker=".", lw=0.8,
                            alpha=0.6, label=coll)
            moved = [r for r in rs if r["flat"]["algorithm"] != r["tuned"]["algorithm"]]
            ax.scatter([r["size_bytes"] for r in moved], [r["speedup"] for r in moved], s=60, marker="*",
                       color=line.get_color(), zorder=3)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{tr}, {n} ranks")
        ax.set_xlabel("size (bytes)")
    axes[0][0].set_ylabel("flat time / tuned time (stars: another algorithm)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
