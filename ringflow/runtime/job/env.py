"""Find rank, world size, store address and job secret from the launcher's environment.

Recognised launchers, in order: ringflow's own (`ringflow run`: RINGFLOW_RANK, RINGFLOW_WORLD_SIZE,
RINGFLOW_STORE_ADDR, RINGFLOW_SECRET), torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT: the store listens on MASTER_PORT + 1 because torchrun's own store holds MASTER_PORT),
Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID), Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
OMPI_COMM_WORLD_LOCAL_RANK), MPICH and Intel MPI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID).

Under Slurm and MPI nothing has to be set by hand on one node: the store is 127.0.0.1 on a port derived
from the job's id (`derived_port`), served by rank 0. Across nodes, Slurm's store host is the first host of
the step's node list (SLURM_STEP_NODELIST), resolved by name; under MPI across nodes set RINGFLOW_STORE_ADDR
(rank 0's host:port), the one variable it needs. RINGFLOW_STORE_ADDR always wins.
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ... import config
from ...errors import InvalidArgument
from .store import parse_addr

log = logging.getLogger("ringflow.runtime")


@dataclass(frozen=True)
class LaunchInfo:
    """What a rank needs to join its job."""

    rank: int
    world_size: int
    store_host: str
    store_port: int
    secret: str
    job_id: str
    local_rank: int | None
    source: str  # which launcher the values came from


def _int(env: Mapping[str, str], name: str) -> int | None:
    v = env.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise InvalidArgument(f"{name}={v!r} is not an integer", f"fix the launcher's {name}") from None


LAUNCHERS = (
    ("ringflow run", "RINGFLOW_RANK", "RINGFLOW_WORLD_SIZE", "RINGFLOW_LOCAL_RANK"),
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("MPICH", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
)


def from_launcher(env: Mapping[str, str]) -> tuple[str, int | None, int | None, int | None]:
    """(launcher, rank, world size, local rank) from the first launcher whose variables are set."""
    for name, rk, wk, lk in LAUNCHERS:
        if env.get(rk) is not None and env.get(wk) is not None:
            return name, _int(env, rk), _int(env, wk), _int(env, lk)
    return "arguments", None, None, None


def _derived_secret(job_id: str, store_addr: str, world_size: int, loopback: bool) -> str:
    """No secret from the launcher: one derived from what every rank shares. Weak (anyone who can read the
    environment can derive it), so say so where the store is reachable from other hosts."""
    basis = f"{job_id}|{store_addr}|{world_size}"
    if world_size > 1 and not loopback:
        log.warning("ringflow: RINGFLOW_SECRET is not set; using a secret derived from the job id and "
                    "store address. Set RINGFLOW_SECRET for real protection.")
    return hashlib.sha256(b"ringflow-derived|" + basis.encode()).hexdigest()


def detect(rank: int | None = None, world_size: int | None = None, store_addr: str | None = None,
           secret: str | None = None, env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Merge explicit arguments with the launcher environment; typed error naming what is missing."""
    env = os.environ if env is None else env
    source, env_rank, env_size, local_rank = from_launcher(env)
    if rank is None and env_rank is not None:
        rank = env_rank
    else:
        source = "arguments"
    if world_size is None:
        world_size = env_size
    if rank is None or world_size is None:
        raise InvalidArgument("rank and world size are unknown",
                              "launch with `ringflow run -n N script.py`, torchrun, srun or mpirun, "
                              "or pass ringflow.init(rank=, world_size=, store_addr=)")
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidArgument(f"rank {rank} is outside world size {world_size}", "0 <= rank < world_size")
    if store_addr is None:
        store_addr = config.get("STORE_ADDR") or None
    if store_addr is None and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        store_addr = f"{env['MASTER_ADDR']}:{int(env['MASTER_PORT']) + 1}"
    job_id = (env.get("RINGFLOW_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or _slurm_step(env)
              or env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE") or env.get("PMI_KVSNAME") or "")
    if store_addr is None and source in ("Slurm", "Open MPI", "MPICH") and job_id:
        store_addr = _batch_store_addr(env, source, job_id)
    if store_addr is None:
        if world_size == 1:
            store_addr = "127.0.0.1:0"
        else:
            raise InvalidArgument("no store address", "set RINGFLOW_STORE_ADDR=host:port (rank 0 serves it) "
                                  "or MASTER_ADDR/MASTER_PORT, or use `ringflow run`")
    host, port = parse_addr(store_addr)
    if secret is None:
        secret = config.get("SECRET") or None
    if secret is None:
        secret = _derived_secret(job_id, store_addr, world_size, loopback=host.startswith("127."))
    if not job_id:
        job_id = hashlib.sha256(f"{secret}|{store_addr}".encode()).hexdigest()[:12]
    return LaunchInfo(rank, world_size, host, port, secret, _safe(job_id), local_rank, source)


def _safe(job_id: str) -> str:
    """A job id usable in file and socket names."""
    ok = "".join(c if c.isalnum() else "_" for c in job_id)[:24]
    return ok or "job"


STORE_PORT_BASE, STORE_PORT_SPAN = 20000, 20000


def derived_port(job_id: str) -> int:
    """A port every rank of a job computes alike from its id, in STORE_PORT_BASE .. + STORE_PORT_SPAN."""
    return STORE_PORT_BASE + int(hashlib.sha256(job_id.encode()).hexdigest()[:8], 16) % STORE_PORT_SPAN


def _slurm_step(env: Mapping[str, str]) -> str:
    """Slurm's job and step id ("1234.0"), or ""."""
    job = env.get("SLURM_JOB_ID") or ""
    return f"{job}.{env.get('SLURM_STEP_ID', '0')}" if job else ""


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list ("node[07-09,12],gpu3" -> "node07")."""
    head = nodelist.split(",", 1)[0] if "[" not in nodelist.split(",", 1)[0] else nodelist.split("]", 1)[0] + "]"
    if "[" not in head:
        return head.strip()
    prefix, rng = head.split("[", 1)
    first = rng.rstrip("]").split(",", 1)[0].split("-", 1)[0]
    return prefix + first


def _batch_store_addr(env: Mapping[str, str], source: str, job_id: str) -> str | None:
    """The store a batch launcher's job uses without any ringflow variable: loopback on one node, Slurm's first
    node across nodes; None where only RINGFLOW_STORE_ADDR can say (MPI across nodes)."""
    port = derived_port(job_id)
    if source == "Slurm":
        nodes = _int(env, "SLURM_STEP_NUM_NODES") or _int(env, "SLURM_NNODES") or 1
        if nodes == 1:
            return f"127.0.0.1:{port}"
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
        if not nodelist:
            return None
        import socket
        host = first_host(nodelist)
        try:
            return f"{socket.gethostbyname(host)}:{port}"
        except OSError:
            raise InvalidArgument(f"cannot resolve the first node of the Slurm step, {host!r}",
                                  "set RINGFLOW_STORE_ADDR=<rank 0's address>:<port>") from None
    local = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE" if source == "Open MPI" else "MPI_LOCALNRANKS")
    size = _int(env, "OMPI_COMM_WORLD_SIZE" if source == "Open MPI" else "PMI_SIZE")
    if local is not None and local == size:
        return f"127.0.0.1:{port}"
    return None
