"""The `ringflow` command: one module per command group, each with `register(app)`."""
from __future__ import annotations

import importlib
import sys

import typer

from .common import run_app

# Each module owns its commands: hw/topo (foundation), algo (schedules), runtime (run/bench/store),
# sim (sim), hostmodel (calibrate/validate), workload (traffic/train/plan), record (record/diagnose).
_MODULES = ["hw", "topo", "algo", "runtime_cmds", "sim_cmds", "hostmodel_cmds", "workload_cmds", "record_cmds"]


def build_app() -> typer.Typer:
    """Assemble the CLI from the per-area modules."""
    app = typer.Typer(help="ringflow: collectives for distributed training, a hardware model and a cluster simulator.",
                      no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
    for name in _MODULES:
        importlib.import_module(f"ringflow.cli.{name}").register(app)
    return app


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script."""
    _freeze_at_exit()
    run_app(build_app(), sys.argv[1:] if argv is None else argv)


_FREEZE_REGISTERED: list[bool] = []


def _freeze_at_exit() -> None:
    """At interpreter exit, leave what the command built to the operating system: a 16,384-GPU cluster and its
    simulator tables are millions of objects that the collector's exit pass would scan and free one by one
    (Python does not promise to finalize objects still alive at exit)."""
    if not _FREEZE_REGISTERED:
        import atexit
        import gc
        atexit.register(gc.freeze)
        _FREEZE_REGISTERED.append(True)
