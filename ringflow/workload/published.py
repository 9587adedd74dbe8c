"""Published measurements against the current model: a fitting half, a held-out half, a few fitted constants.

The cases live in ``ringflow/data/published.yaml``: nccl-tests bus bandwidths (predicted by `ringflow.sim`) and
end-to-end training throughputs (predicted by `step_time`), each with its source and its group (one
configuration across releases, sources and siblings). `split_sets` halves them by group with a rule fixed in
code (`SPLIT_RULE`), so twins never sit on both sides.

Fitted constants, each from the fitting half only (`fit`), each a multiplicative refinement toward a median of
published / predicted of 1 over its fitting cases (the median, so that one case the model gets badly wrong does
not move a constant every other case shares):

- ``nvlink_eff``: achievable fraction of the NVLink line rate (simulator ``link_efficiency['nvlink']``), from the
  collectives inside one NVLink domain;
- ``net_eff``: achievable fraction of the NIC line rate (``link_efficiency['ib']`` and ``['ethernet']``), from the
  collectives across servers;
- ``nvls_reduce_gflops``: the in-switch reduction rate of one NVSwitch chip (simulator ``nvls_reduce_gflops``),
  from the NVLS collectives that rate bounds (NVSwitch gen 4, whose rate is not published); the nvlink_eff fit
  leaves those cases out, since the links do not pace them;
- ``sustained[gpu]``: per GPU model, the SM clock its tensor cores hold through a training run over the clock the
  compute model's rates assume (datasheet peaks, tables timed in short bursts at the default power limit):
  `compute.GpuSpec.at_clock` scales its tensor peaks and exponential rate, HBM bandwidth unchanged. Fitted on the
  dense training runs on that GPU of every stack the compute model describes by its kernels (a case naming its
  kernel profile, and the `REFERENCE_KERNEL_ERAS` whose kernels are the reference profile's), so one figure per
  GPU serves every such stack; a measured sustained clock would replace it;
- ``software[era]``: a GEMM-efficiency multiplier (`EfficiencyModel.software_factor`) for a training software era
  the compute model has no kernel profile of (`stack_factor_era`), from that era's training cases, on top of its
  GPU's ``sustained`` figure.

A case the model cannot express (a missing preset, model or layout feature) gets status "not expressible: ..."
and stays in the report.
"""
from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InvalidArgument
from ..sim.references import DATA_PATH, NotExpressible, build_topology, read_registry

if TYPE_CHECKING:
    from .compute import GpuSpec

KINDS = ("collective", "training")
SETS = ("fit", "held_out")
METRICS = ("busbw_GBps", "tokens_per_s_per_gpu", "tflops_per_gpu", "hw_tflops_per_gpu", "mfu")
CHOOSERS = ("sim", "nccl")
COLLECTIVE_ROUNDS = 3   # refinement steps of the link efficiencies
TRAINING_ROUNDS = 5     # refinement steps of each GPU's and era's factor (its effect on throughput is sublinear)
# software eras whose kernels are the compute model's reference profile (kernels.REFERENCE, Megatron-Core with
# Transformer Engine): described by that profile, they take no per-stack factor
REFERENCE_KERNEL_ERAS = ("megatron-core-2025",)


@dataclass
class Constants:
    """The fitted constants and the fitting cases each came from."""

    nvlink_eff: float
    net_eff: float
    software: dict[str, float] = field(default_factory=dict)
    nvls_reduce_gflops: float = 0.0   # 0: the hardware catalog's per-generation figure
    fitted_on: dict[str, list[str]] = field(default_factory=dict)
    chooser: str = "sim"   # collectives without a forced algorithm: the simulator's choice, or NCCL's ("nccl")
    eff_max: float = field(default_factory=lambda: _library_curve()["eff_max"])   # compute curve (compute.py)
    d_half: float = field(default_factory=lambda: _library_curve()["d_half"])
    n_half: float = field(default_factory=lambda: _library_curve()["n_half"])
    dispatch_eps: dict[str, float] = field(default_factory=dict)   # MoE dispatcher kind -> routed elements/s
    dispatch_host_s: dict[str, float] = field(default_factory=dict)   # ... -> host s per MoE layer forward
    sustained: dict[str, float] = field(default_factory=dict)   # GPU model -> sustained SM clock ratio in training

    @classmethod
    def defaults(cls, chooser: str = "sim") -> Constants:
        """The library's own values (simulator link efficiencies, software factor 1, the shipped compute curve)."""
        from ..sim.params import DEFAULT_LINK_EFFICIENCY
        if chooser not in CHOOSERS:
            raise InvalidArgument(f"chooser {chooser!r}", f"use one of {', '.join(CHOOSERS)}")
        return cls(DEFAULT_LINK_EFFICIENCY["nvlink"], DEFAULT_LINK_EFFICIENCY["ib"], chooser=chooser)

    def sim_overrides(self) -> dict[str, Any]:
        """Simulator parameter overrides carrying the link efficiencies."""
        out: dict[str, Any] = {"link_efficiency": {"nvlink": self.nvlink_eff, "ib": self.net_eff,
                                                   "ethernet": self.net_eff}}
        if self.nvls_reduce_gflops:
            out["nvls_reduce_gflops"] = self.nvls_reduce_gflops
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values and fitting sets."""
        return {"nvlink_eff": self.nvlink_eff, "net_eff": self.net_eff, "software": dict(self.software),
                "nvls_reduce_gflops": self.nvls_reduce_gflops, "eff_max": self.eff_max, "d_half": self.d_half,
                "n_half": self.n_half, "fitted_on": {k: list(v) for k, v in self.fitted_on.items()},
                "chooser": self.chooser, "dispatch_eps": dict(self.dispatch_eps),
                "dispatch_host_s": dict(self.dispatch_host_s), "sustained": dict(self.sustained)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Constants:
        """The constants `to_dict` wrote."""
        return cls(d["nvlink_eff"], d["net_eff"], dict(d.get("software") or {}), d.get("nvls_reduce_gflops", 0.0),
                   {k: list(v) for k, v in (d.get("fitted_on") or {}).items()}, d.get("chooser", "sim"),
                   d["eff_max"], d["d_half"], d["n_half"], dict(d.get("dispatch_eps") or {}),
                   dict(d.get("dispatch_host_s") or {}), dict(d.get("sustained") or {}))


def _library_curve() -> dict[str, float]:
    """The compute curve `EfficiencyModel` ships with (read from the fitted-constants file)."""
    from .compute import EfficiencyModel
    e = EfficiencyModel()
    return {"eff_max": e.eff_max, "d_half": e.d_half, "n_half": e.n_half}


@dataclass(frozen=True)
class Prediction:
    """A predicted value (None when not expressible), its status and what produced it."""

    value: float | None
    status: str = "ok"
    info: dict[str, Any] = field(default_factory=dict)


# ---- data ------------------------------------------------------------------------------------------------------
def load_cases(path: str | Path | None = None) -> list[dict[str, Any]]:
    """Read and check the published cases (default: the packaged file)."""
    p = Path(path) if path else DATA_PATH
    cases = read_registry(p)["cases"]
    seen: set[str] = set()
    for c in cases:
        _check_case(c, p)
        if c["id"] in seen:
            raise ConfigError(f"{p}: case id {c['id']!r} appears twice", "give every case its own id")
        seen.add(c["id"])
    wrong = [f"{c['id']} ({c['set']}, the rule says {want})" for c, want in
             ((c, split_sets(cases)[c["id"]]) for c in cases) if c["set"] != want]
    if wrong:
        raise ConfigError(f"{p}: cases whose set is not the split rule's: {', '.join(wrong)}",
                          f"set each case as the rule says ({SPLIT_RULE})")
    return cases


def _check_case(c: Any, p: Path) -> None:
    cid = c.get("id") if isinstance(c, dict) else None
    if not cid:
        raise ConfigError(f"{p}: a case without an id", "every case needs 'id'")
    bad = [k for k, ok in (("kind", c.get("kind") in KINDS), ("set", c.get("set") in SETS),
                           ("group", isinstance(c.get("group"), str) and bool(c.get("group"))),
                           ("metric", c.get("metric") in METRICS), ("generation", bool(c.get("generation"))),
                           ("topology", isinstance(c.get("topology"), dict)),
                           ("source.url", str((c.get("source") or {}).get("url", "")).startswith("http")))
           if not ok]
    value = c.get("value")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        bad.append("value")
    if c.get("kind") == "collective" and not isinstance(c.get("collective"), dict):
        bad.append("collective")
    if c.get("kind") == "training":
        bad += [k for k in ("model", "gpus", "era") if not c.get(k)]
    from .kernels import PROFILES
    if "kernels" in c and (c["kernels"] not in PROFILES or not c.get("kernels_source")):
        bad.append("kernels (a profile of ringflow.workload.kernels.PROFILES, with kernels_source)")
    hbm = c.get("hbm_GBps")
    if "hbm_GBps" in c and (not isinstance(hbm, (int, float)) or isinstance(hbm, bool) or not hbm > 0):
        bad.append("hbm_GBps")
    cap = c.get("hbm_GB")
    if "hbm_GB" in c and (not isinstance(cap, (int, float)) or isinstance(cap, bool) or not cap > 0
                          or not c.get("hbm_source")):
        bad.append("hbm_GB (the GPU memory in GB, with hbm_source)")
    peak = c.get("peak_tflops")
    if "peak_tflops" in c and not (isinstance(peak, dict) and set(peak) <= {"bf16", "fp8"} and "bf16" in peak and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in peak.values())
            and c.get("peak_source")):
        bad.append("peak_tflops ({bf16: dense TFLOP/s, fp8: ...}, with peak_source)")
    watts = c.get("power_limit_W")
    if "power_limit_W" in c and (not isinstance(watts, (int, float)) or isinstance(watts, bool) or not watts > 0
                                 or not c.get("power_source")):
        bad.append("power_limit_W (the board power limit the run held, in W, with power_source)")
    if bad:
        raise ConfigError(f"{p}: case {cid!r}: missing or invalid {', '.join(bad)}",
                          f"kind in {KINDS}, set in {SETS}, a group name, metric in {METRICS}, a positive value, "
                          "a source URL")


SPLIT_SALT = "ringflow-published-split-v1"
SPLIT_RULE = ("by group, never per case: a group holding a case that sets a library default (sets_default) is a "
              "fitting group; any other group is held out when the first byte of sha256('" + SPLIT_SALT +
              ":' + group) is odd, and fitting when it is even")


def group_set(group: str, sets_default: bool = False) -> str:
    """The set ('fit' or 'held_out') of every case of `group` (`SPLIT_RULE`)."""
    if sets_default:
        return "fit"
    return SETS[hashlib.sha256(f"{SPLIT_SALT}:{group}".encode()).digest()[0] % 2]


def split_sets(cases: list[dict[str, Any]]) -> dict[str, str]:
    """Each case's set by the split rule (`SPLIT_RULE`): decided per group, so twins (one configuration across
    releases, sources, sizes, GPU or node counts) are never on both sides."""
    anchored = {c["group"] for c in cases if c.get("sets_default")}
    return {c["id"]: group_set(c["group"], c["group"] in anchored) for c in cases}


# ---- predictions -----------------------------------------------------------------------------------------------
def predict(case: dict[str, Any], consts: Constants) -> Prediction:
    """Predict one case with the current model and `consts`; status says why when it cannot."""
    try:
        if case["kind"] == "collective":
            return _predict_collective(case, consts)
        return _predict_training(case, consts)
    except NotExpressible as exc:
        return Prediction(None, f"not expressible: {exc}")
    except (InvalidArgument, NotImplementedError) as exc:
        return Prediction(None, f"not expressible: {exc}")
    except Exception as exc:  # noqa: BLE001 - a fault in the model is reported with the case, not fatal to the run
        return Prediction(None, f"model error: {type(exc).__name__}: {exc}")


def _predict_collective(case: dict[str, Any], consts: Constants) -> Prediction:
    from ..sim.api import simulate
    topo, note = build_topology(case["topology"])
    c = case["collective"]
    eps = [topo.gpus(h)[0] for h in topo.hosts()] if c.get("endpoints") == "gpu0" else None
    link = "nvlink" if len(topo.hosts()) == 1 else "net"
    if c["collective"] == "all_to_all":   # point-to-point sends, no ring: predicted from the links, not fitted on
        link = "all_to_all"
    # NCCL tunes no all-to-all (it runs grouped sends, PXN across servers): the simulator's default is that path
    if c.get("algorithm") is None and consts.chooser == "nccl" and c["collective"] != "all_to_all":
        busbw, algo = _nccl_busbw(topo, c, eps, consts)
        return Prediction(busbw, "ok", {"algorithm": algo, "link_class": link, "note": note,
                                        "gpus": _collective_gpus(topo, c, eps)})
    if c.get("algorithm") == "tree" and len(topo.hosts()) > 1 and c["collective"] != "all_reduce":
        raise NotExpressible("NCCL's tree runs all_reduce only")
    # NCCL_ALGO=Tree across servers runs NCCL's trees and the switch algorithms their tables (sim.simulate)
    res = simulate(topo, c["collective"], int(c["size_bytes"]), algorithm=c.get("algorithm"),
                   nranks=c.get("nranks"), endpoints=eps, params=consts.sim_overrides())
    if res.bound == "nvls_reduce":
        link = res.bound
    return Prediction(float(res.busbw_GBps), "ok", {"algorithm": f"{res.algorithm}/{res.protocol}",
                                                    "link_class": link, "note": note,
                                                    "gpus": _collective_gpus(topo, c, eps)})


def _collective_gpus(topo: Any, c: dict[str, Any], eps: list[str] | None) -> int:
    return int(c.get("nranks") or (len(eps) if eps else len(topo.endpoints())))


def _nccl_busbw(topo: Any, c: dict[str, Any], eps: list[str] | None, consts: Constants) -> tuple[float, str]:
    """Bus bandwidth of NCCL's own choice (`ringflow sim --nccl`): simulated when the simulator runs that
    algorithm, else NCCL's tuning model's figure."""
    from ..sim.nccl_tuner import nccl_rows
    from ..sim.params import params_for
    from ..sim.results import busbw_factor
    size = int(c["size_bytes"])
    n = c.get("nranks") or (len(eps) if eps else len(topo.endpoints()))
    tuned = nccl_rows(topo, c["collective"], [size], n, params=params_for(topo, consts.sim_overrides()),
                      endpoints=eps)[0]
    algo = f"nccl: {tuned['algorithm']}/{tuned['protocol']}"
    if tuned.get("sim_time_us"):
        return size / (tuned["sim_time_us"] * 1e3) * busbw_factor(c["collective"], n), algo + " (simulated)"
    return float(tuned["busbw_GBps"]), algo + " (NCCL model)"


def _predict_training(case: dict[str, Any], consts: Constants) -> Prediction:
    from .commmodel import AlphaBetaModel
    from .compute import EfficiencyModel, gpu_of_topology, in_training
    from .layout import Layout
    from .memory_cases import case_gpu
    from .models import load_model
    from .steptime import step_time
    if not case.get("layout"):
        raise NotExpressible("the parallel layout is not in the cited text")
    model = load_model(case["model"])
    gpus = int(case["gpus"])
    lay = dict(case["layout"])
    per_replica = lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1)
    if gpus % per_replica:
        raise NotExpressible(f"{gpus} GPUs not a multiple of tp x pp x cp = {per_replica}")
    try:
        layout = Layout(dp=gpus // per_replica, **lay)
    except TypeError as exc:
        raise NotExpressible(f"layout field not supported ({exc})") from None
    topo, note = build_topology(case["topology"], gpus)
    era = stack_factor_era(case)
    eff = replace(EfficiencyModel(), eff_max=consts.eff_max, d_half=consts.d_half, n_half=consts.n_half,
                  software_factor=consts.software.get(era, 1.0) if era else 1.0,
                  kernels=case.get("kernels") or EfficiencyModel().kernels,
                  fp8_recipe=case.get("fp8_recipe") or EfficiencyModel().fp8_recipe,
                  alltoall_dispatch_eps=consts.dispatch_eps.get("alltoall", 0.0),
                  flex_dispatch_eps=consts.dispatch_eps.get("flex", 0.0),
                  alltoall_host_s=consts.dispatch_host_s.get("alltoall", 0.0),
                  flex_host_s=consts.dispatch_host_s.get("flex", 0.0))
    gpu = in_training(case_gpu(case, gpu_of_topology(topo)), consts.sustained)
    r = step_time(model, layout, topo, gpu=gpu, comm=AlphaBetaModel(sim_overrides=consts.sim_overrides()),
                  eff=eff)
    values = {"tokens_per_s_per_gpu": r.tokens_per_s / gpus, "tflops_per_gpu": r.tflops_per_gpu,
              "hw_tflops_per_gpu": r.hw_tflops_per_gpu, "mfu": r.mfu}
    return Prediction(float(values[case["metric"]]), "ok", {"note": note, "gpu": r.gpu, "mfu": r.mfu,
                                                            **run_memory(case, gpu)})


def run_memory(case: dict[str, Any], gpu: GpuSpec | None = None) -> dict[str, Any]:
    """Memory per GPU of a training case under the settings its run states (`memory_cases.case_memory`, not the
    library's defaults): whether it fits, the predicted peak and the GPU's capacity in GiB."""
    from .memory_cases import GIB, case_memory
    m = case_memory(case, gpu)
    return {"fits_in_memory": m.fits, "memory_gib": m.total_bytes / GIB, "capacity_gib": m.capacity_bytes / GIB}


# ---- fitting ---------------------------------------------------------------------------------------------------
Predictor = Callable[[dict[str, Any], Constants], Prediction]


def _centre(ratios: list[float]) -> float:
    """The median of published / predicted: one far-off fitting case (a model gap, not noise) cannot drag a
    constant that every other case shares."""
    return statistics.median(ratios)


def fit(cases: list[dict[str, Any]], predictor: Predictor = predict, chooser: str = "sim") -> Constants:
    """Fit the constants on the cases marked ``set: fit`` (the held-out cases are never read); all-to-all cases
    (point-to-point sends, no ring) are predicted from the link efficiencies the other collectives fit, not fitted
    on."""
    fit_cases = [c for c in cases if c["set"] == "fit"]
    consts = Constants.defaults(chooser)
    colls = [c for c in fit_cases if c["kind"] == "collective"]
    for _ in range(COLLECTIVE_ROUNDS if colls else 0):
        ratios: dict[str, list[float]] = {"nvlink": [], "net": [], "nvls_reduce": []}
        used: dict[str, list[str]] = {"nvlink": [], "net": [], "nvls_reduce": []}
        for c in colls:
            pr = predictor(c, consts)
            cls = pr.info.get("link_class", "nvlink")
            if pr.value is not None and pr.value > 0 and cls in ratios:
                ratios[cls].append(c["value"] / pr.value)
                used[cls].append(c["id"])
        for cls, attr in (("nvlink", "nvlink_eff"), ("net", "net_eff")):
            if ratios[cls]:
                setattr(consts, attr, min(1.0, getattr(consts, attr) * _centre(ratios[cls])))
                consts.fitted_on[attr] = used[cls]
        if ratios["nvls_reduce"]:
            consts.nvls_reduce_gflops = (consts.nvls_reduce_gflops or _catalog_reduce_gflops()) * \
                _centre(ratios["nvls_reduce"])
            consts.fitted_on["nvls_reduce_gflops"] = sorted(set(consts.fitted_on.get("nvls_reduce_gflops", [])
                                                                + used["nvls_reduce"]))
    from .fitting import REFERENCE_ERA, fit_compute_curve
    fit_compute_curve(fit_cases, consts, predictor)
    # dense runs set the GPUs' and stacks' factors; MoE runs set the dispatcher rates below (their own mechanism)
    training = [c for c in fit_cases if c["kind"] == "training" and c["era"] != REFERENCE_ERA]
    described = [c for c in training if not stack_factor_era(c) and not is_moe_case(c)]
    on: dict[str, list[dict[str, Any]]] = {}
    for c in described:
        on.setdefault(_case_gpu_name(c), []).append(c)
    for gpu, mine in sorted(on.items()):
        _refine(consts.sustained, gpu, mine, consts, predictor, f"sustained[{gpu}]", 1.0)
    for era in sorted({e for c in training if (e := stack_factor_era(c))}):
        ours = [c for c in training if stack_factor_era(c) == era]
        _refine(consts.software, era, [c for c in ours if not is_moe_case(c)] or ours, consts, predictor,
                f"software[{era}]", 1.0 / consts.eff_max)
    from .moe_fit import fit_dispatchers
    fit_dispatchers(fit_cases, consts, predictor)
    return consts


def _refine(table: dict[str, float], key: str, cases: list[dict[str, Any]], consts: Constants, predictor: Predictor,
            name: str, most: float) -> None:
    """Move table[key] (a multiplier, 1 when absent) toward a median published / predicted of 1 over `cases`,
    in TRAINING_ROUNDS steps capped at `most`; record the cases it used as `name`."""
    for _ in range(TRAINING_ROUNDS):
        got = [(c, predictor(c, consts)) for c in cases]
        ok = [(c, pr) for c, pr in got if pr.value is not None and pr.value > 0]
        if not ok:
            return
        table[key] = min(table.get(key, 1.0) * _centre([c["value"] / pr.value for c, pr in ok]), most)
        consts.fitted_on[name] = [c["id"] for c, _ in ok]


def stack_factor_era(case: dict[str, Any]) -> str | None:
    """The software era whose fitted factor a training case takes, or None: the compute model describes its
    stack's kernels (the case names its kernel profile, or its era's kernels are the reference profile's) or it
    belongs to the reference era of the compute curve."""
    from .fitting import REFERENCE_ERA
    era = case.get("era")
    if case.get("kernels") or era in REFERENCE_KERNEL_ERAS or era == REFERENCE_ERA:
        return None
    return era


def _case_gpu_name(case: dict[str, Any]) -> str:
    """The catalog name of the GPU a training case ran on (its topology preset's)."""
    from .compute import gpu_of_topology
    topo, _ = build_topology(case["topology"], int(case["gpus"]))
    return gpu_of_topology(topo).name


def is_moe_case(case: dict[str, Any]) -> bool:
    """Whether a training case runs a mixture-of-experts model with expert parallelism."""
    from .models import load_model
    return case.get("kind") == "training" and int((case.get("layout") or {}).get("ep", 1)) > 1 and \
        load_model(case["model"]).is_moe


def _catalog_reduce_gflops() -> float:
    """The catalog's NVSwitch gen-4 reduction rate (the generation whose rate bounds NVLS in the cases)."""
    from ..hardware.nvlink import NVSWITCH_REDUCE_GFLOPS
    return NVSWITCH_REDUCE_GFLOPS[4]


# ---- evaluation ------------------------------------------------------------------------------------------------
def evaluate(path: str | Path | None = None, cases: list[dict[str, Any]] | None = None,
             predictor: Predictor = predict, chooser: str = "sim", refit: bool | None = None) -> dict[str, Any]:
    """Predict every case with constants fitted on the fitting half and summarise the errors per set, GPU
    generation, framework and scale; the same statistics with the simulator's defaults and no per-stack factor
    show what those fitted constants buy. The packaged registry uses the stored constants
    (``ringflow/data/fitted.json``, refused when its fitting cases changed since); other data, another chooser or
    `refit` fit again. `chooser` 'nccl' gives collectives without a forced algorithm NCCL's own choice."""
    from . import fitting
    packaged = cases is None and (path is None or Path(path).resolve() == DATA_PATH)
    cases = cases if cases is not None else load_cases(path)
    if refit is None:
        refit = not (packaged and chooser == "sim" and predictor is predict)
    consts = fit(cases, predictor, chooser) if refit else fitting.stored_constants(cases)
    rows = [row(c, predictor(c, consts)) for c in cases]
    plain = [row(c, predictor(c, replace(Constants.defaults(chooser), eff_max=consts.eff_max,
                                          d_half=consts.d_half, n_half=consts.n_half))) for c in cases]
    changes = fitting.release_changes(cases) if packaged else {"tag": None, "changed": [], "new": [], "removed": []}
    return {"constants": consts.to_dict(), "rows": rows, "summary": summarize(rows), "targets": targets(rows),
            "unfitted": {s: _stats([r for r in plain if r["set"] == s]) for s in SETS},
            "manifest": _manifest(cases, consts, refit, changes), "split_rule": SPLIT_RULE,
            "library_curve": _library_curve(), "memory_measured": _memory_measured(),
            "data": str(path or DATA_PATH)}


def _memory_measured() -> list[dict[str, Any]]:
    """Published peak-memory readings against the memory model (`memory_cases.measured_memory`), in GiB."""
    from .memory_cases import GIB, measured_memory
    return [{"id": m.id, "published_gib": m.published_bytes / GIB, "predicted_gib": m.predicted_bytes / GIB,
             "error": m.error, "source": m.source} for m in measured_memory()]


def _manifest(cases: list[dict[str, Any]], consts: Constants, refit: bool, changes: dict[str, Any]) -> dict[str, Any]:
    from . import fitting
    held = {c["id"] for c in cases if c["set"] == "held_out"}
    leaks = {k: sorted(held & set(v)) for k, v in consts.fitted_on.items() if held & set(v)}
    return {"split_rule": SPLIT_RULE, "reference_era": fitting.REFERENCE_ERA,
            "constants": {k: v for k, v in consts.to_dict().items() if k not in ("fitted_on", "chooser")},
            "fitted_on": {k: list(v) for k, v in consts.fitted_on.items()},
            "not_fitted": [p for p in fitting.CURVE_PARAMS if f"compute.{p}" not in consts.fitted_on],
            "held_out_in_a_fit": leaks,
            "counts": {s: {"cases": sum(c["set"] == s for c in cases),
                           "groups": len({c["group"] for c in cases if c["set"] == s})} for s in SETS},
            "refit": refit, "fitted_file": None if refit else str(fitting.FITTED_PATH), "release": changes}


def row(c: dict[str, Any], pr: Prediction) -> dict[str, Any]:
    """The report row of case `c` predicted as `pr`: signed error, set, breakdown keys, memory fit."""
    err = pr.value / c["value"] - 1.0 if pr.value is not None else None
    topo = c.get("topology") or {}
    one_server = c["kind"] == "collective" and pr.info.get("link_class") in ("nvlink", "nvls_reduce") \
        and not topo.get("nodes")
    gpus = int(c.get("gpus") or pr.info.get("gpus") or 0)
    return {"id": c["id"], "group": c["group"], "kind": c["kind"], "generation": c["generation"],
            "era": c.get("era", ""), "framework": c.get("era") or "nccl", "kernels": c.get("kernels", ""),
            "gpus": gpus, "scale": scale_of(gpus),
            "set": c["set"], "metric": c["metric"], "published": float(c["value"]), "predicted": pr.value,
            "error": err, "status": pr.status, "system": c.get("system", ""), "url": c["source"]["url"],
            "where": c["source"].get("where", ""), "one_server": one_server, "assumed": c.get("assumed", ""),
            "standin": pr.info.get("note", ""), "note": c.get("note", ""),
            "algorithm": pr.info.get("algorithm", ""), "fits_in_memory": pr.info.get("fits_in_memory"),
            "memory_gib": pr.info.get("memory_gib"), "capacity_gib": pr.info.get("capacity_gib")}


SCALES = ((8, "1-8 GPUs"), (72, "9-72 GPUs"), (512, "73-512 GPUs"), (2048, "513-2048 GPUs"),
          (10**9, "over 2048 GPUs"))


def scale_of(gpus: int) -> str:
    """The scale bucket of a case by its GPU count ('' when unknown)."""
    return next(label for top, label in SCALES if gpus <= top) if gpus else ""


def _stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [r["error"] for r in rows if r["error"] is not None]
    if not errs:
        return {"n": 0, "not_expressible": len(rows)}
    worst = max((r for r in rows if r["error"] is not None), key=lambda r: abs(r["error"]))
    return {"n": len(errs), "not_expressible": len(rows) - len(errs), "mae": sum(abs(e) for e in errs) / len(errs),
            "mean_signed": sum(errs) / len(errs), "max_abs": abs(worst["error"]), "worst": worst["id"],
            "optimistic": sum(e > 0 for e in errs), "pessimistic": sum(e < 0 for e in errs)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Error statistics per set; per set x kind x generation; per set and GPU generation, framework, scale."""
    out: dict[str, Any] = {}
    for s in SETS:
        mine = [r for r in rows if r["set"] == s]
        groups = sorted({(r["kind"], r["generation"]) for r in mine})
        out[s] = {"all": _stats(mine),
                  "groups": [{"kind": k, "generation": g, **_stats([r for r in mine if (r["kind"], r["generation"])
                                                                    == (k, g)])} for k, g in groups],
                  "by": {dim: [{dim: v, **_stats([r for r in mine if r[dim] == v])}
                               for v in sorted({r[dim] for r in mine}, key=_order(dim))] for dim in BREAKDOWNS}}
    return out


BREAKDOWNS = ("generation", "framework", "scale")


def _order(dim: str) -> Callable[[str], Any]:
    if dim == "scale":
        labels = [label for _, label in SCALES]
        return lambda v: labels.index(v) if v in labels else len(labels)
    return lambda v: v


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The validation targets and whether this run meets them (held-out MAE <= 7 %, every held-out case within
    15 %, every one-server collective within 5 %, every published training run fits in memory)."""
    held = [r for r in rows if r["set"] == "held_out" and r["error"] is not None]
    mae = sum(abs(r["error"]) for r in held) / len(held) if held else float("nan")
    over15 = [r["id"] for r in held if abs(r["error"]) > 0.15]
    one = [r for r in rows if r["one_server"] and r["error"] is not None]
    over5 = [r["id"] for r in one if abs(r["error"]) > 0.05]
    return [{"target": "held-out MAE <= 7 %", "value": f"{mae:.1%}", "met": mae <= 0.07, "cases": []},
            {"target": "every held-out case within 15 %", "value": f"{len(held) - len(over15)} of {len(held)}",
             "met": not over15, "cases": over15},
            {"target": "one-server collectives within 5 % (both sets)", "value": f"{len(one) - len(over5)} of "
             f"{len(one)}", "met": not over5, "cases": over5},
            memory_target(rows)]


def memory_target(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every training run a source published fits in the memory model under its stated settings (both sets)."""
    ran = [r for r in rows if r.get("fits_in_memory") is not None]
    out = [r["id"] for r in ran if not r["fits_in_memory"]]
    return {"target": "every published training run fits in memory (both sets)",
            "value": f"{len(ran) - len(out)} of {len(ran)} fit ({len(out)} 'does not fit')", "met": not out,
            "cases": out}
