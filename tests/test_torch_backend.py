"""ringflow as a torch.distributed backend: the operation matrix on 1-4 real processes, and unmodified DDP / FSDP2
training (examples/torch/train_lm.py) agreeing with gloo and with one process.

Ranks start as plain processes with RANK/WORLD_SIZE and a `file://` init method (no DNS, no fixed port).
Tolerance for training equivalence (float64): max |difference| <= 1e-12.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import outputs_of  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch (optional extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent
TOL = 1e-12


def launch(tmp_path: Path, n: int, argv: list[str], *, torchrun_env: bool = False,
           timeout_s: float = 90.0) -> list[str]:
    """Start n ranks of `python argv...`, given `RANK N INIT_FILE` as arguments or (torchrun_env) RANK/WORLD_SIZE
    in the environment and `--init-method file://...`; their stdouts."""
    init = tmp_path / f"init.{n}.{abs(hash(tuple(argv))) % 10**8}"
    procs = []
    for r in range(n):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        if torchrun_env:
            env.update(RANK=str(r), WORLD_SIZE=str(n))
            cmd = [sys.executable, *argv, "--init-method", f"file://{init}"]
        else:
            cmd = [sys.executable, *argv, str(r), str(n), str(init)]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))

    def ok(p: subprocess.Popen, err: str) -> bool:
        # torch 2.13's gloo can abort in C++ teardown after the script has finished ("terminate called
        # without an active exception", SIGABRT at exit); the script's results are complete by then
        return p.returncode == 0 or (p.returncode == -6 and "terminate called without an active exception" in err)
    return outputs_of(procs, timeout_s, ok)


@pytest.mark.long
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_operation_matrix(tmp_path: Path, n: int) -> None:
    """Every operation x dtype against a NumPy reference; 8 ranks outnumber this machine's cores."""
    outs = launch(tmp_path, n, [str(ROOT / "tests" / "torch_backend_ranks.py")], timeout_s=300.0 if n > 4 else 90.0)
    for r, out in enumerate(outs):
        res = json.loads(out.strip().splitlines()[-1])
        assert res["rank"] == r and res["fails"] == [] and res["checks"] > 150


def test_backend_registered_on_import() -> None:
    code = ("import torch.distributed as d, ringflow.torch_backend as rb; "
            "assert 'ringflow' in d.Backend.backend_list; assert d.Backend('ringflow') == 'ringflow'; "
            "assert d.Backend.default_device_backend_map['cpu'] in ('gloo', 'ringflow'); print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def _train(tmp_path: Path, n: int, backend: str, mode: str) -> dict:
    js = tmp_path / f"{backend}.{mode}.{n}.json"
    launch(tmp_path, n, [str(ROOT / "examples" / "torch" / "train_lm.py"), "--backend", backend, "--mode", mode,
                         "--steps", "20", "--json-out", str(js)], torchrun_env=True)
    return json.loads(js.read_text())


@pytest.mark.long
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_training_equals_gloo_and_single_process(tmp_path: Path, mode: str) -> None:
    """Two ringflow ranks train to the parameters of two Gloo ranks and of one process."""
    rf = _train(tmp_path, 2, "ringflow", mode)
    single = _train(tmp_path, 1, "gloo", mode)
    refs = [_train(tmp_path, 2, "gloo", mode), single]
    assert rf["steps"] == 20 and rf["world_size"] == 2 and single["world_size"] == 1
    assert rf["ranks_agree"] <= TOL                       # every rank holds the same parameters
    for name, p in rf["params"].items():
        for ref in refs:
            diff = max(abs(a - b) for a, b in zip(p, ref["params"][name], strict=True))
            assert diff <= TOL, f"{mode} {name}: {diff:.3g}"
    assert abs(rf["losses"][-1] - single["losses"][-1]) <= 1e-10
    assert rf["losses"][-1] < rf["losses"][0]


def test_torch_autoloads_the_entry_point(tmp_path: Path) -> None:
    """pyproject's "torch.backends" entry point, installed as package metadata, registers the backend on
    `import torch` alone."""
    tomllib = pytest.importorskip("tomllib")
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["torch.backends"]
    info = tmp_path / "ringflow_autoload_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ringflow-autoload-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    code = "import torch, torch.distributed as d; print('ringflow' in d.Backend.backend_list)"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
