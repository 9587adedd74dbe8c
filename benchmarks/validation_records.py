"""Judge the simulator's model on every committed validation recording at once.

`ringflow validate --replay FILE` replays one recording; a model change is judged on all of them (the
same measurements, this code's model). For each recording this prints the rows within the tolerance, and
next to it a leave-one-out oracle: each row predicted by the median of the other recordings' measured
times of that row, which knows every other run but not the state of the host in this one (how far the
rows' medians are stable from run to run; where the model beats it, its calibration followed the host).
`--rows` lists the rows outside, `--bias` the rows whose mean error over all recordings passes a
threshold (systematic errors, not noise). Writes JSON with `--json FILE`.

Two ways of reading the same measurements can be judged too (the model is unchanged): `--summary STAT`
summarises each calibration point over its sweeps and each bench row over its passes with another statistic
than the median (recordings that keep them apart, rec91 on), and `--calibration pooled` predicts every job
of a configuration from the per-point median of all its jobs' calibrations instead of its own.

    python benchmarks/validation_records.py benchmarks/records/rec*.json.gz --bias 0.1
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

import numpy as np

Key = tuple[str, int, str, int]


# statistics a calibration point's sweeps and a bench row's passes can be summarised by (`--summary`)
SUMMARIES = {
    "median": lambda v: float(np.median(v)),
    "min": lambda v: float(np.min(v)),
    "q25": lambda v: float(np.quantile(v, 0.25)),
    "mean2": lambda v: float(np.mean(np.sort(v)[:2])),   # the mean of the two fastest
}


def resummarised(job: dict, summary: str) -> dict:
    """A copy of a recorded job whose calibration points (those kept per sweep) and bench rows (those kept
    per pass) are `summary` of their sweeps and passes; a point the calibration timed again (NAME_retimed)
    keeps the faster of that and the retime, as `_calib_worker.measure` does."""
    stat = SUMMARIES[summary]
    job = copy.deepcopy(job)
    cal = job.get("calibration") or {}
    for name, by_size in (cal.get("sweeps") or {}).items():
        retimed = cal["results"].get(f"{name}_retimed", {})
        for size, batches in by_size.items():
            v = stat(batches)
            cal["results"][name][size] = min(v, cal["results"][name][size]) if size in retimed else v
    for row in job["rows"]:
        if row.get("pass_us"):
            row["time_us"] = stat(row["pass_us"])
    return job


def pooled(jobs: Sequence[dict]) -> list[dict]:
    """Copies of `jobs` in which every job of a (transport, ranks) configuration has the per-point median of
    all that configuration's calibrations instead of its own."""
    from ringflow.sim.validate import by_configuration, compared_jobs
    common: dict[tuple[str, int], dict] = {}
    for key, js in by_configuration(compared_jobs(jobs)).items():
        cal = copy.deepcopy(js[0]["calibration"])
        for name, by_size in cal["results"].items():
            for size in by_size:
                seen = [j["calibration"]["results"].get(name, {}).get(size) for j in js]
                by_size[size] = float(np.median([v for v in seen if v is not None]))
        common[key] = cal
    return [{**j, "calibration": common[(j["transport"], int(j["nranks"]))]} for j in jobs]


def replay_rows(path: str, summary: str | None = None, calibration: str = "own") -> list[dict]:
    """The replayed comparison rows of one recording (`sim.validate.replay`), its measurements read with
    `summary` (`resummarised`) and `calibration` "pooled" (`pooled`) where given."""
    from ringflow.sim.validate import compare_jobs, read_record, replay
    if summary is None and calibration == "own":
        return replay(path)[0]
    jobs, max_ranks = read_record(path)
    if summary:
        jobs = [resummarised(j, summary) for j in jobs]
    if calibration == "pooled":
        jobs = pooled(jobs)
    return compare_jobs(jobs, None, max_ranks, 0.15)[0]


def row_key(r: dict) -> Key:
    """A row's identity across recordings: transport, ranks, collective, size."""
    return (r["transport"], int(r["nranks"]), r["collective"], int(r["size_bytes"]))


def oracle_within(measured: Sequence[dict[Key, float]], i: int, tolerance: float) -> int:
    """Rows of recording `i` (`measured`: each recording's measured time per row) whose measured time the
    median of the other recordings' measurements of the same row predicts within `tolerance`."""
    ok = 0
    for k, mine in measured[i].items():
        seen = [m[k] for j, m in enumerate(measured) if j != i and k in m]
        if seen and mine > 0:
            ok += abs(float(np.median(seen)) - mine) / mine <= tolerance
    return ok


def bias_rows(rows_by_rec: Sequence[list[dict]], threshold: float, tolerance: float) -> list[dict]:
    """Rows whose mean error over the recordings is at least `threshold` in size, with how often they were
    outside `tolerance`."""
    errs: dict[Key, list[float]] = {}
    algo: dict[Key, str] = {}
    for rows in rows_by_rec:
        for r in rows:
            errs.setdefault(row_key(r), []).append(float(r["error"]))
            algo[row_key(r)] = r["algorithm"]
    out = []
    for k in sorted(errs):
        e = errs[k]
        if abs(float(np.mean(e))) >= threshold:
            out.append({"transport": k[0], "nranks": k[1], "collective": k[2], "algorithm": algo[k],
                        "size_bytes": k[3], "mean_error": float(np.mean(e)),
                        "outside": int(sum(abs(x) > tolerance for x in e)), "recordings": len(e)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: recordings in, a table per recording (and optionally rows) out."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", help="validation recordings (ringflow validate --record)")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument("--rows", action="store_true", help="list every row outside the tolerance")
    ap.add_argument("--bias", type=float, default=None, help="list rows whose mean error is at least this")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="recordings replayed at once")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("--summary", choices=sorted(SUMMARIES), default=None,
                    help="summarise calibration points over their sweeps and rows over their passes with this "
                         "statistic (default: as recorded, the median of all samples)")
    ap.add_argument("--calibration", choices=("own", "pooled"), default="own",
                    help="pooled: predict each job from the per-point median of its configuration's calibrations")
    a = ap.parse_args(argv)
    from functools import partial

    from rich.console import Console
    from rich.table import Table
    with ProcessPoolExecutor(max(1, a.jobs)) as ex:
        rows_by_rec = list(ex.map(partial(replay_rows, summary=a.summary, calibration=a.calibration), a.records))
    table = Table(title=f"rows within {a.tolerance:.0%}: this code's model vs the leave-one-out oracle")
    for col in ("recording", "rows", "model", "oracle"):
        table.add_column(col, justify="left" if col == "recording" else "right")
    measured = [{row_key(r): r["measured_us"] for r in rows} for rows in rows_by_rec]
    per = []
    for i, (path, rows) in enumerate(zip(a.records, rows_by_rec)):
        model = sum(abs(r["error"]) <= a.tolerance for r in rows)
        oracle = oracle_within(measured, i, a.tolerance) if len(rows_by_rec) > 1 else None
        per.append({"recording": os.path.basename(path), "rows": len(rows), "model": model, "oracle": oracle})
        table.add_row(per[-1]["recording"], str(len(rows)), str(model), "-" if oracle is None else str(oracle))
    total = sum(p["model"] for p in per)
    table.add_row("total", str(sum(p["rows"] for p in per)), str(total),
                  "-" if len(per) < 2 else str(sum(p["oracle"] for p in per)))
    console = Console()
    console.print(table)
    outside = [{"recording": os.path.basename(path), **r} for path, rows in zip(a.records, rows_by_rec)
               for r in rows if abs(r["error"]) > a.tolerance]
    if a.rows:
        for r in outside:
            console.print(f"{r['recording']}: {r['transport']}{r['nranks']} {r['collective']} {r['algorithm']} "
                          f"{r['size_bytes']} {r['error']:+.3f} (spread {r['spread']:.2f})")
    biased = bias_rows(rows_by_rec, a.bias, a.tolerance) if a.bias is not None else []
    for b in biased:
        console.print(f"{b['transport']}{b['nranks']} {b['collective']} {b['algorithm']} {b['size_bytes']}: "
                      f"mean {b['mean_error']:+.3f}, outside {b['outside']}/{b['recordings']}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump({"tolerance": a.tolerance, "recordings": per, "total": total, "outside": outside,
                       "bias": biased}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
