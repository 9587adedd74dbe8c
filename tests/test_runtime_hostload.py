"""HostLoadMeter on real processes: a busy process it did not reap is other work, a reaped child is ours."""
import subprocess
import sys

import pytest

from ringflow.runtime.job import hostload
from ringflow.runtime.job.hostload import HostLoadMeter

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/stat")

# burns `cpu_s` seconds of its own CPU time, says so on stdout, then waits for stdin to close
BURNER = ("import sys, time\n"
          "t0 = time.process_time()\n"
          "while time.process_time() - t0 < float(sys.argv[1]):\n"
          "    pass\n"
          "print('done', flush=True)\n"
          "sys.stdin.read()\n")


def test_unreaped_busy_process_counts_as_other_work():
    with HostLoadMeter() as meter:
        p = subprocess.Popen([sys.executable, "-c", BURNER, "0.5"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        try:
            assert p.stdout.readline().strip() == "done"
        except BaseException:
            p.kill()
            raise
    p.stdin.close()
    p.wait(timeout=30)
    load = meter.result
    assert load is not None
    assert load.foreign_core_s >= 0.4, load
    assert load.busy_core_s >= load.foreign_core_s


def test_reaped_child_counts_as_ours():
    with HostLoadMeter() as meter:
        subprocess.run([sys.executable, "-c", BURNER, "0.5"], input="", capture_output=True, timeout=60, check=True)
    load = meter.result
    assert load is not None
    assert load.ours_core_s >= 0.45, load
    assert load.busy_core_s >= 0.8 * load.ours_core_s, load


def test_no_proc_stat_gives_no_figure(monkeypatch):
    monkeypatch.setattr(hostload, "_STAT", "/nonexistent/stat")
    with HostLoadMeter() as meter:
        pass
    assert meter.result is None


