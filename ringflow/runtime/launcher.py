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
"""
from __future__ import annotations

import glob
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from ..errors import InvalidArgument, Terminated, raise_terminated
from . import auth
from .store import StoreServer

TIMEOUT_EXIT = 124
STOP_GRACE_S = 3.0   # SIGTERM, then this long before SIGKILL
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
    torch_port = free_port(server.address[0])
    cores = binding(nprocs, bind)
    lock = threading.Lock()
    handlers = _catch_stop_signals()
    procs: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    code = 0
    try:
        for r in range(nprocs):
            env = rank_env(r, nprocs, addr, secret, job_id, torch_port=torch_port)
            if extra_env:
                env.update(extra_env)
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=False, preexec_fn=_child_setup(None if cores is None else cores[r]))
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
        code = 128 + signal.SIGINT
    except Terminated as exc:
        with lock:
            sys.stderr.write(f"ringflow run: signal {exc.signum}; stopping all ranks\n")
        code = 128 + exc.signum
    finally:
        _ignore_stop_signals(handlers)   # a second SIGTERM must not cut the cleanup short (it is bounded anyway)
        _stop(procs)
        for t in pumps:
            t.join(timeout=2.0)
        server.close()
        cleanup_shm(job_id)
        _restore_signals(handlers)
    if code < 0:  # killed by a signal: shell convention
        code = 128 - code
    return code


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


def _stop(procs: list[subprocess.Popen]) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        try:
            p.send_signal(signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + STOP_GRACE_S
    for p in alive:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
