"""HostLoadMeter on real processes: a busy process it did not reap is other work, a reaped child is ours."""
import os
import subprocess
import sys
import time

import pytest

from ringflow.runtime import hostload
from ringflow.runtime.hostload import HostLoad, HostLoadMeter
from ringflow.sim.validate import job_ran_busy

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


def test_shares_and_verdict():
    load = HostLoad(wall_s=2.0, cores=2, busy_core_s=3.0, ours_core_s=1.0, steal_core_s=0.4)
    assert load.foreign_core_s == pytest.approx(2.0)
    assert load.foreign_fraction == pytest.approx(0.6)
    assert load.busy and "60%" in load.describe()
    quiet = HostLoad(wall_s=10.0, cores=2, busy_core_s=9.0, ours_core_s=9.2, steal_core_s=0.1)
    assert quiet.foreign_core_s == 0.0 and not quiet.busy
    assert job_ran_busy({"host_load": load.as_dict()}) and not job_ran_busy({"host_load": quiet.as_dict()})
    assert not job_ran_busy({})   # recordings made before the meter


def test_no_proc_stat_gives_no_figure(monkeypatch):
    monkeypatch.setattr(hostload, "_STAT", "/nonexistent/stat")
    with HostLoadMeter() as meter:
        pass
    assert meter.result is None


def test_summary_names_busy_configurations():
    from ringflow.cli.sim_cmds import noise_summary
    rows = [{"transport": "shm", "nranks": 2, "error": 0.01, "jobs": 6, "spread": 0.02, "busy_jobs": 2},
            {"transport": "tcp", "nranks": 4, "error": 0.30, "jobs": 6, "spread": 0.02, "busy_jobs": 0}]
    text = noise_summary(rows, 0.15)
    assert text.startswith("1/2 sizes within 15%")
    assert "shm2 2" in text and "tcp4" not in text


def test_start_of_run_warning_sees_work_running_now(busy_loops):
    """`busy_warning` samples the cores for a second: a busy-looping process per core makes it warn with
    its share (the load average it replaced lagged a minute and warned after work had ended)."""
    from ringflow.sim.calibrate import busy_warning
    busy_loops(os.cpu_count() or 1)
    time.sleep(0.3)
    warn = busy_warning(window_s=0.5)
    assert warn is not None and "other processes are using" in warn, warn
