"""Tensors replaced or mutated between torch.distributed calls on backend "ringflow" (fresh tensors, storage
swapped with set_ or .data, shrunk with resize_, views at moving offsets, non-contiguous views, tensors
requiring grad, a DDP-like pool): every result equals the exact one computed from every rank's inputs, on 2
real processes, for random step sequences that keep a slot's call shape for a while (so remembered calls
and remembered call shapes both run)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from test_torch_backend import launch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch (optional extra) is not installed")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.long
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_mutated_and_fresh_tensors_give_the_exact_result(tmp_path: Path, seed: int) -> None:
    outs = launch(tmp_path, 2, [str(ROOT / "tests" / "torch_fresh_ranks.py"), str(seed), "300"])
    for r, out in enumerate(outs):
        res = json.loads(out.strip().splitlines()[-1])
        assert res["rank"] == r and res["steps"] == 300 and res["fails"] == [], res["fails"]
        assert res["shapes"] > 0   # fresh tensors reached the remembered call shapes
