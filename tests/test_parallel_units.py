"""Single-process checks of ringflow.parallel: hand-written gradients, bucket plans, PP schedules, PS logic."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ringflow.errors import InvalidArgument, ProtocolError, UnknownAlgorithm
from ringflow.parallel.buckets import plan_buckets
from ringflow.parallel.data import global_batch, local_batch, make_classification
from ringflow.parallel.nn import mlp, mlp_layers, softmax_xent
from ringflow.parallel.param_server import ShardServer, roles, shard_bounds
from ringflow.parallel.pipeline import stage_bounds
from ringflow.parallel.pp_schedule import peak_inflight, schedule, simulate, theoretical_bubble
from ringflow.parallel.tensor import TransformerBlock, shard_block_params


def _numeric_grad(f, arr: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(arr)
    flat = arr.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        a = f()
        flat[i] = old - eps
        b = f()
        flat[i] = old
        g.reshape(-1)[i] = (a - b) / (2 * eps)
    return g


def test_mlp_backward_matches_finite_differences() -> None:
    data = make_classification(200, 5, 3, seed=4)
    model = mlp([5, 7, 6, 3], seed=2)
    x, y = data.x_train[:9], data.y_train[:9]

    def loss() -> float:
        return softmax_xent(model.forward(x)[0], y)[0]

    out, caches = model.forward(x)
    _, dy = softmax_xent(out, y)
    model.backward(caches, dy)
    num = _numeric_grad(loss, model.params.flat)
    assert np.abs(num - model.params.grad).max() < 1e-8   # central differences, eps=1e-6, float64


def test_transformer_block_backward_matches_finite_differences() -> None:
    blk = TransformerBlock(8, 2, 12, None, seed=1)
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 4, 8))

    def loss() -> float:
        return float((blk.forward(x)[0] * w).sum())

    y, cache = blk.forward(x)
    dx = blk.backward(cache, w)
    g = blk.params.grad.copy()
    num = _numeric_grad(loss, blk.params.flat)
    assert np.abs(num - g).max() < 1e-7 * max(1.0, np.abs(g).max())
    assert np.abs(_numeric_grad(loss, x) - dx).max() < 1e-7


def test_attention_is_causal() -> None:
    blk = TransformerBlock(8, 2, 12, None, seed=1)
    x = np.random.default_rng(1).normal(size=(1, 5, 8))
    y1 = blk.forward(x)[0]
    x2 = x.copy()
    x2[:, -1] += 1.0           # changing the last token must not change earlier outputs
    y2 = blk.forward(x2)[0]
    assert np.allclose(y1[:, :-1], y2[:, :-1]) and not np.allclose(y1[:, -1], y2[:, -1])


def test_shards_of_tp_block_partition_the_weights() -> None:
    blk = TransformerBlock(8, 4, 16, None, seed=0)
    full = {k: blk.params.value(k) for k in blk.ORDER}
    parts = [shard_block_params(full, r, 2) for r in range(2)]
    assert np.array_equal(np.concatenate([p["mlp.fc1.W"] for p in parts], axis=1), full["mlp.fc1.W"])
    assert np.array_equal(np.concatenate([p["attn.proj.W"] for p in parts], axis=0), full["attn.proj.W"])
    qkv = np.concatenate([p["attn.qkv.W"] for p in parts], axis=1)
    assert sorted(map(tuple, qkv.T)) == sorted(map(tuple, full["attn.qkv.W"].T))
    with pytest.raises(InvalidArgument):
        TransformerBlock(8, 3, 16, None)


def test_bucket_plan_reverse_order_small_first_bucket() -> None:
    sizes = [400, 40, 400, 40, 400, 40]
    plan = plan_buckets(sizes, bucket_cap_nbytes=800, first_bucket_nbytes=50)
    order = [i for b in plan for i in b.params]
    assert order == list(range(len(sizes) - 1, -1, -1))          # reverse parameter order, each param once
    assert plan[0].params == (5, 4) and plan[0].nbytes == 440     # closes as soon as it reaches 50 bytes
    assert all(b.nbytes >= 800 for b in plan[1:-1])
    assert all(b.nbytes - sizes[b.params[-1]] < 800 for b in plan[1:])  # closed at the first param that reached the cap
    with pytest.raises(InvalidArgument):
        plan_buckets(sizes, 0)


@pytest.mark.parametrize("p,m", [(1, 1), (2, 4), (4, 8), (3, 5), (4, 2)])
def test_pp_schedules_bubble_and_memory(p: int, m: int) -> None:
    for name in ("gpipe", "1f1b"):
        lists = schedule(name, p, m)
        for acts in lists:                      # every micro-batch forward once, backward once, F before B
            assert sorted((a.kind, a.mb) for a in acts) == sorted([("F", j) for j in range(m)] +
                                                                  [("B", j) for j in range(m)])
        tl = simulate(lists, t_f=1.0, t_b=2.0)
        assert tl.bubble == pytest.approx(theoretical_bubble(p, m), abs=1e-12)
        peaks = [peak_inflight(a) for a in lists]
        if name == "gpipe":
            assert peaks == [m] * p
        else:
            assert peaks == [min(p - s, m) for s in range(p)]
    with pytest.raises(UnknownAlgorithm):
        schedule("zigzag", 2, 2)


def test_stage_bounds_cover_all_layers() -> None:
    layers = mlp_layers([4, 8, 8, 8, 8, 2])
    for p in (1, 2, 3, 5):
        b = stage_bounds(layers, p)
        assert b[0][0] == 0 and b[-1][1] == len(layers) and all(b[i][1] == b[i + 1][0] for i in range(p - 1))
    with pytest.raises(InvalidArgument):
        stage_bounds(layers, 6)
    wide = mlp_layers([16, 256, 256, 256, 256, 256, 4])           # 4 big layers, 2 small ones at the ends
    for lo, hi in stage_bounds(wide, 4):                           # balanced: one big layer per stage
        assert sum(1 for lay in wide[lo:hi] if getattr(lay, "param_shapes", {}).get("W") == (256, 256)) == 1


def test_batches_and_roles() -> None:
    data = make_classification(100, 3, 2, seed=0)
    xb, yb = global_batch(data.x_train, data.y_train, 3, 12)
    parts = [local_batch(data.x_train, data.y_train, 3, 12, r, 3) for r in range(3)]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), xb)
    with pytest.raises(InvalidArgument):
        local_batch(data.x_train, data.y_train, 0, 10, 0, 3)
    assert roles("cpu", 3) == ([0], [1, 2]) and roles("sharded", 2) == ([0, 1], [0, 1])
    with pytest.raises(UnknownAlgorithm):
        roles("gpu7", 2)
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]


def _play(mode: str, s: int, order: list[int], n_workers: int, steps: int) -> ShardServer:
    """Drive a ShardServer: at each turn the chosen worker pushes if it holds an answer (else it waits)."""
    srv = ShardServer(np.zeros(3), list(range(n_workers)), mode, lr=0.1, staleness=s,
                      target_updates=steps * n_workers)
    can_push = {w: True for w in range(n_workers)}
    clock = {w: 0 for w in range(n_workers)}
    stopped: set[int] = set()
    for w in order + list(range(n_workers)) * (4 * steps + 4 * s + 8):
        if w in stopped or not can_push[w]:
            continue
        clock[w] += 1
        can_push[w] = False
        for r in srv.push(w, clock[w], np.ones(3)):
            can_push[r.worker] = True
            if r.stop:
                stopped.add(r.worker)
                for r2 in srv.bye(r.worker):
                    can_push[r2.worker] = True
                    if r2.stop:
                        stopped.add(r2.worker)
    return srv


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3), st.lists(st.integers(0, 2), min_size=0, max_size=60))
def test_ssp_bound_holds_for_any_arrival_order(s: int, order: list[int]) -> None:
    srv = _play("ssp", s, order, 3, 8)
    assert srv.max_clock_gap() <= s
    assert all(r.clock - r.min_clock <= s for r in srv.releases if not r.stop)


def test_asp_has_no_bound_and_bsp_is_lockstep() -> None:
    order = [0] * 30                     # worker 0 runs far ahead of 1 and 2
    asp = _play("asp", 0, order, 3, 8)
    assert asp.max_clock_gap() > 5
    bsp = _play("bsp", 0, order, 3, 8)
    assert bsp.max_clock_gap() == 0 and set(bsp.staleness) == {0}
    assert bsp.version == 8 and bsp.applied == 24
    np.testing.assert_allclose(bsp.params, -0.1 * 8 * np.ones(3))   # 8 rounds of lr x mean(ones)


def test_shard_server_rejects_protocol_violations() -> None:
    srv = ShardServer(np.zeros(2), [0, 1], "ssp", lr=0.1, staleness=0)
    srv.push(0, 1, np.ones(2))             # deferred: worker 1 is behind
    with pytest.raises(ProtocolError):
        srv.push(0, 2, np.ones(2))         # pushed again without an answer
    with pytest.raises(ProtocolError):
        srv.push(1, 3, np.ones(2))         # skipped clocks
    with pytest.raises(UnknownAlgorithm):
        ShardServer(np.zeros(2), [0], "hogwild", lr=0.1)


def test_buckets_launch_in_plan_order_whatever_the_hook_order() -> None:
    from ringflow.errors import InvalidUsage
    from ringflow.parallel.ddp import _BucketLauncher

    plan = plan_buckets([8] * 6, bucket_cap_nbytes=16, first_bucket_nbytes=8)   # (5), (4, 3), (2, 1), (0)
    launched: list[int] = []
    lz = _BucketLauncher(plan, overlap=True, launch=lambda b: launched.append(b.index))
    for i in (2, 1, 5, 0, 4, 3):        # bucket 2 completes first, but must wait for buckets 0 and 1
        lz.param_ready(i)
        if i in (2, 1):                 # bucket 2 is complete after param 1, yet nothing may start
            assert launched == []
        if i == 5:
            assert launched == [0]
    lz.finish()
    assert launched == [0, 1, 2, 3]
    lz.reset()
    launched.clear()
    lz.param_ready(5)
    with pytest.raises(InvalidUsage):
        lz.finish()                     # parameters 0..4 never got a gradient
    off = _BucketLauncher(plan, overlap=False, launch=lambda b: launched.append(b.index))
    launched.clear()
    for i in range(6):
        off.param_ready(i)
    assert launched == []               # no overlap: nothing launched during backward
    off.finish()
    assert launched == [0, 1, 2, 3]
