"""No shared-memory name outlives its job, whenever the job is killed."""
from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ringflow.runtime.transport import shm

ROOT = Path(__file__).resolve().parent.parent

SENDER = '''
import sys, time
from ringflow.runtime.transport import shm
out = shm.ShmOut(sys.argv[1], 4, 4096, 1, b"\\0ringflow-test-nobody")   # no receiver will ever map it
print("created", flush=True)
time.sleep(600)
'''


def test_a_sender_killed_before_any_receiver_mapped_its_segment_leaves_no_name(tmp_path: Path) -> None:
    name = f"ringflow-test{uuid.uuid4().hex[:8]}-0-1-0-c0"
    path = os.path.join(shm.SHM_DIR, name)
    (tmp_path / "sender.py").write_text(SENDER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "sender.py"), name], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "created"
        assert os.path.exists(path), "the segment should be named while its sender lives"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        end = time.monotonic() + 10
        while os.path.exists(path) and time.monotonic() < end:
            time.sleep(0.02)
        assert not os.path.exists(path), f"{path} outlived its SIGKILLed creator"
    finally:
        if proc.poll() is None:
            proc.kill()
        shm.unlink_quiet(name)


def _trials_module():  # benchmarks/ is not a package: load the trial script by path
    spec = importlib.util.spec_from_file_location("shm_cleanup_trials", ROOT / "benchmarks" / "shm_cleanup_trials.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("nranks,phase", [(2, "init"), (4, "collectives")])
def test_sigkill_to_the_launcher_at_a_random_moment_leaves_no_name_and_no_process(nranks: int, phase: str) -> None:
    """A few of benchmarks/shm_cleanup_trials.py's trials (the script runs a hundred per rank count)."""
    trial = _trials_module().run_trial(nranks, phase, random.Random(nranks * 7 + len(phase)))
    assert trial["processes_left"] == 0, trial
    assert trial["left"] == [], trial
    if phase == "collectives":
        assert trial["ranks_ready_at_kill"] == nranks and trial["job"], trial
