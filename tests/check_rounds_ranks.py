"""Rank side of tests/test_check_rounds.py (under `ringflow run -n 4`): the communicator's argument-check pattern
follows the cost model `tune_with` gives it (the flat figures, a model whose messages cost what a step does, the
flat figures again); under each, exact results and a mismatch that every rank raises. Writes OUT/rank<R>.json.

    ringflow run -n 4 tests/check_rounds_ranks.py OUT
"""
from __future__ import annotations

import json
import sys

import numpy as np

import ringflow
from ringflow.algorithms.selection import FlatCostModel
from ringflow.errors import InvalidArgument


def main() -> None:
    """One phase per model; write this rank's pattern, algorithm, correctness and error per phase."""
    comm = ringflow.init(timeout=30)
    r, n = comm.rank, comm.size
    phases = []
    for model in (None, FlatCostModel(alpha_us=1.0, msg_us=1.0), None):
        comm.tune_with(model)
        x = np.full(3, r + 1.0, np.float32)
        comm.all_reduce(x)
        algo = comm.last_schedule.algorithm if comm.last_schedule is not None else None
        b = np.full(5, 7.0 if r == n - 1 else 0.0)
        comm.broadcast(b, root=n - 1)
        comm.barrier()
        y = np.ones(4 + (r == 0), np.float32)
        try:
            comm.all_reduce(y)
            err = None
        except InvalidArgument:
            err = "InvalidArgument"
        phases.append({"pattern": comm._mem.pattern, "algorithm": algo, "exact": bool((x == n * (n + 1) / 2).all())
                       and bool((b == 7.0).all()), "mismatch": err, "untouched": bool((y == 1).all())})
    with open(f"{sys.argv[1]}/rank{r}.json", "w") as fh:
        json.dump(phases, fh)
    comm.destroy()


if __name__ == "__main__":
    main()
