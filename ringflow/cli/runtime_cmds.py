"""CLI of the runtime: `ringflow run`, `ringflow bench`, `ringflow store`."""
from __future__ import annotations

import sys
import time

import typer

from .common import print_json, write_json


def register(app: typer.Typer) -> None:
    """Add run / bench / store to the app."""

    @app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                         "allow_interspersed_args": False})
    def run_cmd(
        nprocs: int = typer.Option(..., "-n", "--nprocs", "--nranks", min=1,
                                  help="Number of ranks to start on this host."),
        timeout: float | None = typer.Option(None, "--timeout", min=0, help="Kill the job after this many seconds "
                                                "(exit code 124)."),
        no_prefix: bool = typer.Option(False, "--no-prefix", help="Do not prefix output lines with \\[rank]."),
        bind: bool = typer.Option(True, "--bind/--no-bind", help="Pin each rank to its own core when they fit."),
        program: list[str] = typer.Argument(..., help="script.py \\[args...] (or -m module, or a command)"),
    ) -> None:
        """Start N local ranks with RINGFLOW_* set; stop all and exit with a failing rank's code."""
        from ..runtime.job.launcher import run
        raise typer.Exit(run(nprocs, program, timeout_s=timeout, prefix=not no_prefix, bind=bind))

    @app.command("bench")
    def bench_cmd(
        collective: str = typer.Argument("all_reduce", help="all_reduce, all_gather, reduce_scatter, broadcast, "
                                         "reduce, all_to_all, gather, scatter, or all"),
        nprocs: int = typer.Option(2, "-n", "--nprocs", "--nranks", min=1, help="Ranks."),
        min_size: str = typer.Option("8", "--min", "-b", help="Smallest message (bytes, or 1KiB ...)."),
        max_size: str = typer.Option("64MiB", "--max", "-e", help="Largest message."),
        factor: int = typer.Option(2, "--factor", "-f", min=2, help="Size multiplier between rows."),
        algo: str | None = typer.Option(None, "--algo", help="Force an algorithm (RINGFLOW_ALGO syntax)."),
        dtype: str = typer.Option("float32", "--dtype", "-d", help="Element type."),
        op: str = typer.Option("sum", "--op", help="Reduction op (nccl-tests -o; here -o is the output file)."),
        iters: int = typer.Option(0, "--iters", "-n-iters", min=0, help="Timed iterations per size (0 = by size)."),
        warmup: int | None = typer.Option(None, "--warmup", "-w", min=0,
                                             help="Untimed iterations per size (default 5, as nccl-tests)."),
        check: bool = typer.Option(False, "--check", "-c", help="Verify results (#wrong column)."),
        shm_alloc: bool = typer.Option(False, "--alloc", help="Use comm.alloc() buffers."),
        json_out: bool = typer.Option(False, "--json", help="Print the rows as JSON instead of the table."),
        out: str | None = typer.Option(None, "-o", "--out", help="Also write the rows as JSON to this file."),
        timeout: float = typer.Option(600.0, "--timeout", min=0, help="Give up after this many seconds."),
        passes: int = typer.Option(1, "--passes", min=1, help="Split each size's samples over this many sweeps of "
                                   "all sizes (steadier medians on a noisy host)."),
    ) -> None:
        """nccl-tests style benchmark on real local ranks (time, algbw, busbw, #wrong)."""
        from ..runtime import bench
        rows = bench.launch(collective, nprocs, min_size, max_size, factor=factor, algo=algo, dtype=dtype, op=op,
                            iters=iters, warmup=bench.WARMUP_CALLS if warmup is None else warmup, check=check,
                            alloc=shm_alloc, timeout_s=timeout, passes=passes)
        if out:
            write_json(out, rows)
        if json_out:
            print_json(rows)
        else:
            bench.print_rows(rows)
        if any(r["wrong"] for r in rows):
            raise typer.Exit(1)

    @app.command("store")
    def store_cmd(
        port: int = typer.Option(29400, "--port", "-p", min=0, max=65535, help="TCP port."),
        host: str = typer.Option("127.0.0.1", "--host", help="Numeric address to listen on (default loopback; "
                                 "give this host's address, or 0.0.0.0, for ranks on other hosts)."),
        secret_file: str | None = typer.Option(None, "--secret-file", help="Read the job secret from this file "
                                               "(default: the RINGFLOW_SECRET environment variable)."),
    ) -> None:
        """Serve a standalone rendezvous store (for large jobs); SIGINT or SIGTERM stops it."""
        from .. import config
        from ..errors import ConfigError
        from ..runtime.job.store import StoreServer
        sec = _read_secret(secret_file) if secret_file else str(config.get("SECRET") or "")
        if not sec:
            raise ConfigError("the store needs the job secret",
                              "set RINGFLOW_SECRET or pass --secret-file (never on the command line: /proc shows it)")
        server = StoreServer(host, port, sec)
        sys.stdout.write(f"ringflow store listening on {server.address[0]}:{server.address[1]}\n")
        sys.stdout.flush()
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            server.close()


def _read_secret(path: str) -> str:
    """The job secret in the first line of `path`."""
    from ..errors import ConfigError
    try:
        with open(path) as fh:
            secret = fh.readline().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the secret file {path!r}: {exc.strerror}",
                          "give a readable file holding the job secret") from None
    if not secret:
        raise ConfigError(f"the secret file {path!r} is empty", "write the job secret on its first line")
    return secret
