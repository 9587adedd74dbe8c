"""ZeRO-3 as PyTorch FSDP runs it when applied per transformer block and to the root module (``fsdp_units:
per_block``): the exposed data-parallel seconds of one pipeline stage per step.

torchtitan (9dec370, ``parallelisms/parallelize_llama.py`` ``apply_fsdp``, lines 309-339) calls ``fully_shard``
on every TransformerBlock and then on the whole model, the root, which keeps the rest: the token embedding, the
final norm and the output layer. What each unit gathers and reduces, and what hides it:

- **dtypes**: parameters are all-gathered in ``param_dtype`` bf16 (2 B) and gradients reduce-scattered in
  ``reduce_dtype`` float32 (``Layout.grad_bytes``, 4 B): torchtitan ``config_manager.py`` lines 379-392
  (``mixed_precision_param`` "bfloat16", ``mixed_precision_reduce`` "float32", its only choice), passed to
  ``MixedPrecisionPolicy`` at ``parallelize_llama.py`` line 320. With FP8 weight gathers (``fp8_params``:
  torchao's ``enable_fsdp_float8_all_gather``, "cast Float8Linear.weight from high precision to float8 before
  FSDP all-gather", torchtitan ``docs/float8.md``) a block's weights travel as 1 B; the root stays bf16 (the
  output layer is not converted to Float8Linear).
- **root**: never resharded after forward ("For the root, do not reshard after forward since for training, the
  parameters would be freed and all-gathered immediately", PyTorch ``_composable/fsdp/_fsdp_state.py``
  ``FSDPState._lazy_init``): gathered once per micro-batch before anything else runs, its gradients
  reduce-scattered after the embedding's backward, the last work of the step: both exposed.
- **blocks, forward**: a block's all-gather is issued from its pre-forward hook while the previous block
  computes (implicit prefetch: the CPU runs ahead, gathers run on their own stream), so the first block's
  gather is exposed and every later one only beyond the previous block's forward.
- **blocks, backward**: with ``reshard_after_forward`` a block is gathered again for its backward, prefetched
  one block ahead ("FSDP2 always follows backward_prefetch=BACKWARD_PRE", torchtitan ``docs/fsdp.md``); torchtitan
  keeps the last block gathered (``reshard_after_forward = int(layer_id) < len(model.layers) - 1``, line 333).
  Each block's reduce-scatter runs during the next block's backward, beside that block's prefetch: the window
  of a block's backward carries one gather and one reduce-scatter; the first block's reduce-scatter is exposed.
- **with pipeline parallelism** torchtitan sets ``reshard_after_forward=False`` on blocks and root ("For PP, do
  not reshard after forward to avoid per-microbatch all-gathers", lines 326-329, 339): every unit is gathered at
  its first forward and stays gathered for the step; PyTorch's pipelining stage turns gradient sync off for
  every backward and reduce-scatters each stage chunk once, after its last micro-batch's backward
  (``torch/distributed/pipelining/stage.py`` ``PipelineStage.backward_maybe_with_nosync``:
  ``set_requires_gradient_sync(False)``, then ``post_backward()`` of every unit on ``last_backward``). The
  chunk that finishes last leaves its reduce-scatters exposed; an earlier chunk's hide under the last chunk's
  remaining backwards (the cool-down's last round: min(m, p) micro-batches).
- **gradient accumulation under pipeline parallelism**: with gradient sync off, each unit's post-backward hook
  keeps the micro-batch's unsharded gradient in the reduce dtype: the first micro-batch's bf16 gradient is cast
  (``FSDPParam.to_accumulated_grad_if_needed``: ``unsharded_grad.to(self.reduce_dtype)``), every later one added
  to that sum (``accumulate_unsharded_grad_if_needed``: ``unsharded_accumulated_grad += unsharded_param.grad``),
  PyTorch ``_composable/fsdp/_fsdp_param.py``, called from ``FSDPParamGroup.post_backward`` while
  ``reduce_grads`` is off. Each is one memory-bound pass over the stage's unsharded parameters on the compute
  stream after the unit's backward (`accumulate_s`); with the reduce dtype equal to the parameters' the first
  gradient stays in place and autograd adds the later ones (``AccumulateGrad``).

Collective times come from the caller (the step model's communication model over the DP group).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .compute import MicrobatchTimes
from .layout import Layout
from .models import ModelSpec

PARAM_BYTES = 2     # bf16 param_dtype
FP8_BYTES = 1       # float8 weight all-gather

CollTime = Callable[[str, float], float]    # (collective, nbytes) -> seconds over one DP group


@dataclass(frozen=True)
class Units:
    """The FSDP units one GPU of a pipeline stage holds: blocks and the root's parameters, per DP group."""

    blocks: int
    block_params: tuple[float, ...]   # per block, one entry per DP group (dense, expert)
    root_params: float                # embedding, final norm, output layer (dense DP group)


def root_params(model: ModelSpec, layout: Layout, stage: int) -> float:
    """Parameters of the root FSDP unit on pipeline stage `stage`: the embedding (first stage), the final norm and
    the output layer (last stage), split by TP as `memory.stage_param_split` splits them."""
    L = layout
    emb = model.vocab * model.hidden / L.tp
    p = 0.0
    if stage == 0:
        p += emb + (model.seq_len * model.hidden if model.position == "learned" else 0)
        p += model.norm_params() if model.embedding_norm else 0
    if stage == L.pp - 1:
        p += model.norm_params() + (emb if not model.tied_embeddings or L.pp > 1 else 0.0)
    return p


def stage_units(model: ModelSpec, layout: Layout, stage: int, dense_p: float, expert_p: float) -> Units:
    """The units of pipeline stage `stage` whose GPU holds `dense_p` + `expert_p` parameters."""
    a, b = layout.stage_ranges(model)[stage]
    n = max(b - a, 1)
    root = root_params(model, layout, stage)
    return Units(n, ((dense_p - root) / n, expert_p / n), root)


def exposed_s(units: Units, layout: Layout, mb: MicrobatchTimes, times: tuple[CollTime, ...],
              sm_share: float = 0.0) -> tuple[float, float]:
    """(exposed seconds per step, bytes one rank sends per step) of the stage's FSDP units (module docstring).

    `times` holds one collective-time function per entry of ``units.block_params`` (the dense DP group first,
    which also carries the root). A collective hidden under compute still holds `sm_share` of the SMs while it
    runs, so the compute beside it slows: the step grows by `sm_share` x the hidden collective time."""
    L = layout
    gb = FP8_BYTES if L.fp8_params else PARAM_BYTES
    n = units.blocks

    def per_block(coll: str, nbytes_per_param: float) -> float:
        return sum(t(coll, p * nbytes_per_param) for t, p in zip(times, units.block_params, strict=True) if p > 0)

    ag, rs = per_block("all_gather", gb), per_block("reduce_scatter", L.grad_bytes)
    root = units.root_params
    ag_root = times[0]("all_gather", root * PARAM_BYTES) if root else 0.0
    rs_root = times[0]("reduce_scatter", root * L.grad_bytes) if root else 0.0
    fwd = mb.forward_s / n
    bwd = (mb.backward_s + mb.recompute_s) / n
    m, p, v = L.microbatches, L.pp, L.interleave
    params = sum(units.block_params) * n
    if p == 1:
        # backward windows: the last block's hides the next gather; middle ones a gather and a reduce-scatter;
        # the first block's the second block's reduce-scatter; the first block's own is left
        loads = ([ag] if n > 1 else []) + [ag + rs] * max(n - 2, 0) + ([rs] if n > 1 else [])
        hidden = (n - 1) * min(ag, fwd) + sum(min(x, bwd) for x in loads)
        per_mb = (ag_root + ag + (n - 1) * max(0.0, ag - fwd) +
                  sum(max(0.0, x - bwd) for x in loads) + rs + rs_root + sm_share * hidden)
        wire = (2 * n - 1) * sum(units.block_params) * gb + root * PARAM_BYTES + (params + root) * L.grad_bytes
        return m * per_mb, m * wire
    n_chunk = max(n // v, 1)
    gathers = ag_root + v * (ag + (n_chunk - 1) * max(0.0, ag - fwd))
    rs_chunk = n_chunk * rs
    hide = min(m, p) * (mb.backward_s + mb.recompute_s) / v
    reduces = rs_chunk + rs_root + max(0.0, (v - 1) * rs_chunk - hide)
    hidden = v * (n_chunk - 1) * min(ag, fwd) + min((v - 1) * rs_chunk, hide)
    wire = params * gb + root * PARAM_BYTES + (params + root) * L.grad_bytes
    return gathers + reduces + sm_share * hidden, wire


def accumulate_s(units: Units, layout: Layout, mem_Bps: float) -> float:
    """Seconds per micro-batch, averaged over the step, of accumulating the stage's unsharded gradients in the
    reduce dtype while the pipeline keeps gradient sync off (module docstring); 0 without pipelining."""
    L = layout
    if L.pp == 1:
        return 0.0
    params = sum(units.block_params) * units.blocks + units.root_params
    g = L.grad_bytes
    first = 0.0 if g == PARAM_BYTES else PARAM_BYTES + g   # bf16 gradient read, cast, written in the reduce dtype
    later = PARAM_BYTES + 2 * g                             # bf16 gradient and the sum read, the sum written
    m = L.microbatches
    return params * (first + (m - 1) * later) / m / mem_Bps
