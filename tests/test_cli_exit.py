"""The console script leaves what a command built to the operating system at exit (no collector pass over it)."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import atexit, gc
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))   # runs after main's handler
from ringflow.cli import main
from ringflow.topology import build_cluster
topo = build_cluster("dgx-h100", 2)
print("frozen before exit:", gc.get_freeze_count() > 0)
for _ in range(2):
    try:
        main(["topo", "--help"])
    except SystemExit:
        pass
print("frozen after the command:", gc.get_freeze_count() > 0)
"""


def test_objects_alive_at_exit_are_frozen_only_when_the_process_ends() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=60).stdout
    lines = [x for x in out.splitlines() if x.startswith("frozen")]
    assert lines == ["frozen before exit: False", "frozen after the command: False", "frozen at exit: True"]
