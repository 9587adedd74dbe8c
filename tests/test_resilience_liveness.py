"""Liveness and the job around the collectives, with real processes and real signals: a rank that holds the GIL is
alive, a peer that says goodbye is named within a second, the launcher's death or stop signals leave no rank and no
shared-memory name behind, and pre-created shared-memory names cannot stop a job."""
from __future__ import annotations

import glob
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT  # noqa: E402

GOODBYE_BOUND_S = 1.0   # the guarantee: a survivor waiting on a departed peer hears of it within this
SLACK_S = 1.0           # scheduling slack on a loaded 2-core machine
GONE_BOUND_S = 5.0      # after a stop signal to the launcher, no rank and no name remains after this


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def _run(tmp_path: Path, script: str, n: int, *args: str, timeout_s: float = 120,
         **env: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.py"
    path.write_text(script)
    return subprocess.run([sys.executable, "-m", "ringflow", "run", "-n", str(n), "--timeout", str(timeout_s),
                           str(path), str(tmp_path), *args], env=_env(**env), capture_output=True, text=True,
                          timeout=timeout_s + 30)


GIL_HOG = '''
import ctypes, json, sys, time
import numpy as np
import ringflow
out = sys.argv[1]
with ringflow.init() as comm:
    x = np.full(1024, comm.rank + 1.0)
    comm.barrier()
    t0 = time.monotonic()
    if comm.rank == 1:
        ctypes.PyDLL("libc.so.6").sleep(15)   # a C call made without releasing the GIL: no Python thread runs
    comm.all_reduce(x, timeout=60)
    ok = bool(np.all(x == 3.0))
    json.dump({"ok": ok, "waited_s": time.monotonic() - t0}, open(f"{out}/r{comm.rank}.json", "w"))
'''


@pytest.mark.long
def test_a_rank_that_holds_the_gil_for_15_s_is_alive(tmp_path: Path) -> None:
    p = _run(tmp_path, GIL_HOG, 2)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    res = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    assert all(r["ok"] for r in res), res
    assert res[0]["waited_s"] > 14, res   # rank 0 really waited through the hog, and nobody was declared dead


GOODBYE = '''
import json, sys, time
import numpy as np
import ringflow
from ringflow.errors import RemoteError
out, mode = sys.argv[1], sys.argv[2]
comm = ringflow.init()
comm.barrier()
if comm.rank == 1:
    if mode == "destroy":
        comm.destroy()
    else:
        with comm:
            pass
    time.sleep(5)                              # still running: only its goodbye can tell rank 0
    sys.exit(0)
time.sleep(0.3)
t0 = time.monotonic()
res = {}
try:
    comm.all_reduce(np.ones(1 << 16), timeout=60)
except RemoteError as exc:
    res = {"t": time.monotonic() - t0, "rank": exc.rank, "message": str(exc)}
t1 = time.monotonic()
new = comm.shrink(timeout=30)
res.update(shrink_s=time.monotonic() - t1, new_size=new.size)
new.destroy()
json.dump(res, open(f"{out}/r0.json", "w"))
'''


@pytest.mark.long
@pytest.mark.parametrize("mode", ["destroy", "with"])
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_peer_that_leaves_is_named_within_a_second_and_shrink_does_not_wait_for_it(tmp_path: Path, mode: str,
                                                                                     transport: str) -> None:
    env = {"RINGFLOW_SHM_DISABLE": "1"} if transport == "tcp" else {}
    p = _run(tmp_path, GOODBYE, 2, mode, **env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "r0.json").read_text())
    assert res.get("rank") == 1 and "rank 1 left the communicator" in res["message"], res
    assert res["t"] < GOODBYE_BOUND_S + SLACK_S, res
    assert res["new_size"] == 1 and res["shrink_s"] < 5, res


IDLE_JOB = '''
import json, os, sys, time
import numpy as np
import ringflow
out = sys.argv[1]
with ringflow.init() as comm:
    buf = comm.alloc(1 << 16, np.float32)     # a named shared-memory region, mapped by peers on demand
    buf[:] = comm.rank
    comm.all_reduce(buf)
    with open(f"{out}/.ready{comm.rank}", "w") as fh:   # renamed when whole: the test reads it once it exists
        json.dump({"pid": os.getpid(), "job": os.environ["RINGFLOW_JOB_ID"]}, fh)
    os.rename(f"{out}/.ready{comm.rank}", f"{out}/ready{comm.rank}")
    while True:
        comm.all_reduce(buf, timeout=600)
        time.sleep(0.01)
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGHUP, marks=pytest.mark.long),
                                 pytest.param(signal.SIGKILL, marks=pytest.mark.long)], ids=lambda s: s.name)
@pytest.mark.parametrize("n,transport", [(2, "shm"), pytest.param(4, "shm", marks=pytest.mark.long),
                                         pytest.param(2, "tcp", marks=pytest.mark.long),
                                         pytest.param(4, "tcp", marks=pytest.mark.long)])
def test_a_stopped_or_killed_launcher_leaves_no_rank_and_no_shared_memory(tmp_path: Path, sig: signal.Signals,
                                                                          n: int, transport: str) -> None:
    (tmp_path / "job.py").write_text(IDLE_JOB)
    env = _env(**({"RINGFLOW_SHM_DISABLE": "1"} if transport == "tcp" else {}))
    proc = subprocess.Popen([sys.executable, "-m", "ringflow", "run", "-n", str(n), "--timeout", "120",
                             str(tmp_path / "job.py"), str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + 60
        while not all((tmp_path / f"ready{r}").exists() for r in range(n)):
            assert proc.poll() is None and time.monotonic() < end, proc.communicate()[0][-3000:]
            time.sleep(0.02)
        ready = [json.loads((tmp_path / f"ready{r}").read_text()) for r in range(n)]
        job, pids = ready[0]["job"], [r["pid"] for r in ready]
        assert glob.glob(f"/dev/shm/ringflow-{job}-*"), "the job's regions should be named while it runs"
        proc.send_signal(sig)
        t0 = time.monotonic()
        while time.monotonic() - t0 < GONE_BOUND_S and (any(_alive(p) for p in pids)
                                                         or glob.glob(f"/dev/shm/ringflow-{job}-*")):
            time.sleep(0.05)
        assert not [p for p in pids if _alive(p)], f"ranks still running {GONE_BOUND_S} s after {sig.name}"
        assert glob.glob(f"/dev/shm/ringflow-{job}-*") == []
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), code


ARGS_ECHO = '''
import json, os, sys
json.dump({"argv": sys.argv[2:], "n": os.environ["RINGFLOW_WORLD_SIZE"]}, open(f"{sys.argv[1]}/args.json", "w"))
'''


def test_options_after_the_script_belong_to_the_script(tmp_path: Path) -> None:
    p = _run(tmp_path, ARGS_ECHO, 1, "-n", "5", "--timeout", "3")
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((tmp_path / "args.json").read_text()) == {"argv": ["-n", "5", "--timeout", "3"], "n": "1"}


SQUATTED = '''
import json, sys
import numpy as np
import ringflow
with ringflow.init() as comm:
    x = np.full(1 << 18, comm.rank + 1.0)
    comm.all_reduce(x)
    buf = comm.alloc(1 << 16, np.float64)
    buf[:] = 1.0
    comm.all_reduce(buf)
    json.dump({"ok": bool(np.all(x == 3.0) and np.all(buf == 2.0))}, open(f"{sys.argv[1]}/r{comm.rank}.json", "w"))
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="drops privileges to `nobody` for the squatter: needs root")
def test_names_pre_created_by_another_user_cannot_stop_the_job(tmp_path: Path) -> None:
    """A predictable job id (as torchrun's and Slurm's are) gives a squatter nothing: every name a communicator
    makes carries a nonce from the authenticated store. The squatter (uid `nobody`) pre-creates every name the
    job id alone would give; the job runs. A name that does collide is a typed error, never a raw one."""
    import hashlib
    job = "predictable-job-42"
    nobody = pwd.getpwnam("nobody").pw_uid
    ns = f"{job}.g0"
    uid = hashlib.sha256(f"{job}|{ns}".encode()).hexdigest()[:10]
    names = [f"/dev/shm/ringflow-{job}-{uid}-{a}-{b}-{k}" for a in range(2) for b in range(2) for k in ("c0", "p0")]
    names += [f"/dev/shm/ringflow-{job}-{uid}-{r}-a0" for r in range(2)]
    subprocess.run(["/bin/sh", "-c", 'for n in "$@"; do : > "$n"; done', "squat", *names], check=True,
                   preexec_fn=lambda: os.setuid(nobody))
    assert all(os.stat(n).st_uid == nobody for n in names)
    from ringflow.runtime.job import auth
    from ringflow.runtime.job.store import StoreServer
    secret = auth.new_secret()
    server = StoreServer("127.0.0.1", 0, secret)
    (tmp_path / "job.py").write_text(SQUATTED)
    try:
        procs = [subprocess.Popen([sys.executable, str(tmp_path / "job.py"), str(tmp_path)], env=_env(
            RINGFLOW_RANK=str(r), RINGFLOW_WORLD_SIZE="2", RINGFLOW_LOCAL_RANK=str(r), RINGFLOW_JOB_ID=job,
            RINGFLOW_STORE_ADDR=f"127.0.0.1:{server.address[1]}", RINGFLOW_SECRET=secret),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
        outs = [pr.communicate(timeout=120)[0] for pr in procs]
        assert [pr.returncode for pr in procs] == [0, 0], outs
        assert all(json.loads((tmp_path / f"r{r}.json").read_text())["ok"] for r in range(2))
        from ringflow.errors import RingflowSystemError
        from ringflow.runtime.transport.segments import create
        with pytest.raises(RingflowSystemError, match="already exists"):
            create(os.path.basename(names[0]), 4096)
    finally:
        server.close()
        for n in names:
            try:
                os.unlink(n)
            except OSError:
                pass


BATCH_JOB = '''
import json, sys
import numpy as np
import ringflow
with ringflow.init() as comm:
    x = np.full(1000, comm.rank + 1.0)
    comm.all_reduce(x)
    json.dump({"ok": bool(np.all(x == 3.0)), "rank": comm.rank}, open(f"{sys.argv[1]}/r{comm.rank}.json", "w"))
'''


@pytest.mark.parametrize("launcher", ["slurm", pytest.param("openmpi", marks=pytest.mark.long),
                                      pytest.param("mpich", marks=pytest.mark.long)])
def test_ranks_started_by_a_batch_launcher_need_no_ringflow_variable(tmp_path: Path, launcher: str) -> None:
    """The variables srun, Open MPI's mpirun and MPICH's / Intel MPI's mpiexec set, and nothing else: the ranks find
    each other (loopback store on a port derived from the job id, served by rank 0)."""
    job = f"{os.getpid()}{time.monotonic_ns() % 10**6}"
    def env_of(r: int) -> dict[str, str]:
        return {"slurm": {"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r), "SLURM_JOB_ID": job,
                          "SLURM_STEP_ID": "0", "SLURM_NNODES": "1"},
                "openmpi": {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK":
                            str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": f"prterun-{job}@1"},
                "mpich": {"PMI_RANK": str(r), "PMI_SIZE": "2", "MPI_LOCALRANKID": str(r), "MPI_LOCALNRANKS": "2",
                          "PMI_KVSNAME": f"kvs_{job}_0"}}[launcher]
    base = {k: v for k, v in _env().items() if not k.startswith(("RINGFLOW_", "SLURM_", "OMPI_", "PMI", "MPI_"))}
    (tmp_path / "job.py").write_text(BATCH_JOB)
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "job.py"), str(tmp_path)], env={**base, **env_of(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all(json.loads((tmp_path / f"r{r}.json").read_text())["ok"] for r in range(2))


LATE = '''
import json, os, signal, sys, time
import numpy as np
import ringflow
from ringflow.errors import Timeout
out = sys.argv[1]
comm = ringflow.init()
x = np.ones(1 << 12)
comm.all_reduce(x)
if comm.rank == 2:
    json.dump({}, open(f"{out}/r2.json", "w"))
    os.kill(os.getpid(), signal.SIGSTOP)     # alive, never arrives (the launcher's timeout ends it)
if comm.rank == 1:
    time.sleep(60)                           # alive, answers, never arrives
try:
    comm.all_reduce(x, timeout=2)
    res = {"error": None}
except Timeout as exc:
    res = {"error": str(exc)}
json.dump(res, open(f"{out}/r{comm.rank}.json", "w"))
os._exit(0)
'''


def test_a_timeout_names_the_ranks_that_did_not_arrive_and_what_they_last_did(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(LATE)
    launcher = subprocess.Popen([sys.executable, "-m", "ringflow", "run", "-n", "3", "--timeout", "120",
                                 str(tmp_path / "job.py"), str(tmp_path)], env=_env(),
                                stdout=subprocess.DEVNULL, stderr=open(tmp_path / "launcher.err", "w"))
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "r0.json").exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)    # rank 0 writes its file in one call; let the write finish
    finally:
        launcher.terminate()   # ends the sleeping and the stopped rank
        launcher.wait(timeout=30)
    assert (tmp_path / "r0.json").exists(), (tmp_path / "launcher.err").read_text()
    err = json.loads((tmp_path / "r0.json").read_text())["error"]
    assert err is not None and "(call #1) timed out" in err and "{" not in err, err
    assert "rank 1 has not entered it (done with call #0, all_reduce of 4096 x float64 (op sum))" in err, err
    assert "rank 2 did not answer" in err, err
