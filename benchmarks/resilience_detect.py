"""Detection time of a failed rank: one rank is killed, departs or is stopped mid-all-reduce, K times; how long
until every survivor has raised an error naming it, and how long their shrink takes.

    python benchmarks/resilience_detect.py --fault kill --kills 20 --nranks 3 --transport shm --json out.json

Faults: `kill` (SIGKILL: RemoteError from the closed control socket), `depart` (the rank destroys its
communicator between two calls: RemoteError naming it, from its goodbye), `stop` (SIGSTOP: the rank is alive but
never arrives; Timeout naming it after the call timeout, `--stop-timeout`, which is the detection time by design).

Each trial starts `nranks` fresh ranks (the store is served by this script, so any rank may be
the victim), waits until they loop on checked all-reduces of `--count` float32, sleeps a random
0-200 ms, kills a random rank, and reads the survivors' error time. ``time.monotonic()`` is one
clock for all processes of the host, so detection = survivor's error time - kill time. The
detection path is the control socket's EOF (the kernel closes a killed process's sockets), so the
time is wake-up latency, not a heartbeat period.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resilience_ranks import Job  # noqa: E402


def trial(nranks: int, transport: str, count: int, rng: random.Random, out: Path, fault: str = "kill",
          stop_timeout_s: float = 3.0) -> dict:
    """One fault; per survivor detection and shrink seconds."""
    import signal
    env = {"RINGFLOW_SHM_DISABLE": "1"} if transport == "tcp" else {}
    timeout = stop_timeout_s if fault == "stop" else 30.0
    args = ["--shrink", "--count", str(count), "--timeout", str(timeout), "--max-s", "120"]
    with Job(nranks, "loop", out, args + (["--depart-on-signal"] if fault == "depart" else []), env=env) as job:
        job.wait_ready()
        time.sleep(rng.uniform(0.0, 0.2))
        victim = rng.randrange(nranks)
        survivors = [r for r in range(nranks) if r != victim]
        if fault == "kill":
            t_kill = job.kill(victim)
        elif fault == "stop":
            t_kill = job.signal(victim, signal.SIGSTOP)
        else:
            job.signal(victim, signal.SIGUSR2)
        if fault == "stop":
            end = time.monotonic() + 120
            while any(job.procs[r].poll() is None for r in survivors) and time.monotonic() < end:
                time.sleep(0.05)
            job.kill(victim)
            job.signal(victim, signal.SIGCONT)
        codes = job.wait(120)
        if fault == "depart":
            t_kill = (job.result(victim) or {}).get("departed_t", float("nan"))
        rows = []
        for r in survivors:
            res = job.result(r)
            if codes[r] != 0 or res is None or res.get("error") is None:
                raise RuntimeError(f"rank {r} did not report an error (exit {codes[r]})\n{job.logs()}")
            err = res["error"]
            rows.append({"rank": r, "type": err["type"], "named": err.get("rank"), "detect_s": err["t"] - t_kill,
                         "shrink_s": res.get("shrink_s"), "after_shrink_ok": res.get("after_shrink_ok")})
        want = "Timeout" if fault == "stop" else "RemoteError"
        return {"victim": victim, "survivors": rows,
                "all_detect_s": max(x["detect_s"] for x in rows),
                "correct": all(x["type"] == want and x["named"] == victim and x["after_shrink_ok"] for x in rows)}


def main(argv: list[str] | None = None) -> int:
    """Run the trials and print the summary."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20, help="trials")
    ap.add_argument("--fault", choices=["kill", "depart", "stop"], default="kill")
    ap.add_argument("--stop-timeout", type=float, default=3.0, help="stop: the call timeout (s)")
    ap.add_argument("--nranks", type=int, default=3)
    ap.add_argument("--transport", choices=["shm", "tcp"], default="shm")
    ap.add_argument("--count", type=int, default=1 << 18, help="float32 elements per all-reduce")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    trials = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.kills):
            t = trial(a.nranks, a.transport, a.count, rng, Path(tmp) / f"t{k}", a.fault, a.stop_timeout)
            trials.append(t)
            print(f"{a.fault} {k + 1:2d}: rank {t['victim']} -> all {len(t['survivors'])} survivors knew after "
                  f"{t['all_detect_s'] * 1e3:7.1f} ms; shrink "
                  f"{max(x['shrink_s'] or 0 for x in t['survivors']) * 1e3:6.1f} ms; correct={t['correct']}",
                  flush=True)
    per_survivor = [x["detect_s"] for t in trials for x in t["survivors"]]
    all_know = [t["all_detect_s"] for t in trials]
    shrink = [x["shrink_s"] for t in trials for x in t["survivors"] if x["shrink_s"] is not None]
    summary = {"fault": a.fault, "trials_run": a.kills, "nranks": a.nranks, "transport": a.transport, "count": a.count,
               "detect_all_survivors_ms": {"median": statistics.median(all_know) * 1e3, "max": max(all_know) * 1e3},
               "detect_per_survivor_ms": {"median": statistics.median(per_survivor) * 1e3,
                                          "max": max(per_survivor) * 1e3},
               "shrink_ms": {"median": statistics.median(shrink) * 1e3, "max": max(shrink) * 1e3},
               "all_correct": all(t["correct"] for t in trials), "trials": trials}
    print(json.dumps({k: v for k, v in summary.items() if k != "trials"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    return 0 if summary["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
