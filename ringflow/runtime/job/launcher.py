"""`ringflow run`: start N local ranks with the environment set, prefix their output, fail fast.

Ranks are pinned one per core when they fit (`binding`), as mpirun does. The launcher serves the
rendezvous store itself (127.0.0.1, a free port), generates the job secret
and a job id, and sets RINGFLOW_RANK / _WORLD_SIZE / _LOCAL_RANK / _STORE_ADDR / _SECRET / _JOB_ID.
If a rank exits non-zero the others are stopped (SIGTERM, then SIGKILL after STOP_GRACE_S) and the
launcher exits with that rank's code (as mpirun does; torchrun exits 1); past `timeout_s` everything is
killed and the exit code is 124. SIGINT, SIGTERM and SIGHUP to the launcher stop the ranks the same way and
exit with 128 + the signal's number (130, 143, 129). Every rank gets SIGKILL from the kernel when the
launcher dies, even by SIGKILL (PR_SET_PDEATHSIG), and its shared-memory names are removed by its reaper
helper; the launcher removes whatever names of the job remain when it ends.

The job directory (RINGFLOW_DUMP_DIR or RINGFLOW_RECORD if set, else a new ``<tmp>/ringflow-runs/<job id>``,
passed to the ranks as RINGFLOW_DUMP_DIR) receives every rank's flight rings (runtime/flightring.py); when the
job fails or is stopped the launcher writes ``job.json`` there (how the job and each rank ended) and prints the
directory for `ringflow diagnose`; a job that completes leaves no directory it made behind.
"""
from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from ...errors import InvalidArgument, Terminated, raise_terminated
from . import auth
from .store import StoreServer

TIMEOUT_EXIT = 124
STOP_GRACE_S = 2.0   # SIGTERM, then this long before SIGKILL (a rank marks its flight rings ended meanwhile)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """In a forked child before exec: ask the kernel for SIGKILL when the parent dies (Linux; elsewhere a no-op),
    and exit at once if the parent is already gone."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)


def rank_env(rank: int, nprocs: int, store_addr: str, secret: str, job_id: str,
             base: dict[str, str] | None = None, torch_port: int | None = None) -> dict[str, str]:
    """The environment of one rank: ringflow's variables, and torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: rank 0 serves torch's store on `torch_port`) unless set, so
    `torch.distributed.init_process_group("ringflow")` works unchanged under `ringflow run`."""
    env = dict(os.environ if base is None else base)
    env.update({"RINGFLOW_RANK": str(rank), "RINGFLOW_WORLD_SIZE": str(nprocs), "RINGFLOW_LOCAL_RANK": str(rank),
                "RINGFLOW_STORE_ADDR": store_addr, "RINGFLOW_SECRET": secret, "RINGFLOW_JOB_ID": job_id,
                "PYTHONUNBUFFERED": "1"})
    if torch_port is not None and "MASTER_PORT" not in env:
        env.update({"RANK": str(rank), "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(nprocs), "MASTER_ADDR": store_addr.rpartition(":")[0],
                    "MASTER_PORT": str(torch_port)})
    if nprocs > 1:
        # like torchrun: one BLAS/OpenMP thread per rank unless the user chose, or N ranks x N threads thrash
        for var in THREAD_VARS:
            env.setdefault(var, "1")
    return env


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def free_port(host: str) -> int:
    """A TCP port free on `host` now (the OS's pick), for a server a rank starts a moment later."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


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


def job_dir(job_id: str, env: dict[str, str]) -> tuple[Path | None, bool]:
    """Where the ranks' flight records go, and whether the launcher makes it: RINGFLOW_DUMP_DIR or RINGFLOW_RECORD
    when set, none with RINGFLOW_FLIGHT_RECORDER=0, else ``<tmp>/ringflow-runs/<job_id>`` (TMPDIR honoured)."""
    given = env.get("RINGFLOW_DUMP_DIR") or env.get("RINGFLOW_RECORD")
    if given:
        return Path(given), False
    if env.get("RINGFLOW_FLIGHT_RECORDER", "").strip() == "0":
        return None, False
    return Path(tempfile.gettempdir()) / "ringflow-runs" / job_id, True


def _rank_end(p: subprocess.Popen, stopped: dict[int, str]) -> str:
    """How one rank ended, in words."""
    c = p.returncode
    how = stopped.get(p.pid)
    if c is None:
        return "still running"
    if c >= 0:
        return f"exited with code {c}" + (f" after {how}" if how else "")
    name = signal.Signals(-c).name if -c in signal.Signals._value2member_map_ else f"signal {-c}"
    return f"killed by {name}" + (f" ({how})" if how and how.startswith(name + " ") else " (not sent by the launcher)")


def _write_job(d: Path, job_id: str, cmd: list[str], ended: str, code: int, procs: list[subprocess.Popen],
               stopped: dict[int, str]) -> None:
    """job.json: how the job ended and how each rank did (ringflow diagnose reads it)."""
    doc = {"kind": "job", "job_id": job_id, "argv": cmd, "nprocs": len(procs), "ended": ended, "exit_code": code,
           "grace_s": STOP_GRACE_S, "mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns(),
           "ranks": [{"rank": r, "pid": p.pid, "returncode": p.returncode, "end": _rank_end(p, stopped)}
                     for r, p in enumerate(procs)]}
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / "job.json").write_text(json.dumps(doc, indent=1) + "\n")
    except OSError as exc:
        sys.stderr.write(f"ringflow run: cannot write {d / 'job.json'}: {exc}\n")


def run(nprocs: int, argv: Sequence[str], *, timeout_s: float | None = None, prefix: bool = True,
        extra_env: dict[str, str] | None = None, bind: bool | None = None) -> int:
    """Run argv as nprocs ranks; the job's exit code. `bind`: pin ranks to cores (default: if they fit)."""
    if nprocs < 1:
        raise InvalidArgument(f"-n {nprocs}", "run at least one rank")
    cmd = command_for(argv)
    secret = auth.new_secret()
    job_id = "j" + secrets.token_hex(5)
    records, made = job_dir(job_id, {**os.environ, **(extra_env or {})})
    if made and records is not None:
        records.mkdir(parents=True, exist_ok=True)
    server = StoreServer("127.0.0.1", 0, secret)
    addr = f"{server.address[0]}:{server.address[1]}"
    torch_port = free_port(server.address[0])
    cores = binding(nprocs, bind)
    lock = threading.Lock()
    handlers = _catch_stop_signals()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    stopped: dict[int, str] = {}
    code = 0
    ended = "completed"
    try:
        for r in range(nprocs):
            env = rank_env(r, nprocs, addr, secret, job_id, torch_port=torch_port)
            if extra_env:
                env.update(extra_env)
            if made and records is not None:
                env["RINGFLOW_DUMP_DIR"] = str(records)
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=False, preexec_fn=_child_setup(None if cores is None else cores[r]))
            procs.append(p)
            pre = f"[{r}] ".encode() if prefix else b""
            for stream, out in ((p.stdout, sys.stdout.buffer), (p.stderr, sys.stderr.buffer)):
                t = threading.Thread(target=_pump, args=(stream, pre, out, lock), daemon=True)
                t.start()
                pumps.append(t)
        code, ended = _watch(procs, timeout_s, lock)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
        ended = "SIGINT to the launcher"
    except Terminated as exc:
        with lock:
            sys.stderr.write(f"ringflow run: signal {exc.signum}; stopping all ranks\n")
        code = 128 + exc.signum
        ended = f"{signal.Signals(exc.signum).name} to the launcher"
    finally:
        _ignore_stop_signals(handlers)   # a second SIGTERM must not cut the cleanup short (it is bounded anyway)
        stopped = _stop(procs)
        for t in pumps:
            t.join(timeout=2.0)
        server.close()
        cleanup_shm(job_id)
        _restore_signals(handlers)
    if code < 0:  # killed by a signal: shell convention
        code = 128 - code
    if records is not None:
        _records_after(records, made, code, job_id, cmd, ended, procs, stopped)
    return code


def _watch(procs: list[subprocess.Popen], timeout_s: float | None, lock: threading.Lock) -> tuple[int, str]:
    """Wait until every rank exits 0, one fails, or `timeout_s` passes: the job's code and how it ended."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            r, code = failed[0]
            with lock:
                sys.stderr.write(f"ringflow run: rank {r} exited with code {code}; stopping the others\n")
            return int(code), f"rank {r} {_rank_end(procs[r], {})}"
        if all(c == 0 for c in codes):
            return 0, "completed"
        if deadline is not None and time.monotonic() > deadline:
            with lock:
                sys.stderr.write(f"ringflow run: timeout after {timeout_s}s; killing all ranks\n")
            return TIMEOUT_EXIT, f"the launcher's timeout of {timeout_s} s"
        time.sleep(0.02)


def _records_after(d: Path, made: bool, code: int, job_id: str, cmd: list[str], ended: str,
                   procs: list[subprocess.Popen], stopped: dict[int, str]) -> None:
    """A completed job's directory the launcher made goes; otherwise job.json is written and the directory named."""
    if code == 0:
        if made:
            shutil.rmtree(d, ignore_errors=True)
        return
    _write_job(d, job_id, cmd, ended, code, procs, stopped)
    sys.stderr.write(f"ringflow run: this job's flight records are in {d} (ringflow diagnose {d})\n")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _catch_stop_signals() -> dict[int, object] | None:
    """SIGTERM and SIGHUP raise `Terminated` in the launcher (main thread only); the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return {int(sig): signal.signal(sig, raise_terminated) for sig in STOP_SIGNALS}


def _ignore_stop_signals(handlers: dict[int, object] | None) -> None:
    if handlers is not None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def _restore_signals(handlers: dict[int, object] | None) -> None:
    for sig, old in (handlers or {}).items():
        signal.signal(sig, old)  # type: ignore[arg-type]  # what signal.signal returned before


def _child_setup(cores: set[int] | None) -> Callable[[], None]:
    """What a rank's process does between fork and exec: die with the launcher, then pin to its cores."""
    parent = os.getpid()

    def setup() -> None:
        die_with_parent(parent)
        if cores is not None:
            os.sched_setaffinity(0, cores)
    return setup


def _stop(procs: list[subprocess.Popen]) -> dict[int, str]:
    """SIGTERM to the ranks still running, SIGKILL to those alive STOP_GRACE_S later; pid -> what was sent."""
    alive = [p for p in procs if p.poll() is None]
    stopped: dict[int, str] = {}
    for p in alive:
        try:
            p.send_signal(signal.SIGTERM)
            stopped[p.pid] = "SIGTERM from the launcher"
        except OSError:
            pass
    end = time.monotonic() + STOP_GRACE_S
    for p in alive:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            stopped[p.pid] = f"SIGKILL from the launcher, {STOP_GRACE_S:g} s after its SIGTERM"
    return stopped
