"""The `make demo` tour: topology, schedules, a real collective, the simulator, LLM traffic."""
from __future__ import annotations

import subprocess
import sys


def step(title: str, *args: str) -> None:
    """Run one CLI command as a demo step, showing the command line."""
    print(f"\n\033[1m== {title}\033[0m\n$ ringflow {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "ringflow", *args], check=True)


def main() -> None:
    """Run every demo step in order."""
    for title, args in STEPS:
        step(title, *args)


STEPS: list[tuple[str, list[str]]] = [
]

if __name__ == "__main__":
    main()
