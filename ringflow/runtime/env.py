"""Find rank, world size, store address and job secret from the launcher's environment.

Recognised launchers, in order: ringflow's own (`ringflow run`: RINGFLOW_RANK, RINGFLOW_WORLD_SIZE,
RINGFLOW_STORE_ADDR, RINGFLOW_SECRET), torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT: the store listens on MASTER_PORT + 1 because torchrun's own store holds MASTER_PORT),
Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the store address must come from
RINGFLOW_STORE_ADDR or MASTER_ADDR/MASTER_PORT), Open MPI (OMPI_COMM_WORLD_RANK,
OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK).
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from .. import config
from ..errors import InvalidArgument
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


def detect(rank: int | None = None, world_size: int | None = None, store_addr: str | None = None,
           secret: str | None = None, env: Mapping[str, str] | None = None) -> LaunchInfo:
    """Merge explicit arguments with the launcher environment; typed error naming what is missing."""
    env = os.environ if env is None else env
    source = "arguments"
    local_rank = None
    candidates = [
        ("ringflow run", "RINGFLOW_RANK", "RINGFLOW_WORLD_SIZE", "RINGFLOW_LOCAL_RANK"),
        ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ]
    for name, rk, wk, lk in candidates:
        if env.get(rk) is not None and env.get(wk) is not None:
            if rank is None:
                rank = _int(env, rk)
                source = name
            if world_size is None:
                world_size = _int(env, wk)
            local_rank = _int(env, lk)
            break
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
    if store_addr is None:
        if world_size == 1:
            store_addr = "127.0.0.1:0"
        else:
            raise InvalidArgument("no store address", "set RINGFLOW_STORE_ADDR=host:port (rank 0 serves it) "
                                  "or MASTER_ADDR/MASTER_PORT, or use `ringflow run`")
    host, port = parse_addr(store_addr)
    job_id = env.get("RINGFLOW_JOB_ID") or env.get("TORCHELASTIC_RUN_ID") or env.get("SLURM_JOB_ID") or ""
    if secret is None:
        secret = config.get("SECRET") or None
    if secret is None:
        # No secret from the launcher: derive one from what every rank shares. Weak (anyone who can read
        # the environment can derive it), so say so.
        basis = f"{job_id}|{store_addr}|{world_size}"
        secret = hashlib.sha256(b"ringflow-derived|" + basis.encode()).hexdigest()
        if world_size > 1:
            log.warning("ringflow: RINGFLOW_SECRET is not set; using a secret derived from the job id and "
                        "store address. Set RINGFLOW_SECRET for real protection.")
    if not job_id:
        job_id = hashlib.sha256(f"{secret}|{store_addr}".encode()).hexdigest()[:12]
    return LaunchInfo(rank, world_size, host, port, secret, _safe(job_id), local_rank, source)


def _safe(job_id: str) -> str:
    """A job id usable in file and socket names."""
    ok = "".join(c if c.isalnum() else "_" for c in job_id)[:24]
    return ok or "job"
