"""Out-of-sample validation of a host cost model against `ringflow bench` and the runtime's own choices.

Accuracy: for every transport and rank count, `ringflow bench` (the runtime's default choice of schedule,
new processes, after the calibration) runs the listed collectives and sizes in `jobs` separate jobs; each
size is predicted from the model and compared with the mean of the jobs (of the quiet ones where a job ran
beside other processes' work even after `BUSY_RETRIES` further attempts). The jobs of one configuration are
run a whole sweep apart, and their disagreement is the noise floor: the share of sizes where the bench
disagreed with itself by more than the model's error there.

Choice: where the model would run another of the tuner's candidates than the flat choice (it predicts a
gain beyond its margin, `selection.model_decision`), both schedules are timed in one job, interleaved over
several passes, and the model's choice counts as right where it is at least as fast.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..algorithms.schedule import Collective
from ..algorithms.selection import call_shape, model_decision
from ..runtime.bench import launch
from ..runtime.job.hostload import FOREIGN_BUSY_FRACTION, HostLoadMeter
from .model import HostCostModel
from .sweep import BUSY_RETRIES, FLAT, INPLACE, measure_quietly, runtime_default, single_ring_bytes, wait_for_quiet

VALIDATION_RANKS = (2, 3, 4, 6, 8)
VALIDATION_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
VALIDATION_SIZES = tuple(64 * 2**10 * 4**k for k in range(5))   # 64 KiB .. 16 MiB
CHOICE_PASSES = 4


def _busy(load: dict | None) -> bool:
    return bool(load and load["foreign_fraction"] >= FOREIGN_BUSY_FRACTION)


def _bench_job(transport: str, n: int, collectives: Sequence[str], sizes: Sequence[int]) -> dict:
    """One bench job after waiting for the host to be quiet; one that still ran beside other processes' work
    is run again (BUSY_RETRIES times at most) and the least disturbed attempt kept."""
    env = {"RINGFLOW_SHM_DISABLE": "1" if transport == "tcp" else "", "RINGFLOW_TUNER_MODEL": "", "RINGFLOW_ALGO": ""}
    best: dict[str, Any] | None = None
    attempts = 0
    for _ in range(1 + BUSY_RETRIES):
        attempts += 1
        wait_for_quiet()
        with HostLoadMeter() as meter:
            rows = launch(",".join(collectives), n, 1, 1, sizes=list(sizes), extra_env=env)
        job: dict[str, Any] = {"rows": rows, "load": meter.result.as_dict() if meter.result is not None else None}
        if best is None or (job["load"] and best["load"]
                            and job["load"]["foreign_fraction"] < best["load"]["foreign_fraction"]):
            best = job
        if not _busy(job["load"]):
            break
    assert best is not None
    best["attempts"] = attempts
    return best


def accuracy_rows(models: dict[str, HostCostModel], jobs: list[dict]) -> list[dict]:
    """One row per (transport, ranks, collective, size): measured per job, predicted, error, spread."""
    by: dict[tuple, list[dict]] = {}
    for j in jobs:
        for r in j["rows"]:
            by.setdefault((j["transport"], r["nranks"], r["collective"], r["size_bytes"]), []).append(
                {"time_us": r["time_us"], "algorithm": r["algorithm"], "busy": _busy(j["load"])})
    out = []
    for (tr, n, coll, size), got in sorted(by.items()):
        sched = runtime_default(coll, size, n)
        shape = call_shape(Collective.parse(coll), n, size, 4)
        pred = models[tr].predict_us(sched, shape, coll in INPLACE)
        times = [g["time_us"] for g in got]
        quiet = [g["time_us"] for g in got if not g["busy"]]
        meas = float(np.mean(quiet or times))   # jobs that ran beside other work only where no other was quiet
        spread = (max(times) - min(times)) / meas if len(times) > 1 else 0.0
        out.append({"transport": tr, "nranks": n, "collective": coll, "size_bytes": size, "algorithm": sched.algorithm,
                    "bench_algorithm": got[0]["algorithm"], "measured_us": meas, "jobs_us": times,
                    "predicted_us": pred, "error": (pred - meas) / meas, "spread": spread,
                    "busy_jobs": sum(g["busy"] for g in got), "calibrated": n in models[tr].calibrated_ranks})
    return out


def summarise(rows: list[dict]) -> list[dict]:
    """Per (transport, ranks): sizes, median and p90 absolute relative error, noise floor."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["transport"], r["nranks"]), []).append(r)
    out = []
    for (tr, n), rs in sorted(by.items()):
        err = np.abs([r["error"] for r in rs])
        noisy = sum(r["spread"] > abs(r["error"]) for r in rs)
        out.append({"transport": tr, "nranks": n, "n": len(rs), "median": float(np.median(err)),
                    "p90": float(np.quantile(err, 0.9)), "noise_floor": noisy / len(rs),
                    "median_spread": float(np.median([r["spread"] for r in rs])),
                    "calibrated": rs[0]["calibrated"], "busy_rows": sum(r["busy_jobs"] > 0 for r in rs)})
    return out


def choice_tasks(model: HostCostModel, n: int, collectives: Sequence[str], sizes: Sequence[int]) -> list[dict]:
    """For each call where the model picks another schedule than the flat choice: the two tasks (flat, model)."""
    tasks = []
    for coll in collectives:
        c = Collective.parse(coll)
        for size in sizes:
            nbytes = call_shape(c, n, size, 4).count * 4 * (n if c.per_rank_sized else 1)
            d = model_decision(c, nbytes, n, 0 if c.has_root else None, 4, coll in INPLACE, single_ring_bytes(), model)
            if d.chosen is d.flat:
                continue
            cand = next(cd for cd, s, _ in d.candidates if s is d.chosen)
            base = {"collective": coll, "size_bytes": nbytes}
            tasks.append({**base, "algorithm": FLAT, "role": "flat", "predicted_us": d.flat_us})
            tasks.append({**base, "algorithm": cand.algorithm, "nsegs": cand.nsegs, "nchannels": cand.nchannels,
                          "role": "model", "predicted_us": d.chosen_us})
    return tasks


def choice_results(rows: list[dict]) -> list[dict]:
    """Pair each call's flat and model rows: measured both, whether the model's choice was at least as fast."""
    by: dict[tuple, dict] = {}
    for r in rows:
        by.setdefault((r["transport"], r["nranks"], r["collective"], r["size_bytes"]), {})[r["role"]] = r
    out = []
    for (tr, n, coll, size), d in sorted(by.items()):
        if "flat" in d and "model" in d:
            f, m = d["flat"], d["model"]
            out.append({"transport": tr, "nranks": n, "collective": coll, "size_bytes": size,
                        "flat": f["schedule"]["algorithm"], "model": m["schedule"]["algorithm"],
                        "flat_us": f["time_us"], "model_us": m["time_us"], "flat_predicted_us": f["predicted_us"],
                        "model_predicted_us": m["predicted_us"], "model_wins": m["time_us"] <= f["time_us"]})
    return out


def validate(models: dict[str, HostCostModel], ranks: Sequence[int] = VALIDATION_RANKS,
             collectives: Sequence[str] = VALIDATION_COLLECTIVES, sizes: Sequence[int] = VALIDATION_SIZES,
             jobs: int = 2, progress: Callable[[str], None] | None = None) -> dict:
    """Run the accuracy and choice experiments; the results document (rows, summary, choice)."""
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    bench_jobs = []
    for j in range(jobs):   # a whole sweep between a configuration's jobs
        for tr in models:
            for n in ranks:
                say(f"bench job {j + 1}/{jobs}: {tr}, {n} ranks")
                bench_jobs.append({"transport": tr, "nranks": n, **_bench_job(tr, n, collectives, sizes)})
    rows = accuracy_rows(models, bench_jobs)
    choice_rows = []
    for tr, model in models.items():
        for n in ranks:
            tasks = choice_tasks(model, n, collectives, sizes)
            if not tasks:
                continue
            say(f"choice: {tr}, {n} ranks: {len(tasks) // 2} calls where the model switches")
            job = measure_quietly(n, tr, tasks, passes=CHOICE_PASSES, quick=False)
            choice_rows += job["rows"]
    choice = choice_results(choice_rows)
    wins = sum(c["model_wins"] for c in choice)
    return {"rows": rows, "summary": summarise(rows), "choice": choice,
            "choice_summary": {"switched": len(choice), "at_least_as_fast": wins,
                               "share": wins / len(choice) if choice else None},
            "jobs": [{"transport": j["transport"], "nranks": j["nranks"], "load": j["load"], "attempts": j["attempts"]}
                     for j in bench_jobs],
            "ranks": list(ranks), "collectives": list(collectives), "sizes": list(sizes), "bench_jobs_per_config": jobs,
            "duration_s": time.monotonic() - t0}
