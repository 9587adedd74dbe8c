"""ZeRO-3 as PyTorch FSDP runs it per transformer block and root (fsdp_units per_block): what it sends and
what stays exposed."""
from __future__ import annotations

import pytest

from ringflow.errors import ConfigError
from ringflow.workload import load_model
from ringflow.workload.commmodel import AlphaBetaModel
from ringflow.workload.compute import MicrobatchTimes, gpu_spec
from ringflow.workload.fsdp import Units, exposed_s, root_params, stage_units
from ringflow.workload.layout import Layout
from ringflow.workload.memory import stage_param_split
from ringflow.workload.steptime import step_time
from ringflow.workload.validation import cluster_for

M8 = load_model("llama3-8b")
GB_PER_S = 1e9


def _rate(coll: str, nbytes: float) -> float:
    return nbytes / GB_PER_S   # one second per GB, whatever the collective


def _mb(forward_s: float, backward_s: float) -> MicrobatchTimes:
    return MicrobatchTimes(forward_s, backward_s, 0.0, 0.0, 0.0)


def test_unknown_fsdp_units_is_a_config_error_naming_the_choices():
    with pytest.raises(ConfigError, match="per_block"):
        Layout(zero=3, fsdp_units="flat")


def test_root_holds_embedding_on_first_stage_and_norm_and_output_on_last():
    lay = Layout(pp=2, dp=8, zero=3, global_batch=16)
    emb = M8.vocab * M8.hidden
    assert root_params(M8, lay, 0) == emb
    assert root_params(M8, lay, 1) == emb + M8.norm_params()
    one = Layout(dp=8, zero=3, global_batch=16)
    dense, expert = stage_param_split(M8, one, 0)
    units = stage_units(M8, one, 0, dense, expert)
    assert units.blocks == M8.layers
    assert units.block_params[0] * units.blocks + units.root_params == pytest.approx(dense)


def test_long_compute_leaves_exposed_the_root_and_first_block_gathers_and_the_last_reduce_scatters():
    units = Units(blocks=4, block_params=(1e9, 0.0), root_params=5e8)
    lay = Layout(dp=8, zero=3, global_batch=8)   # bf16 gathers, float32 reduce-scatters
    t, wire = exposed_s(units, lay, _mb(1e6, 1e6), (_rate, _rate))
    assert t == pytest.approx(0.5 * 2 + 1 * 2 + 1 * 4 + 0.5 * 4)   # root AG, block AG, block RS, root RS (s)
    # gathers: 4 forward + 3 backward (the last block stays gathered); reduce-scatters of every parameter
    assert wire == pytest.approx(7 * 1e9 * 2 + 5e8 * 2 + (4e9 + 5e8) * 4)


def test_short_compute_exposes_each_gather_beyond_the_block_before_it():
    units = Units(blocks=3, block_params=(1e9, 0.0), root_params=0.0)
    lay = Layout(dp=8, zero=3, global_batch=8)
    fwd_per_block, bwd_per_block = 0.5, 1.0
    t, _ = exposed_s(units, lay, _mb(3 * fwd_per_block, 3 * bwd_per_block), (_rate, _rate))
    forward = 2 + 2 * (2 - fwd_per_block)
    backward = (2 - bwd_per_block) + (2 + 4 - bwd_per_block) + (4 - bwd_per_block) + 4
    assert t == pytest.approx(forward + backward)


def test_a_hidden_collective_slows_the_compute_beside_it_by_the_sms_its_kernel_holds():
    units = Units(blocks=3, block_params=(1e9, 0.0), root_params=0.0)
    lay = Layout(dp=8, zero=3, global_batch=8)
    mb = _mb(3 * 0.5, 3 * 1.0)   # as above: each forward window hides 0.5 s of a gather, each backward 1 s
    bare, _ = exposed_s(units, lay, mb, (_rate, _rate))
    held, _ = exposed_s(units, lay, mb, (_rate, _rate), sm_share=0.25)
    hidden = 2 * 0.5 + 3 * 1.0   # two later forward gathers, three backward windows
    assert held - bare == pytest.approx(0.25 * hidden)
    gpu = gpu_spec("H100")
    assert gpu.nccl_sm_share == pytest.approx(24 / 132) and gpu_spec("A100").nccl_sm_share == 0.0


def test_pipeline_gathers_once_per_step_and_reduces_each_chunk_once():
    units = Units(blocks=4, block_params=(1e9, 0.0), root_params=0.0)
    few = Layout(pp=4, dp=2, interleave=2, zero=3, global_batch=8, micro_batch=1)
    many = few.with_(global_batch=64)
    t_few, wire_few = exposed_s(units, few, _mb(1e6, 1e6), (_rate, _rate))
    t_many, wire_many = exposed_s(units, many, _mb(1e6, 1e6), (_rate, _rate))
    assert wire_few == wire_many == pytest.approx(4e9 * 2 + 4e9 * 4)
    # one block gather per chunk; the last chunk's reduce-scatters (2 blocks x 4 s); the earlier chunk's hidden
    assert t_few == t_many == pytest.approx(2 * 2 + 2 * 4)


def test_float8_weight_gathers_carry_one_byte_per_block_parameter():
    units = Units(blocks=4, block_params=(1e9, 0.0), root_params=1e8)
    lay = Layout(pp=4, dp=2, zero=3, global_batch=8, precision="fp8")
    _, bf16 = exposed_s(units, lay, _mb(1e6, 1e6), (_rate, _rate))
    _, fp8 = exposed_s(units, lay.with_(fp8_params=True), _mb(1e6, 1e6), (_rate, _rate))
    assert bf16 - fp8 == pytest.approx(4e9 * (2 - 1))


def test_step_time_reduce_scatters_gradients_in_the_reduce_dtype():
    topo = cluster_for("dgx-h100", 2)
    lay = Layout(dp=16, zero=3, fsdp_units="per_block", micro_batch=1, global_batch=16, seq_len=4096)
    r4 = step_time(M8, lay, topo, comm=AlphaBetaModel())
    r2 = step_time(M8, lay.with_(grad_bytes=2), topo, comm=AlphaBetaModel())
    dense, _ = stage_param_split(M8, lay, 0)
    assert r4.comm_bytes_per_step["dp"] - r2.comm_bytes_per_step["dp"] == pytest.approx(dense * 2 * 15 / 16)
    assert r4.breakdown["dp_exposed"] > r2.breakdown["dp_exposed"] > 0


def test_pipelined_per_block_fsdp_sends_the_same_bytes_whatever_the_microbatch_count():
    topo = cluster_for("dgx-h100", 4)
    lay = Layout(tp=8, pp=2, dp=2, zero=3, fsdp_units="per_block", micro_batch=1, global_batch=8,
                 seq_len=2048, sequence_parallel=True)
    a = step_time(M8, lay, topo, comm=AlphaBetaModel())
    b = step_time(M8, lay.with_(global_batch=32), topo, comm=AlphaBetaModel())
    assert a.comm_bytes_per_step["dp"] == pytest.approx(b.comm_bytes_per_step["dp"])
    bucketed = [step_time(M8, x.with_(fsdp_units="bucketed"), topo, comm=AlphaBetaModel())
                for x in (lay, lay.with_(global_batch=32))]
    assert bucketed[1].comm_bytes_per_step["dp"] == pytest.approx(4 * bucketed[0].comm_bytes_per_step["dp"])


def test_pipelined_per_block_fsdp_holds_the_stage_gradients_unsharded_in_the_reduce_dtype():
    from ringflow.workload.memory import MemoryPolicy, stage_memory
    lay = Layout(pp=2, dp=8, zero=3, fsdp_units="per_block", global_batch=16)
    pol = MemoryPolicy(reshard_after_forward=False)
    dense, _ = stage_param_split(M8, lay, 0)
    deferred = stage_memory(M8, lay, 0, 80e9, policy=pol)
    assert deferred.grads_bytes == pytest.approx(dense * 4)
    bucketed = stage_memory(M8, lay.with_(fsdp_units="bucketed"), 0, 80e9, policy=pol)
    assert bucketed.grads_bytes == pytest.approx(dense * 4 / 8)


def test_pipelined_fsdp_casts_the_first_gradient_and_adds_each_later_one_in_the_reduce_dtype():
    from ringflow.workload.fsdp import accumulate_s
    units = Units(blocks=4, block_params=(1e9, 0.0), root_params=5e8)
    lay = Layout(pp=4, dp=2, zero=3, global_batch=8, micro_batch=1)   # 4 micro-batches, float32 reduce dtype
    params = 4.5e9
    # first: bf16 read + fp32 written (6 B); each later: bf16 and fp32 read, fp32 written (10 B); per micro-batch
    assert accumulate_s(units, lay, 1.0) == pytest.approx(params * (6 + 3 * 10) / 4)
    # reduce dtype = param dtype: the first gradient stays in place, autograd adds the later ones (6 B)
    assert accumulate_s(units, lay.with_(grad_bytes=2), 1.0) == pytest.approx(params * 3 * 6 / 4)
    assert accumulate_s(units, Layout(dp=8, zero=3, global_batch=8), 1.0) == 0.0   # no pipeline: reduced each time


def test_step_time_prices_the_gradient_accumulation_of_pipelined_per_block_fsdp_only():
    topo = cluster_for("dgx-h100", 4)
    lay = Layout(tp=8, pp=2, dp=2, zero=3, fsdp_units="per_block", micro_batch=1, global_batch=8,
                 seq_len=2048, sequence_parallel=True)
    r = step_time(M8, lay, topo, comm=AlphaBetaModel())
    assert r.breakdown["grad_accumulate"] > 0
    assert r.step_time_s == pytest.approx(sum(r.breakdown.values()))
    bucketed = step_time(M8, lay.with_(fsdp_units="bucketed"), topo, comm=AlphaBetaModel())
    assert bucketed.breakdown["grad_accumulate"] == 0.0
