"""One rank of tests/test_parallel_zero.py (under `ringflow run -n N`): ZeRO stages 0-3 from the same start."""
from __future__ import annotations

import json
import sys

import numpy as np

import ringflow
from ringflow.parallel.nn import mlp
from ringflow.parallel.zero import ZeroDP

SIZES, STEPS, BATCH = [12, 33, 17, 5], 6, 24


def main() -> None:
    """Train each stage STEPS steps; rank 0 prints the parameters, losses and state bytes of each as JSON."""
    comm = ringflow.init()
    r, n = comm.rank, comm.size
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((STEPS, BATCH * n, SIZES[0]))
    ys = rng.integers(0, SIZES[-1], (STEPS, BATCH * n))
    out: dict = {"n": n, "stages": {}}
    for stage in (0, 1, 2, 3):
        model = mlp(SIZES, seed=3)
        full = {"params": model.params.flat.nbytes, "grads": model.params.grad.nbytes,
                "optimizer": 2 * model.params.flat.nbytes}
        z = ZeroDP(model, comm, stage, lr=0.01)
        losses = [z.train_step(xs[s, r::n], ys[s, r::n]) for s in range(STEPS)]
        params = z.full_params()
        out["stages"][stage] = {"params": params.tolist(), "losses": losses, "state": z.state_bytes(),
                                "full": full, "units": len(z.units)}
    comm.destroy()
    if r == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
