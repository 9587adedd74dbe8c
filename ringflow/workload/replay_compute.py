"""Compute gaps for a replay from the workload model (`ringflow replay --compute-model`).

A recording made on CPUs knows when each rank computed, not how long that compute takes on a GPU. When the
recorded job trains a model the workload model knows, the model gives one GPU's compute in one optimizer step
(forward, backward and recomputation of its micro-batches, `compute.microbatch_times`, mean over pipeline
stages). The replay keeps the recording's shape and takes its scale from the model: in every step (the calls
from one step marker, `replay.step_marks`, to the next) each rank's gaps are multiplied by one factor, chosen
so that the ranks' mean compute in that step equals the model's. What a step's compute is spread over (which
gap precedes which bucket) and how ranks differ (pipeline stages, stragglers) stay as recorded; the compute
before the first marker is scaled by the steps' mean factor.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from ..errors import InvalidArgument
from .compute import GpuSpec, efficiency_for, microbatch_times
from .layout import Layout
from .models import ModelSpec
from .replay import compute_gaps, instance_key, origin_ns, per_rank, step_marks, timeline


def parse_layout(text: str, nranks: int | None = None) -> Layout:
    """A Layout from ``key=value`` pairs separated by commas (Layout's field names); without a `dp` pair and
    given the job's `nranks`, dp is what the other degrees leave of them (nranks / (tp x pp x cp))."""
    fields = {f.name: f for f in dataclasses.fields(Layout)}
    kw: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in fields:
            raise InvalidArgument(f"layout item {part!r}", "write key=value pairs with keys among "
                                  + ", ".join(sorted(fields)))
        kind = type(getattr(Layout(), key))
        try:
            kw[key] = (value.strip().lower() in ("1", "true", "yes")) if kind is bool else kind(value.strip())
        except ValueError:
            raise InvalidArgument(f"layout item {part!r}: {value!r} is not a {kind.__name__}",
                                  f"give {key} as a {kind.__name__}") from None
    lay = Layout(**kw)
    if nranks is not None and "dp" not in kw:
        lay = lay.with_(dp=max(1, nranks // (lay.tp * lay.pp * lay.cp)))
    return lay


def model_step_compute_s(model: ModelSpec, layout: Layout, gpu: GpuSpec, software: str | None = None) -> float:
    """One GPU's compute in one optimizer step: its micro-batches' forward, backward and recomputation, averaged
    over the pipeline stages."""
    layout.check_model(model)
    eff = efficiency_for(software) if software else efficiency_for()
    per_stage = [microbatch_times(model, layout, gpu, eff, stage=i).total_s for i in range(layout.pp)]
    return layout.microbatches * statistics.fmean(per_stage)


def model_gaps(trace: dict[str, Any], step_compute_s: float,
               marker: str | None = None) -> tuple[dict[int, list[float]], list[float]]:
    """Every rank's compute gaps with each step's scaled so that the ranks' mean compute in it is
    `step_compute_s` (see the module doc); and the factor of each step."""
    if not step_compute_s > 0:
        raise InvalidArgument(f"step compute {step_compute_s} s", "the model must give a positive compute time")
    calls = timeline(trace)
    _, marks = step_marks(trace, marker)
    if not marks:
        raise InvalidArgument("the trace has no step marker (no world collective)",
                              "record a training loop that makes a collective every step, or use --compute-scale")
    own = per_rank(trace)[min(calls)]   # step_marks indexes the lowest rank's calls (waits left out)
    steps = [instance_key(own[i]) for i in marks]
    t0 = origin_ns(trace)
    gaps = {r: compute_gaps(cs, t0) for r, cs in calls.items()}
    bounds: dict[int, list[int]] = {}
    for r, cs in calls.items():
        where = {instance_key(c): i for i, c in enumerate(cs)}
        if any(k not in where for k in steps):
            raise InvalidArgument(f"rank {r} does not take part in the step marker collective",
                                  "choose a marker every rank calls (--step)")
        bounds[r] = [where[k] for k in steps] + [len(cs) - 1]   # step j: the gaps after its marker to the next's
    factors = []
    for j in range(len(steps)):
        recorded = statistics.fmean(sum(gaps[r][bounds[r][j] + 1:bounds[r][j + 1] + 1]) for r in calls)
        factors.append(step_compute_s / recorded if recorded > 0 else 1.0)
    mean_factor = statistics.fmean(factors)
    out: dict[int, list[float]] = {}
    for r, g in gaps.items():
        b = bounds[r]
        scaled = [x * mean_factor for x in g[:b[0] + 1]]
        for j, f in enumerate(factors):
            scaled += [x * f for x in g[b[j] + 1:b[j + 1] + 1]]
        out[r] = scaled
    return out, factors
