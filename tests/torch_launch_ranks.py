"""One rank of the launch tests (tests/test_torch_launch.py): init_process_group("ringflow") as a launcher starts it.

    python tests/torch_launch_ranks.py basic [INIT_METHOD]    # a few collectives; prints a JSON line
    python tests/torch_launch_ranks.py dead TIMEOUT_S         # DDP; the last rank dies at step 3

Rank and world size come from torchrun's RANK/WORLD_SIZE (init_method env://), or from `ringflow run`'s
environment through `ringflow.get_rank()` / `ringflow.get_world_size()` when INIT_METHOD is given.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import ringflow
import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"


def _init(init_method: str, timeout_s: float) -> None:
    kw: dict = {}
    if init_method != "env://":
        kw = {"rank": ringflow.get_rank(), "world_size": ringflow.get_world_size()}
    dist.init_process_group("ringflow", init_method=init_method, timeout=datetime.timedelta(seconds=timeout_s),
                            **kw)


def basic(init_method: str) -> None:
    """all_reduce, all_gather_into_tensor, broadcast, barrier; print what this rank saw."""
    _init(init_method, 60.0)
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    out = torch.empty(2 * n)
    dist.all_gather_into_tensor(out, torch.tensor([rank, rank * 10.0]))
    b = torch.arange(3.0) if rank == 0 else torch.zeros(3)
    dist.broadcast(b, 0)
    y = torch.ones(4)
    work = dist.all_reduce(y, async_op=True)   # queued on the backend's worker thread
    work.wait()
    dist.barrier()
    comm = dist.group.WORLD.comm
    print(json.dumps({"rank": rank, "world": n, "sum": x.tolist(), "gathered": out.tolist(), "bcast": b.tolist(),
                      "async_sum": y.tolist(), "shm_peers": sorted(comm._transport.shm_peers),
                      "backend": dist.get_backend()}), flush=True)
    dist.destroy_process_group()


def dead(timeout_s: float) -> None:
    """DDP on a small model; the last rank exits at step 3; the others report the error they got and when."""
    _init("env://", timeout_s)
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32),
                                                                        torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    t_dead = 0.0
    for step in range(50):
        if step == 3:
            if rank == n - 1:
                os._exit(1)
            t_dead = time.monotonic()
            time.sleep(0.05)   # let it die first: the next all-reduce is the one that must fail
        try:
            opt.zero_grad()
            net(torch.randn(8, 16)).sum().backward()
            opt.step()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            after = time.monotonic() - t_dead
            try:   # the next plain collective on the group
                dist.all_reduce(torch.ones(1))
                nxt: dict = {"next_type": None}
            except Exception as exc2:  # noqa: BLE001 - reported to the test
                nxt = {"next_type": type(exc2).__name__, "next_message": str(exc2)[:2000]}
            print(json.dumps({"rank": rank, "step": step, "type": type(exc).__name__, "message": str(exc)[:2000],
                              "after_s": after, **nxt}), flush=True)
            os._exit(0)
    print(json.dumps({"rank": rank, "type": None}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "basic":
        basic(sys.argv[2] if len(sys.argv) > 2 else "env://")
    else:
        dead(float(sys.argv[2]))
