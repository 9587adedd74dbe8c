"""`ringflow run`: start N local ranks with the environment set, prefix their output, fail fast.

Ranks are pinned one per core when they fit (`binding`), as mpirun does. The launcher serves the
rendezvous store itself (127.0.0.1, a free port), generates the job secret
and a job id, and sets RINGFLOW_RANK / _WORLD_SIZE / _LOCAL_RANK / _STORE_ADDR / _SECRET / _JOB_ID.
If a rank exits non-zero the others are stopped (SIGTERM, then SIGKILL) and the launcher exits
with that rank's code; past `timeout_s` everything is killed and the exit code is 124. Leftover
shared-memory names of the job are removed at the end.
"""
from __future__ import annotations

import glob
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO

from ..errors import InvalidArgument
from . import auth
from .store import StoreServer

TIMEOUT_EXIT = 124


def rank_env(rank: int, nprocs: int, store_addr: str, secret: str, job_id: str,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one rank."""
    env = dict(os.environ if base is None else base)
    env.update({"RINGFLOW_RANK": str(rank), "RINGFLOW_WORLD_SIZE": str(nprocs), "RINGFLOW_LOCAL_RANK": str(rank),
                "RINGFLOW_STORE_ADDR": store_addr, "RINGFLOW_SECRET": secret, "RINGFLOW_JOB_ID": job_id,
                "PYTHONUNBUFFERED": "1"})
    if nprocs > 1:
        # like torchrun: one BLAS/OpenMP thread per rank unless the user chose, or N ranks x N threads thrash
        for var in THREAD_VARS:
            env.setdefault(var, "1")
    return env


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _pump(stream: IO[bytes], prefix: bytes, out: IO[bytes], lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
            out.flush()
    stream.close()


def command_for(argv: Sequence[str]) -> list[str]:
    """`script.py args` runs under this Python; `-m module args` too; anything else runs as is."""
    if not argv:
        raise InvalidArgument("no program to run", "usage: ringflow run -n 4 script.py [args]")
    if argv[0].endswith(".py") or argv[0] == "-m":
        return [sys.executable, *argv]
    return list(argv)


def cleanup_shm(job_id: str) -> int:
    """Remove /dev/shm names left by a job; the number removed."""
    n = 0
    for path in glob.glob(f"/dev/shm/ringflow-{job_id}-*"):
        try:
            os.unlink(path)
            n += 1
        except OSError:
            pass
    return n


def binding(nprocs: int, bind: bool | None = None) -> list[set[int]] | None:
    """One core per rank (as `mpirun --bind-to core`) when this process may use at least nprocs cores.

    Pinning stops the scheduler from pulling two ranks that wake each other onto one core (its
    wake-affine heuristic), which turns every small collective into a context-switch ping-pong on a
    busy machine. None (no binding) when asked, or when there are fewer cores than ranks.
    """
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if bind is False or not cpus or nprocs > len(cpus):
        return None
    return [{cpus[r]} for r in range(nprocs)]


def run(nprocs: int, argv: Sequence[str], *, timeout_s: float | None = None, prefix: bool = True,
        extra_env: dict[str, str] | None = None, bind: bool | None = None) -> int:
    """Run argv as nprocs ranks; the job's exit code. `bind`: pin ranks to cores (default: if they fit)."""
    if nprocs < 1:
        raise InvalidArgument(f"-n {nprocs}", "run at least one rank")
    cmd = command_for(argv)
    secret = auth.new_secret()
    job_id = "j" + secrets.token_hex(5)
    server = StoreServer("127.0.0.1", 0, secret)
    addr = f"{server.address[0]}:{server.address[1]}"
    cores = binding(nprocs, bind)
    lock = threading.Lock()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    code = 0
    try:
        for r in range(nprocs):
            env = rank_env(r, nprocs, addr, secret, job_id)
            if extra_env:
                env.update(extra_env)
            pin = None if cores is None else (lambda c=cores[r]: os.sched_setaffinity(0, c))
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=False, preexec_fn=pin)
            procs.append(p)
            pre = f"[{r}] ".encode() if prefix else b""
            for stream, out in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=_pump, args=(stream, pre, out, lock), daemon=True)
                t.start()
                pumps.append(t)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                r, code = failed[0]
                with lock:
                    sys.stderr.write(f"ringflow run: rank {r} exited with code {code}; stopping the others\n")
                break
            if all(c == 0 for c in codes):
                code = 0
                break
            if deadline is not None and time.monotonic() > deadline:
                with lock:
                    sys.stderr.write(f"ringflow run: timeout after {timeout_s}s; killing all ranks\n")
                code = TIMEOUT_EXIT
                break
            time.sleep(0.02)
    except KeyboardInterrupt:
        code = 130
    finally:
        _stop(procs)
        for t in pumps:
            t.join(timeout=2.0)
        server.close()
        cleanup_shm(job_id)
    if code < 0:  # killed by a signal: shell convention
        code = 128 - code
    return code


def _stop(procs: list[subprocess.Popen]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        try:
            p.send_signal(signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + 3.0
    for p in alive:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
