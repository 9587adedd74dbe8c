"""Runtime pieces: frame validation, launcher env detection, interface selection, launcher, bench."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from ringflow.errors import InvalidArgument, ProtocolError
from ringflow.runtime.bench import bus_factor, settle
from ringflow.runtime.call.ops import Buf, parse_op
from ringflow.runtime.job import env as rt_env
from ringflow.runtime.transport import frames
from ringflow.runtime.transport.tcp import select_interface

ROOT = Path(__file__).resolve().parents[1]


def test_frame_roundtrip_and_every_corruption_is_named() -> None:
    h = frames.pack(frames.Kind.DATA, 7, 1024, channel=2, op_seq=9, sig=123, tag=4)
    assert len(h) == frames.HEADER_BYTES
    f = frames.parse(h, peer="rank 1", expect_seq=7, max_nbytes=1024)
    assert (f.kind, f.seq, f.nbytes, f.channel, f.op_seq, f.sig, f.tag) == (frames.Kind.DATA, 7, 1024, 2, 9, 123, 4)
    with pytest.raises(ProtocolError, match="magic"):
        frames.parse(b"XXXX" + h[4:], peer="rank 1")
    with pytest.raises(ProtocolError, match="checksum"):
        frames.parse(h[:20] + bytes([h[20] ^ 1]) + h[21:], peer="rank 1")
    with pytest.raises(ProtocolError, match="out-of-sequence"):
        frames.parse(h, peer="rank 1", expect_seq=8)
    with pytest.raises(ProtocolError, match="oversized"):
        frames.parse(h, peer="rank 1", max_nbytes=1000)
    with pytest.raises(ProtocolError, match="truncated"):
        frames.parse(h[:30], peer="rank 1")


def test_env_detection_for_each_launcher() -> None:
    torch_env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500",
                 "RINGFLOW_SECRET": "x"}
    info = rt_env.detect(env=torch_env, secret="x")
    assert (info.rank, info.world_size, info.local_rank, info.store_host, info.store_port, info.source) == \
        (3, 8, 1, "10.1.2.3", 29501, "torchrun")
    slurm = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "77"}
    info = rt_env.detect(store_addr="10.0.0.9:1234", secret="s", env=slurm)
    assert (info.rank, info.world_size, info.source, info.job_id) == (2, 4, "Slurm", "77_0")
    ompi = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    assert rt_env.detect(store_addr="1.2.3.4:5", secret="s", env=ompi).source == "Open MPI"


def test_batch_launchers_need_no_ringflow_variable_on_one_node_and_one_across_nodes() -> None:
    """Slurm, Open MPI and MPICH/Intel MPI: on one node the store is loopback on a port every rank derives from
    the job id; Slurm across nodes uses the step's first node; MPI across nodes asks for RINGFLOW_STORE_ADDR."""
    one = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3",
           "SLURM_NNODES": "1"}
    a, b = rt_env.detect(env=one), rt_env.detect(env={**one, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    assert (a.store_host, a.source, a.local_rank) == ("127.0.0.1", "Slurm", 1)
    assert a.store_port == b.store_port == rt_env.derived_port("77.3") and a.secret == b.secret
    many = {**one, "SLURM_NNODES": "2", "SLURM_STEP_NODELIST": "127.0.0.[5-6]"}
    assert rt_env.detect(env=many).store_host == "127.0.0.5"
    assert rt_env.first_host("node[07-09,12],gpu3") == "node07" and rt_env.first_host("gpu3,node[1-2]") == "gpu3"
    mpich = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_KVSNAME": "kvs_9_0"}
    info = rt_env.detect(env=mpich)
    assert (info.source, info.rank, info.local_rank, info.store_host) == ("MPICH", 1, 1, "127.0.0.1")
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0", "PMIX_NAMESPACE": "prterun-h-12@1"}
    with pytest.raises(InvalidArgument, match="no store address"):
        rt_env.detect(env=ompi)
    assert rt_env.detect(env={**ompi, "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}).store_host == "127.0.0.1"
    with pytest.raises(InvalidArgument, match="rank and world size"):
        rt_env.detect(env={})
    with pytest.raises(InvalidArgument, match="outside"):
        rt_env.detect(rank=4, world_size=4, store_addr="1.2.3.4:5", env={})


def test_interface_selection_follows_nccl_syntax() -> None:
    avail = [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("eth0", "10.0.0.2"), ("ib0", "10.1.0.2")]
    assert select_interface("", avail) == ("eth0", "10.0.0.2")
    assert select_interface("ib", avail) == ("ib0", "10.1.0.2")
    assert select_interface("^eth,docker", avail) == ("ib0", "10.1.0.2")
    assert select_interface("=lo", avail) == ("lo", "127.0.0.1")
    assert select_interface("", [("lo", "127.0.0.1")]) == ("lo", "127.0.0.1")
    with pytest.raises(InvalidArgument, match="matches no interface"):
        select_interface("=eth", avail)


def test_buffers_and_ops_validation() -> None:
    with pytest.raises(InvalidArgument, match="contiguous"):
        Buf(np.zeros((4, 4))[:, 0])
    with pytest.raises(InvalidArgument, match="not supported"):
        Buf(np.zeros(3, dtype=np.complex64))
    with pytest.raises(InvalidArgument, match="numpy array"):
        Buf([1, 2, 3])
    assert parse_op("SUM") == "sum" and parse_op("mean") == "avg"
    with pytest.raises(InvalidArgument, match="unknown reduction"):
        parse_op("xor")


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 4) == 1.0 and bus_factor("reduce", 8) == 1.0
    assert bus_factor("all_to_all", 2) == pytest.approx(0.5)


def _ringflow(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "ringflow", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_launcher_prefixes_output_and_fails_fast(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, pathlib, sys, time
        r = int(os.environ["RINGFLOW_RANK"])
        print("hello from", r, os.environ["RINGFLOW_WORLD_SIZE"], flush=True)
        flags = pathlib.Path(sys.argv[1])
        (flags / f"printed{r}").touch()
        if r == 1:
            # fail only once the others have printed, so the test sees every prefix however loaded the machine is
            deadline = time.monotonic() + 20
            while not all((flags / f"printed{k}").exists() for k in (0, 2)) and time.monotonic() < deadline:
                time.sleep(0.01)
            sys.exit(3)
        time.sleep(60)
    """))
    t0 = time.monotonic()
    p = _ringflow("run", "-n", "3", str(script), str(tmp_path))
    assert p.returncode == 3
    assert time.monotonic() - t0 < 30
    assert "[1] hello from 1 3" in p.stdout and "[0] hello from 0 3" in p.stdout
    assert "rank 1 exited with code 3" in p.stderr


def test_launcher_timeout_kills_everything(tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text("import time; time.sleep(60)\n")
    p = _ringflow("run", "-n", "2", "--timeout", "1", str(script))
    assert p.returncode == 124


def test_settle_runs_collectives_until_the_slowest_rank_has_spent_its_time() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.1
        return now[0]
    seen: list[float] = []

    def slowest(mine: float) -> float:   # the slowest rank took twice this rank's time
        seen.append(mine)
        return 2 * mine
    assert settle(slowest, seconds=1.0, clock=clock) == 5
    assert 2 * seen[-1] >= 1.0 > 2 * seen[-2]   # the last call's agreed time decided, on every rank alike


def test_bench_cli_writes_the_json_contract(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    p = _ringflow("bench", "all_reduce", "-n", "2", "--min", "8", "--max", "4KiB", "--factor", "16", "--iters", "3",
                  "--check", "-o", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["size_bytes"] for r in rows] == [8, 128, 2048]
    for r in rows:
        for key in ("collective", "nranks", "size_bytes", "count", "dtype", "time_us", "algbw_GBps", "busbw_GBps",
                    "wrong"):
            assert key in r
        assert r["wrong"] == 0 and r["time_us"] > 0 and r["nranks"] == 2
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 1.0)
    assert "busbw" in p.stdout


@pytest.mark.long
def test_bench_passes_split_every_row_s_samples_over_sweeps_and_check_once(tmp_path: Path) -> None:
    """`--passes 3 --iters 7`: every row is timed in 3 sweeps of ceil(7 / 3) samples each, its time the
    median of all 9, and its results still checked."""
    out = tmp_path / "rows.json"
    p = _ringflow("bench", "all_reduce,gather", "-n", "2", "--min", "1KiB", "--max", "64KiB", "--factor", "64",
                  "--iters", "7", "--passes", "3", "--check", "-o", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [(r["collective"], r["size_bytes"]) for r in rows] == \
        [("all_reduce", 1024), ("all_reduce", 65536), ("gather", 1024), ("gather", 65536)]
    assert all(r["iters"] == 9 and r["wrong"] == 0 and r["time_us"] > 0 for r in rows)
    bad = _ringflow("bench", "all_reduce", "-n", "2", "--max", "1KiB", "--passes", "0")
    assert bad.returncode != 0 and "--passes" in bad.stderr and "Traceback" not in bad.stderr
    from ringflow.runtime.bench import launch
    with pytest.raises(InvalidArgument, match="passes must be at least 1"):
        launch("all_reduce", 2, 8, 1024, passes=0)


def test_a_bench_whose_sizes_hold_no_element_per_rank_is_refused_before_any_rank_starts() -> None:
    from ringflow.runtime.bench import launch
    with pytest.raises(InvalidArgument, match="holds an element of float32 per rank.*--max of at least 12B"):
        launch("all_gather", 3, 8, 8)


def test_call_samples_take_their_share_of_the_default_count() -> None:
    """A row timed in `share` passes takes ceil(1/share) of the samples it would take in one (at least 3)."""
    from ringflow.runtime.bench import batch_size, call_samples_s, default_iters
    tick = 2.0 ** -10   # every clock read about 1 ms after the last, exactly (a binary fraction: no rounding)
    clock = iter(np.arange(0.0, 1e4, tick)).__next__
    one = call_samples_s(lambda: None, lambda: None, lambda s: s, clock=clock)
    full = default_iters(tick, batch_size(tick))
    assert len(one) == full
    assert len(call_samples_s(lambda: None, lambda: None, lambda s: s, share=4, clock=clock)) == -(-full // 4)
    assert len(call_samples_s(lambda: None, lambda: None, lambda s: s, share=1000, clock=clock)) == 3


def test_rows_settle_over_nccl_tests_five_warm_up_calls() -> None:
    """By default 5 untimed calls precede a row's samples (nccl-tests' -w 5); a caller may ask for fewer."""
    from ringflow.runtime.bench import WARMUP_CALLS, call_samples_s
    calls = []
    clock = iter(np.arange(0.0, 1e4, 1.0)).__next__   # 1 s per read: one call per sample
    got = call_samples_s(lambda: calls.append(1), lambda: None, lambda s: s, iters=3, clock=clock)
    assert WARMUP_CALLS == 5 and len(got) == 3 and len(calls) == WARMUP_CALLS + 3
    calls.clear()
    call_samples_s(lambda: calls.append(1), lambda: None, lambda s: s, iters=3, warmup=2, clock=clock)
    assert len(calls) == 2 + 3



def test_large_tcp_transfers_are_striped_element_aligned() -> None:
    from ringflow.runtime.call.executor import STRIPE_MIN_BYTES, stripes
    assert stripes(1000, 4, 2) == [(0, 1000)]
    parts = stripes(STRIPE_MIN_BYTES + 12, 4, 3)
    assert len(parts) == 3 and sum(p[1] for p in parts) == STRIPE_MIN_BYTES + 12
    assert all(o % 4 == 0 and n % 4 == 0 for o, n in parts)
    assert [o for o, _ in parts] == [0, parts[0][1], parts[0][1] + parts[1][1]]


def test_runtime_reranks_tuner_choice_with_local_copy_cost() -> None:
    from ringflow.algorithms import registry, tuner
    from ringflow.algorithms.layout import CallShape
    from ringflow.algorithms.schedule import Collective
    from ringflow.algorithms.selection import flat_choice, local_copy_bytes
    one_shot = registry.get_schedule("all_reduce", "one_shot", 2)
    ring = registry.get_schedule("all_reduce", "ring", 2)
    shape = CallShape(Collective.ALL_REDUCE, 2, 1 << 20, 4)
    assert local_copy_bytes(one_shot, shape) > 0 and local_copy_bytes(ring, shape) == 0
    big = 64 << 20
    chosen = flat_choice(tuner.choose("all_reduce", big, 2), Collective.ALL_REDUCE, 2, None, big, 4)
    assert local_copy_bytes(chosen, CallShape(Collective.ALL_REDUCE, 2, big // 4, 4)) == 0


def test_launcher_sets_one_blas_thread_per_rank_unless_chosen() -> None:
    from ringflow.runtime.job.launcher import rank_env
    env = rank_env(0, 4, "127.0.0.1:1", "s", "j", base={"MKL_NUM_THREADS": "3"})
    assert env["OMP_NUM_THREADS"] == "1" and env["OPENBLAS_NUM_THREADS"] == "1"
    assert env["MKL_NUM_THREADS"] == "3"  # the user's choice stands
    assert "OMP_NUM_THREADS" not in rank_env(0, 1, "127.0.0.1:1", "s", "j", base={})


_LAUNCHED = """
import json, sys
import numpy as np
import ringflow
with ringflow.init(timeout=30) as comm:
    x = np.full(3, comm.rank + 1, np.float32)
    comm.all_reduce(x)
    print(json.dumps({"rank": comm.rank, "size": comm.size, "sum": float(x[0])}))
"""


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("launcher", ["torchrun", "Slurm", "Open MPI"])
def test_ranks_started_by_each_launchers_environment_form_one_job(launcher: str) -> None:
    """Real processes given only the variables torchrun, Slurm or Open MPI set find each other."""
    n, port = 3, _free_port()
    procs = []
    for r in range(n):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGFLOW_", "SLURM_", "OMPI_"))
               and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env["RINGFLOW_SECRET"] = "launcher-test"
        if launcher == "torchrun":
            env.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port - 1), TORCHELASTIC_RUN_ID=f"t{port}")
        elif launcher == "Slurm":
            env.update(SLURM_PROCID=str(r), SLURM_NTASKS=str(n), SLURM_LOCALID=str(r), SLURM_JOB_ID=f"s{port}",
                       RINGFLOW_STORE_ADDR=f"127.0.0.1:{port}")
        else:
            env.update(OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(n), OMPI_COMM_WORLD_LOCAL_RANK=str(r),
                       RINGFLOW_STORE_ADDR=f"127.0.0.1:{port}", RINGFLOW_JOB_ID=f"o{port}")
        procs.append(subprocess.Popen([sys.executable, "-c", _LAUNCHED], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(o["rank"] for o in outs) == list(range(n))
    assert all(o["size"] == n and o["sum"] == n * (n + 1) / 2 for o in outs)


def test_plan_marks_sends_a_receiver_copies_from_a_source_not_yet_written() -> None:
    """`Xfer.cold_copy` (single copy from 256 KiB) only where the peer copies and the rank has not
    written the source earlier in the call; reductions and freshly written data keep the 1 MiB rule."""
    from ringflow.algorithms import registry
    from ringflow.algorithms.layout import CallShape
    from ringflow.algorithms.plan import compile_plan
    from ringflow.algorithms.schedule import Collective, OpKind

    def sends(coll: str, algo: str, inplace: bool) -> list:
        sched = registry.get_schedule(coll, algo, 2)
        shape = CallShape(Collective.parse(coll), 2, 1 << 16, 4)
        return [[x.cold_copy for x in st.xfers if x.kind == OpKind.SEND]
                for st in compile_plan(sched, shape, 0, inplace).steps]

    assert sends("all_gather", "ring", False) == [[True]]           # the rank's own input, copied
    assert sends("reduce_scatter", "ring", False) == [[False]]      # the peer reduces it
    # ring all-reduce: reduce-scatter step (peer reduces), then the all-gather step sends the chunk
    # this rank has just reduced (dirty in its cache)
    assert sends("all_reduce", "ring", True) == [[False], [False]]


def test_a_socket_wait_polls_its_sockets_for_the_budget_and_sees_data_that_lands() -> None:
    """Socket-only waits on a host with a core per rank poll before sleeping: no data -> False after the
    whole budget; data waiting -> True (a 10 s budget would show as a 10 s test otherwise)."""
    import select
    import socket

    from ringflow.runtime.call.executor import _sockets_ready

    a, b = socket.socketpair()
    try:
        class Op:
            fds = ((b.fileno(), select.POLLIN),)
        t0 = time.monotonic()
        assert not _sockets_ready([Op()], 0.02)
        assert time.monotonic() - t0 >= 0.02
        a.send(b"x")
        assert _sockets_ready([Op()], 10.0)
        t0 = time.monotonic()
        assert not _sockets_ready([], 10.0)   # shm-only or fd-less ops: nothing to poll, no spin
        assert time.monotonic() - t0 < 5.0
    finally:
        a.close()
        b.close()


def _congestion(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()


@pytest.mark.parametrize("setting", ["auto", "reno", "system"])
def test_same_host_data_sockets_get_the_congestion_control_the_knob_picks(setting: str) -> None:
    """BBR paces loopback too (a 64 KiB message after a bulk transfer waits ~40 us): same-host sockets
    get a non-pacing algorithm on both ends, unless the knob says otherwise."""
    from ringflow import config
    from ringflow.runtime.transport.tcp import SAME_HOST_CC, Listener, congestion_for, dial
    uid, secret = "cc-test", b"s" * 32
    with config.override(TCP_CONGESTION=setting):
        lis = Listener("127.0.0.1", secret, uid, None, lambda p, s: None, lambda p, k: None)
        try:
            out = dial(lis.address, secret, {"uid": uid, "rank": 1, "key": "d0"}, None, time.monotonic() + 10, "rank 0")
            deadline = time.monotonic() + 10
            while (inc := lis.take(1, "d0")) is None:
                assert time.monotonic() < deadline, "the listener never admitted the connection"
                time.sleep(0.01)
            got = {_congestion(out), _congestion(inc)}
            out.close()
            inc.close()
        finally:
            lis.close()
    if setting == "auto":
        assert len(got) == 1 and got <= set(SAME_HOST_CC), got
    elif setting == "system":
        assert got == {Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()}
    else:
        assert got == {setting}
    # a peer on another host keeps the system's choice; a name the kernel lacks is a typed error
    assert congestion_for("192.0.2.77", "auto") == ((), False)
    assert congestion_for("127.0.0.1", "Cubic") == (("cubic",), True)


def test_a_congestion_control_the_kernel_lacks_is_a_config_error_naming_the_choices() -> None:
    from ringflow.errors import ConfigError
    from ringflow.runtime.transport.tcp import set_congestion
    with socket.socket() as s:
        with pytest.raises(ConfigError, match="no_such_cc.*use auto, system or one of: .*reno"):
            set_congestion(s, ("no_such_cc",), strict=True)
        assert set_congestion(s, ("no_such_cc", "reno"), strict=False) == "reno"
