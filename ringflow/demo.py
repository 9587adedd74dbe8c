"""The `make demo` tour: hardware, topology, schedules, a real collective, the simulator, LLM traffic, training."""
from __future__ import annotations

import os
import subprocess
import sys
import time

STEPS: list[tuple[str, list[str]]] = [
    ("Hardware arithmetic: PCIe Gen3 x16 from the PCI-SIG rate and encoding",
     ["hw", "pcie", "--gen", "3", "--lanes", "16"]),
    ("DGX-1 V100 hybrid cube-mesh, as nvidia-smi topo -m prints it",
     ["topo", "show", "dgx1-v100"]),
    ("NVLink rings found on it (every hop NVLink; several channels use all links)",
     ["topo", "rings", "dgx1-v100"]),
    ("The ring all-reduce as a schedule (scatter-reduce then all-gather)",
     ["algo", "show", "all_reduce", "ring", "-n", "4"]),
    ("The verifier proves every algorithm of every collective on 7 ranks",
     ["algo", "verify", "all", "all", "-n", "7"]),
    ("The tuner's choice for a large all-reduce on one DGX H100",
     ["algo", "choose", "all_reduce", "--size", "256MiB", "-n", "8", "--topo", "dgx-h100"]),
    ("A real all-reduce between 2 processes over shared memory, checked",
     ["bench", "all_reduce", "-n", "2", "--min", "8", "--max", "16MiB", "--check"]),
    ("The simulator: all-reduce on 128 DGX H100 servers (1,024 GPUs), rail-optimised 400G fabric",
     ["sim", "all_reduce", "--topo", "dgx-h100", "--nodes", "128", "--fabric", "rail", "--nic", "400G",
      "--min", "1MiB", "--max", "1GiB", "--factor", "4"]),
    ("The simulator against published NCCL results: DGX H100 ring and NVLink SHARP, A100, H800, B300, InfiniBand",
     ["validate", "gpu"]),
    ("Closed-form per-epoch traffic of Llama-3-70B next to what ringflow's algorithms move",
     ["traffic", "--model", "llama3-70b", "--tokens", "156e9", "--batch", "2048", "--gpus", "8",
      "--formula", "both", "--tp", "8", "--pp", "8", "--dp", "16"]),
    ("Step time of Llama-3-70B on 1,024 H100s (8 TP x 8 PP x 16 DP)",
     ["train", "--model", "llama3-70b", "--topo", "dgx-h100", "--nodes", "128", "--tp", "8", "--pp", "8",
      "--dp", "16", "--interleave", "5"]),
    ("The planner's best layouts for that job",
     ["plan", "--model", "llama3-70b", "--gpus", "1024", "--topo", "dgx-h100", "--no-check"]),
    ("Real data-parallel training on 2 processes equals single-process training",
     ["run", "-n", "2", "examples/ddp_numpy.py"]),
    ("Parameter server with a slow worker: BSP, SSP and ASP",
     ["run", "-n", "4", "examples/param_server.py"]),
]


def command_path() -> str:
    """Where the `ringflow` console script of this Python lives (the virtual environment's bin directory)."""
    return os.path.join(os.path.dirname(sys.executable), "ringflow")


def step(title: str, args: list[str]) -> None:
    """Run one CLI command as a demo step, showing the command line."""
    print(f"\n\033[1m== {title}\033[0m\n$ ringflow {' '.join(args)}", flush=True)
    env = dict(os.environ, COLUMNS=os.environ.get("COLUMNS", "150"))
    subprocess.run([sys.executable, "-m", "ringflow", *args], check=True, env=env)


def main() -> None:
    """Run every demo step in order."""
    start = time.perf_counter()
    print(f"the command used below: {command_path()}")
    for title, args in STEPS:
        step(title, args)
    print(f"\ndemo finished in {time.perf_counter() - start:.0f} s")
    print(f"the command: {command_path()} (or `source {os.path.dirname(sys.executable)}/activate`, then `ringflow`)")


if __name__ == "__main__":
    main()
