"""torch.distributed on backend ringflow versus gloo and versus ringflow's own API, in one run.

    python benchmarks/torch_backend.py --ranks 2 4 --min 8 --max 64MiB [-o out.json] [--plot out.png]
    python benchmarks/torch_backend.py --ddp [--steps 30]        # DDP step time of examples/torch/train_lm.py
    python benchmarks/torch_backend.py --init [--rounds 5]       # init and destroy cost, gloo versus ringflow
    python benchmarks/torch_backend.py --per-call [--min 8 --max 4KiB --factor 512]   # small all_reduce per call
    python benchmarks/torch_backend.py --breakdown [--rounds 15]  # what the backend adds per call, part by part

Each rank process initialises gloo as the default group and a ringflow group over the same ranks
(`new_group(backend="ringflow")`), then times all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
broadcast and all_to_all_single on float32 tensors of each size three ways: torch on gloo, torch on
ringflow, and the same call on the ringflow group's own Communicator (`pg.comm.all_reduce(x)`, ...).
The three are interleaved round by round, rotating which goes first; each cell is the median over rounds of
the per-round median time per call (max over ranks). torch's calls are all_gather_single and
reduce_scatter_single where torch has them (all_gather_into_tensor and reduce_scatter_tensor warn).
"overhead" is torch-on-ringflow minus the own API: what the backend adds.

--per-call times one small all_reduce (float32, 2 ranks unless --ranks) eight ways, interleaved as above:
gloo; torch on ringflow with the same tensor every call ("repeated") and with a new tensor every call
("fresh", all made before the timed calls, as DDP and FSDP hand the backend new tensors); the own API on the
same tensor, on a fresh one, on the same NumPy array and on a fresh NumPy array each call (the backend hands
ringflow a NumPy view of the tensor, so these two are what its calls cost inside ringflow); and "torch floor",
torch on a backend whose all_reduce only makes a finished Work (what torch's own dist.all_reduce costs, in
every backend's time). Each cell is the median over rounds of the per-round 10th percentile of the time per
call (max over ranks): the calls that other processes on a shared machine did not delay (a median there
measures the machine's load).
"adds" is what the backend adds to a call: torch's time per call minus the time inside its call into
ringflow's Communicator (timed from the inside, so waiting for the other rank is not counted), same
statistic; it includes the torch floor.

--breakdown splits what the backend adds to a synchronous all_reduce, in one process (a 1-rank group, so no
peer and no wait): "torch floor" as above; the backend with its call into the Communicator replaced by a
no-op (torch floor plus the backend's own Python), repeated and fresh tensors; and the parts of that Python
alone: reading the options torch hands it (op, timeout, asyncOp: pybind getters), turning a tensor into the
array ringflow is handed (a NumPy view of its memory, made per call), and making the finished Work (new, or
re-used for a repeated call). Each cell is the median over rounds of the per-round 10th percentile.

--init starts fresh rank processes per round, gloo and ringflow alternating (file:// rendezvous), with
ringflow byte-compiled beforehand into a temporary PYTHONPYCACHEPREFIX, as an installed package is. Each
rank imports torch.distributed, waits for the others at a file barrier, then times from there: importing
the backend (ringflow only), `init_process_group`, the first all_reduce of 8 bytes, and
`destroy_process_group`, in wall-clock and CPU seconds; each cell is the median over rounds of the slowest
rank. To see what init imports, and what each import costs (cumulative microseconds, second column):

    python -X importtime -c "import torch.distributed, ringflow.torch_backend.process_group" 2>&1 \\
        | grep -E "ringflow|networkx|scipy|numpy" | sort -t'|' -k2 -n | tail -25
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_to_all_single"]
WAYS = ["gloo", "ringflow", "own"]


def _size(text: str) -> int:
    units = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "K": 2**10, "M": 2**20}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    return int(float(num) * units[t[len(num):]])


def _torch_fn(name: str, old: str) -> Callable[..., Any]:
    """torch.distributed's function `name`, or its older name where torch predates it (the old names warn)."""
    import torch.distributed as dist
    return getattr(dist, name, None) or getattr(dist, old)


def _call(op: str, n: int, nbytes: int, group: Any, own: bool) -> Callable[[], Any]:
    """A closure running one call of op with a message of nbytes (per rank): torch on `group`, or (own) the
    group's ringflow Communicator directly."""
    import torch
    import torch.distributed as dist
    k = max(n, nbytes // 4 // n * n)
    x = torch.ones(k)
    c = group.comm if own else None
    if op == "all_reduce":
        return (lambda: c.all_reduce(x)) if c else (lambda: dist.all_reduce(x, group=group))
    if op == "all_gather_into_tensor":
        out, inp = torch.empty(k), torch.ones(k // n)
        return (lambda: c.all_gather(inp, out=out)) if c else (
            lambda: _torch_fn("all_gather_single", "all_gather_into_tensor")(out, inp, group=group))
    if op == "reduce_scatter_tensor":
        out = torch.empty(k // n)
        return (lambda: c.reduce_scatter(x, out=out)) if c else (
            lambda: _torch_fn("reduce_scatter_single", "reduce_scatter_tensor")(out, x, group=group))
    if op == "broadcast":
        return (lambda: c.broadcast(x, 0)) if c else (lambda: dist.broadcast(x, 0, group=group))
    out = torch.empty(k)
    return (lambda: c.all_to_all(x, out=out)) if c else (lambda: dist.all_to_all_single(out, x, group=group))


def rank_main(rank: int, n: int, init: str, sizes: list[int], rounds: int, out_path: str) -> None:
    """One rank: time every op and size three ways, interleaved; rank 0 writes the results."""
    import warnings

    import torch
    import torch.distributed as dist

    import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=n)
    rf = dist.new_group(list(range(n)), backend="ringflow")
    groups = {"gloo": dist.group.WORLD, "ringflow": rf, "own": rf}
    rows = []
    for op in OPS:
        for nbytes in sizes:
            iters = max(3, min(200, int(1e8 // max(nbytes, 1) // 8)))
            fns = {w: _call(op, n, nbytes, g, w == "own") for w, g in groups.items()}
            per: dict[str, list[float]] = {w: [] for w in WAYS}
            for rnd in range(rounds):
                for w in WAYS[rnd % 3:] + WAYS[:rnd % 3]:   # each way goes first in a third of the rounds
                    fn = fns[w]
                    fn()
                    dist.barrier(group=groups[w] if w != "own" else rf)
                    ts = []
                    for _ in range(iters):
                        t0 = time.perf_counter()
                        fn()
                        ts.append(time.perf_counter() - t0)
                    med = torch.tensor(sorted(ts)[len(ts) // 2], dtype=torch.float64)
                    dist.all_reduce(med, dist.ReduceOp.MAX)
                    per[w].append(med.item() * 1e6)
            row: dict[str, Any] = {"op": op, "bytes": nbytes, "ranks": n, "iters": iters, "rounds": rounds}
            for w in WAYS:
                row[f"{w}_us"] = statistics.median(per[w])
            rows.append(row)
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(rows, fh)
    dist.destroy_process_group()


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'op':<24}{'ranks':>6}{'bytes':>10}{'gloo us':>11}{'ringflow us':>13}{'own API us':>12}"
             f"{'overhead us':>13}{'vs gloo':>9}"]
    for r in rows:
        lines.append(f"{r['op']:<24}{r['ranks']:>6}{r['bytes']:>10}{r['gloo_us']:>11.1f}{r['ringflow_us']:>13.1f}"
                     f"{r['own_us']:>12.1f}{r['ringflow_us'] - r['own_us']:>13.1f}"
                     f"{r['gloo_us'] / r['ringflow_us']:>8.2f}x")
    return "\n".join(lines)


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    from ringflow.plotting import pyplot
    plt = pyplot()
    ranks = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(len(ranks), len(OPS), figsize=(4 * len(OPS), 3.2 * len(ranks)), squeeze=False)
    for i, n in enumerate(ranks):
        for j, op in enumerate(OPS):
            ax = axes[i][j]
            sel = [r for r in rows if r["ranks"] == n and r["op"] == op]
            for w in WAYS:
                ax.loglog([r["bytes"] for r in sel], [r[f"{w}_us"] for r in sel], marker="o", label=w)
            ax.set_title(f"{op}, {n} ranks", fontsize=9)
            ax.set_xlabel("bytes per rank")
            ax.set_ylabel("us per call")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _ddp(ranks: list[int], steps: int) -> list[dict[str, Any]]:
    """Step time of examples/torch/train_lm.py under DDP, gloo versus ringflow, interleaved per world size."""
    script = os.path.join(ROOT, "examples", "torch", "train_lm.py")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in ranks:
            row: dict[str, Any] = {"ranks": n, "steps": steps}
            per: dict[str, list[float]] = {"gloo": [], "ringflow": []}
            for rnd in range(3):
                for backend in per:
                    js, init = os.path.join(tmp, f"{backend}{n}{rnd}.json"), os.path.join(tmp, f"i{backend}{n}{rnd}")
                    procs = [subprocess.Popen([sys.executable, script, "--backend", backend, "--mode", "ddp",
                                               "--steps", str(steps), "--init-method", f"file://{init}",
                                               "--json-out", js],
                                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": str(n),
                                                   "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"})
                             for r in range(n)]
                    codes = [p.wait() for p in procs]
                    if not os.path.exists(js):
                        sys.exit(f"the {n}-rank {backend} run failed (exit codes {codes})")
                    if any(codes):   # rank 0 wrote its results; a rank failed on the way out
                        print(f"note: {n}-rank {backend} run: exit codes {codes} after the results", file=sys.stderr)
                    with open(js) as fh:
                        per[backend].append(float(json.load(fh)["step_ms"]))
            for b, v in per.items():
                row[f"{b}_step_ms"] = statistics.median(v)
            rows.append(row)
    return rows


PER_CALL = ["gloo", "torch repeated", "torch fresh", "own repeated", "own fresh", "own numpy", "own numpy fresh",
            "torch floor"]
ADDS = ["torch repeated adds", "torch fresh adds"]   # time per call outside the backend's call into ringflow
QUANTILE = 0.1   # --per-call: the fastest tenth of calls, those the other processes of a shared machine left alone


def _noop_backend() -> str:
    """Register backend "noop": a process group whose all_reduce does nothing (torch's own cost per call)."""
    import torch.distributed as dist

    class Done(dist.Work):
        def wait(self, timeout: Any = None) -> bool:
            return True

    class Noop(dist.ProcessGroup):
        def __init__(self, store: Any, rank: int, size: int, timeout: Any) -> None:
            super().__init__(rank, size)

        def allreduce(self, tensors: Any, opts: Any = None) -> Any:
            return Done()

        def getBackendName(self) -> str:  # noqa: N802 - torch's name
            return "noop"
    if "NOOP" not in dist.Backend._plugins:
        dist.Backend.register_backend("noop", Noop, devices=["cpu"])
    return "noop"


def per_call_rank(rank: int, n: int, init: str, sizes: list[int], rounds: int, out_path: str) -> None:
    """One rank of --per-call: time a small all_reduce each PER_CALL way, interleaved; rank 0 writes the rows."""
    import warnings

    import numpy as np
    import torch
    import torch.distributed as dist

    import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=n)
    rf = dist.new_group(list(range(n)), backend="ringflow")
    comm = rf.comm
    floor = dist.new_group(list(range(n)), backend=_noop_backend())
    rows = []
    inner: list[float] = []
    real = comm.all_reduce

    def timed(*a: Any, **kw: Any) -> Any:   # the backend's call into ringflow, timed from the inside
        t0 = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            inner.append(time.perf_counter() - t0)
    for nbytes in sizes:
        k = max(1, nbytes // 4)
        same, arr = torch.ones(k), np.ones(k, np.float32)
        fns: dict[str, Callable[[Any], Any]] = {
            "gloo": lambda t: dist.all_reduce(t), "torch repeated": lambda t: dist.all_reduce(t, group=rf),
            "torch fresh": lambda t: dist.all_reduce(t, group=rf), "own repeated": comm.all_reduce,
            "own fresh": comm.all_reduce, "own numpy": comm.all_reduce, "own numpy fresh": comm.all_reduce,
            "torch floor": lambda t: dist.all_reduce(t, group=floor)}
        make: dict[str, Callable[[], Any]] = {   # each call's argument (bound now: k, same and arr change per size)
            w: (lambda k=k: torch.ones(k)) if w.endswith("fresh") else (lambda same=same: same) for w in PER_CALL}
        make["own numpy"] = lambda arr=arr: arr
        make["own numpy fresh"] = lambda k=k: np.ones(k, np.float32)
        per: dict[str, list[float]] = {w: [] for w in [*PER_CALL, *ADDS]}
        for rnd in range(rounds):
            for w in PER_CALL[rnd % len(PER_CALL):] + PER_CALL[:rnd % len(PER_CALL)]:
                fn, new = fns[w], make[w]
                for _ in range(20):
                    fn(new())
                dist.barrier()
                ts, adds = [], []
                if w.startswith("torch"):
                    comm.all_reduce = timed
                args = [new() for _ in range(300)]   # made before the timed calls: no peer waits for another's
                for a in args:
                    inner.clear()
                    t0 = time.perf_counter()
                    fn(a)
                    ts.append(time.perf_counter() - t0)
                    if inner:
                        adds.append(ts[-1] - inner[0])
                comm.__dict__.pop("all_reduce", None)
                med = torch.tensor([sorted(v)[int(len(v) * QUANTILE)] if v else 0.0 for v in (ts, adds)],
                                   dtype=torch.float64)
                dist.all_reduce(med, dist.ReduceOp.MAX)
                per[w].append(med[0].item() * 1e6)
                if adds:
                    per[f"{w} adds"].append(med[1].item() * 1e6)
        rows.append({"bytes": nbytes, "ranks": n, "rounds": rounds,
                     **{f"{w}_us": statistics.median(v) for w, v in per.items()}})
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(rows, fh)
    dist.destroy_process_group()


def breakdown(rounds: int) -> list[tuple[str, float]]:
    """--breakdown: (part, us per call) for a synchronous 8-byte all_reduce, in this process."""
    import warnings

    import torch
    import torch.distributed as dist

    import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"
    from ringflow.runtime.call.ops import tensor_view
    from ringflow.torch_backend.work import Succeeded, finished
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=0, world_size=1)
        rf, floor = dist.new_group([0], backend="ringflow"), dist.new_group([0], backend=_noop_backend())
        rf.comm.all_reduce = lambda *a, **kw: None   # the backend's own Python only
        opts = dist.AllreduceOptions()
        opts.reduceOp, opts.asyncOp = dist.ReduceOp.SUM, False
        same, ok, outs = torch.ones(2), Succeeded(), [torch.ones(2)]
        parts: dict[str, tuple[Callable[[Any], Any], bool]] = {
            "torch floor": (lambda t: dist.all_reduce(t, group=floor), False),
            "backend, no-op call into ringflow, repeated": (lambda t: dist.all_reduce(t, group=rf), False),
            "backend, no-op call into ringflow, fresh": (lambda t: dist.all_reduce(t, group=rf), True),
            "  read op + timeout + asyncOp": (lambda t: (hash(opts.reduceOp), opts.timeout.total_seconds(),
                                                         opts.asyncOp), False),
            "  tensor -> array (NumPy view), repeated": (tensor_view, False),
            "  tensor -> array (NumPy view), fresh": (tensor_view, True),
            "  finished Work, new": (lambda t: finished("allreduce", outs), False),
            "  finished Work, re-used (repeated call)": (lambda t: ok("allreduce", outs), False)}
        per: dict[str, list[float]] = {p: [] for p in parts}
        for _ in range(rounds):
            for p, (fn, fresh) in parts.items():
                ts = []
                for _ in range(1000):
                    x = torch.ones(2) if fresh else same
                    t0 = time.perf_counter_ns()
                    fn(x)
                    ts.append(time.perf_counter_ns() - t0)
                per[p].append(sorted(ts)[int(len(ts) * QUANTILE)] / 1e3)
        dist.destroy_process_group()
    return [(p, statistics.median(v)) for p, v in per.items()]


def _per_call_table(rows: list[dict[str, Any]]) -> str:
    head = "".join(f"{w + ' us':>19}" for w in PER_CALL)
    lines = [f"{'ranks':>5}{'bytes':>7}{head}{'adds repeated':>15}{'adds fresh':>12}"]
    for r in rows:
        cells = "".join(f"{r[w + '_us']:>19.1f}" for w in PER_CALL)
        lines.append(f"{r['ranks']:>5}{r['bytes']:>7}{cells}{r['torch repeated adds_us']:>15.1f}"
                     f"{r['torch fresh adds_us']:>12.1f}")
    return "\n".join(lines)


INIT_FIELDS = ["import_s", "init_s", "first_s", "total_s", "cpu_s", "destroy_s"]


def init_rank(backend: str, rank: int, n: int, init: str, sync: str, out_path: str) -> None:
    """One rank of an --init round: time importing the backend, init, the first all_reduce and destroy."""
    import torch
    import torch.distributed as dist
    open(os.path.join(sync, f"{backend}.{rank}"), "w").close()
    while sum(f.startswith(f"{backend}.") for f in os.listdir(sync)) < n:   # every rank has torch imported
        time.sleep(0.0005)
    t0, c0 = time.perf_counter(), time.process_time()
    if backend == "ringflow":
        import ringflow.torch_backend  # noqa: F401 - registers backend "ringflow"
    t1 = time.perf_counter()
    dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=n)
    t2 = time.perf_counter()
    x = torch.ones(2)
    dist.all_reduce(x)
    t3, c3 = time.perf_counter(), time.process_time()
    if x.tolist() != [float(n)] * 2:
        sys.exit(f"{backend}: the first all_reduce gave {x.tolist()}")
    dist.destroy_process_group()
    t4 = time.perf_counter()
    with open(out_path, "w") as fh:
        json.dump({"import_s": t1 - t0, "init_s": t2 - t1, "first_s": t3 - t2, "total_s": t3 - t0,
                   "cpu_s": c3 - c0, "destroy_s": t4 - t3}, fh)


def _init_cost(ranks: list[int], rounds: int) -> list[dict[str, Any]]:
    """--init: per world size and backend, the median over rounds of the slowest rank's times."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # byte-compiled first, as an installed package is (PYTHONDONTWRITEBYTECODE would recompile every start)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
               "PYTHONPYCACHEPREFIX": os.path.join(tmp, "pycache")}
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "ringflow")], env=env, check=True)
        for n in ranks:
            per: dict[str, list[dict[str, float]]] = {"gloo": [], "ringflow": []}
            for rnd in range(rounds):
                for backend in (["gloo", "ringflow"] if rnd % 2 == 0 else ["ringflow", "gloo"]):
                    d = os.path.join(tmp, f"{backend}.{n}.{rnd}")
                    os.mkdir(d)
                    outs = [os.path.join(d, f"out{r}.json") for r in range(n)]
                    procs = [subprocess.Popen([sys.executable, __file__, "--init-rank", backend, str(r), str(n),
                                               os.path.join(d, "init"), d, outs[r]], env=env) for r in range(n)]
                    if any(p.wait() != 0 for p in procs):
                        sys.exit(f"a rank of the {n}-rank {backend} init run failed")
                    got = []
                    for o in outs:
                        with open(o) as fh:
                            got.append(json.load(fh))
                    per[backend].append({f: max(g[f] for g in got) for f in INIT_FIELDS})
            for backend, runs in per.items():
                rows.append({"ranks": n, "backend": backend, "rounds": rounds,
                             **{f: statistics.median(r[f] for r in runs) for f in INIT_FIELDS}})
    return rows


def _init_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'ranks':>5} {'backend':<9}{'import s':>9}{'init s':>8}{'first AR s':>11}{'total s':>9}{'CPU s':>7}"
             f"{'destroy s':>10}"]
    for r in rows:
        lines.append(f"{r['ranks']:>5} {r['backend']:<9}{r['import_s']:>9.3f}{r['init_s']:>8.3f}{r['first_s']:>11.3f}"
                     f"{r['total_s']:>9.3f}{r['cpu_s']:>7.3f}{r['destroy_s']:>10.3f}")
    for n in sorted({r["ranks"] for r in rows}):
        g, f = (next(r for r in rows if r["ranks"] == n and r["backend"] == b) for b in ("gloo", "ringflow"))
        lines.append(f"{n} ranks: ringflow costs {f['total_s'] - g['total_s']:+.3f} s over gloo for import + init + "
                     f"first all_reduce, {f['destroy_s'] - g['destroy_s']:+.3f} s for destroy")
    return "\n".join(lines)


def _single_modes(args: argparse.Namespace) -> bool:
    """Run --init-rank, --breakdown, --init or --ddp if asked (True: done)."""
    if args.init_rank:
        b, r, n, init, sync, out = args.init_rank
        init_rank(b, int(r), int(n), init, sync, out)
        return True
    if args.breakdown:
        for part, us in breakdown(args.rounds):
            print(f"{part:<48}{us:>8.2f} us")
        return True
    if args.init:
        irows = _init_cost(args.ranks, args.rounds)
        print(_init_table(irows))
        if args.output:
            with open(args.output, "w") as fh:
                json.dump({"init": irows}, fh, indent=1)
        return True
    if args.ddp:
        drows = _ddp(args.ranks, args.steps)
        print(f"{'ranks':>6}{'gloo ms/step':>14}{'ringflow ms/step':>18}{'speed-up':>10}")
        for r in drows:
            print(f"{r['ranks']:>6}{r['gloo_step_ms']:>14.2f}{r['ringflow_step_ms']:>18.2f}"
                  f"{r['gloo_step_ms'] / r['ringflow_step_ms']:>9.2f}x")
        if args.output:
            with open(args.output, "w") as fh:
                json.dump({"ddp": drows}, fh, indent=1)
        return True
    return False


def main() -> None:
    """Launch the rank processes for each world size and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", help="world sizes (default 2 4; 2 for --init and --per-call)")
    ap.add_argument("--min", default="8")
    ap.add_argument("--max", help="largest size (default 64MiB; 4KiB for --per-call)")
    ap.add_argument("--factor", type=int, help="size step (default 8; 512 for --per-call)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per cell")
    ap.add_argument("--ddp", action="store_true", help="time DDP training steps instead (examples/torch/train_lm.py)")
    ap.add_argument("--steps", type=int, default=30, help="training steps per --ddp run")
    ap.add_argument("--init", action="store_true", help="time import + init + first all_reduce and destroy instead")
    ap.add_argument("--per-call", action="store_true", help="time a small all_reduce per call, repeated and fresh "
                    "tensors, torch against the own API")
    ap.add_argument("--breakdown", action="store_true", help="split what the backend adds per call into its parts "
                    "(one process)")
    ap.add_argument("-o", "--output", default="", help="write the rows as JSON")
    ap.add_argument("--plot", default="", help="write a plot (PNG) of time per call against size")
    ap.add_argument("--rank-args", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--per-call-rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--init-rank", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    small = args.init or args.per_call or args.per_call_rank
    args.ranks = args.ranks or ([2] if small else [2, 4])
    args.max = args.max or ("4KiB" if small else "64MiB")
    args.factor = args.factor or (512 if small else 8)
    if _single_modes(args):
        return
    sizes, s = [], _size(args.min)
    while s <= _size(args.max):
        sizes.append(s)
        s *= args.factor
    if sizes[-1] < _size(args.max):
        sizes.append(_size(args.max))
    if args.rank_args:
        r, n, init, out = args.rank_args
        (per_call_rank if args.per_call_rank else rank_main)(int(r), int(n), init, sizes, args.rounds, out)
        return
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            out = os.path.join(tmp, f"rows.{n}.json")
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            procs = [subprocess.Popen([sys.executable, __file__, "--min", args.min, "--max", args.max, "--factor",
                                       str(args.factor), "--rounds", str(args.rounds), "--rank-args", str(r),
                                       str(n), os.path.join(tmp, f"i{n}"), out]
                                      + (["--per-call-rank"] if args.per_call else []), env=env) for r in range(n)]
            if any(p.wait() != 0 for p in procs):
                sys.exit(f"a rank of the {n}-rank run failed")
            with open(out) as fh:
                rows.extend(json.load(fh))
    print(_per_call_table(rows) if args.per_call else _table(rows))
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"rows": rows}, fh, indent=1)
    if args.plot and not args.per_call:
        _plot(rows, args.plot)


if __name__ == "__main__":
    main()
