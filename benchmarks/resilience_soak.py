"""Soak figures: back-to-back mixed small collectives and communicator create/destroy cycles on real
ranks, with resident memory, open file descriptors and threads sampled from /proc.

    python benchmarks/resilience_soak.py --ops 10000 --cycles 1000 --nranks 2 --json out.json

Collectives cycle through all_reduce, broadcast, all_gather, reduce_scatter, all_to_all, reduce and
barrier on 8-element float32 buffers, each result checked. Cycles rotate through split,
new_group, split + shrink (two communicators) and a full `ringflow.init()`, each followed by a
checked all-reduce and destroy(). Samples are taken every 10% of each phase after gc.collect();
"growth" is the last sample minus the 10% sample (after warm-up).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resilience_ranks import Job  # noqa: E402


def summarise(points: list[dict]) -> dict:
    """Warm (10%) and final samples and the growth between them."""
    base, last = points[1], points[-1]
    return {"rss_kib_warm": base["rss_kib"], "rss_kib_final": last["rss_kib"],
            "rss_growth_kib": last["rss_kib"] - base["rss_kib"], "fds_warm": base["fds"], "fds_final": last["fds"],
            "fds_peak": max(p["fds"] for p in points[1:]), "threads_warm": base["threads"],
            "threads_final": last["threads"]}


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print its figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--cycles", type=int, default=1_000)
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--ops", str(a.ops), "--cycles", str(a.cycles), "--timeout", "60"]
        with Job(a.nranks, "soak", Path(tmp), args) as job:
            codes = job.wait(3600)
            if codes != [0] * a.nranks:
                print(job.logs(), file=sys.stderr)
                return 1
            ranks = [job.result(r) for r in range(a.nranks)]
    out = {"ops": a.ops, "cycles": a.cycles, "nranks": a.nranks, "wall_s": time.monotonic() - t0, "ranks": []}
    for res in ranks:
        row = {"rank": res["rank"], "wrong": res["wrong"], "communicators_made": res["made"],
               "ops_per_s": a.ops / res["ops_s"], "cycle_ms": 1e3 * res["cycles_s"] / a.cycles,
               "collectives": summarise(res["ops"]), "cycles": summarise(res["cycles"])}
        out["ranks"].append(row)
        for phase in ("collectives", "cycles"):
            s = row[phase]
            print(f"rank {res['rank']} {phase:11s}: RSS {s['rss_kib_warm'] / 1024:.1f} -> "
                  f"{s['rss_kib_final'] / 1024:.1f} MiB (growth {s['rss_growth_kib']} KiB), "
                  f"fds {s['fds_warm']} -> {s['fds_final']} (peak {s['fds_peak']}), "
                  f"threads {s['threads_warm']} -> {s['threads_final']}")
        print(f"rank {res['rank']}: {row['ops_per_s']:.0f} checked collectives/s, {row['cycle_ms']:.1f} ms per "
              f"create/destroy cycle, {row['communicators_made']} communicators, wrong={row['wrong']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0 if all(r["wrong"] == 0 for r in out["ranks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
