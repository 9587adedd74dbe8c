"""The markdown validation report (`docs/validation.md`): written whole from one validation's results."""
from __future__ import annotations

import os

from ..units import format_size
from .features import host_cores
from .model import PARAM_MEANINGS, HostCostModel


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ('unknown' elsewhere)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def render(results: dict, models: dict[str, HostCostModel], command: str, model_path: str,
           calibration_meta: dict | None = None) -> str:
    """The report's markdown."""
    meta = calibration_meta or {}
    lines = ["# Host cost model: out-of-sample validation", "",
             f"Produced by `{command}` with the model `{model_path}`"
             + (f" (calibrated by `{meta['command']}`)" if meta.get("command") else "") + ".", "",
             f"Machine: {cpu_model()}, {host_cores()} cores usable by this process, "
             f"caches: {format_size(next(iter(models.values())).caches.private_bytes)} private, "
             f"{format_size(next(iter(models.values())).caches.shared_bytes)} shared.", ""]
    if meta.get("measure_s"):
        loads = ", ".join(f"{j['transport']} {j['nranks']} ranks {j['load']['foreign_fraction']:.0%}"
                          for j in meta.get("jobs", []) if j.get("load"))
        lines += [f"Calibration: ranks {meta.get('ranks')}, sizes {format_size(min(meta['sizes']))} .. "
                  f"{format_size(max(meta['sizes']))}, measured in {meta['measure_s']:.0f} s"
                  + (f"; other processes' share of the cores during its jobs: {loads}" if loads else "")
                  + ".", ""]
    lines += ["## Accuracy", "",
              f"`ringflow bench` (the runtime's default schedules) at {results['ranks']} ranks, collectives "
              f"{', '.join(results['collectives'])}, sizes {', '.join(format_size(s) for s in results['sizes'])}; "
              f"each configuration measured in {results['bench_jobs_per_config']} separate jobs a sweep apart, "
              "compared with their mean (with the quiet ones' where a job still ran beside other processes' work "
              "after waiting for a quiet host and two more attempts). Error: |predicted - measured| / measured. "
              "Noise floor: the share of sizes where the two jobs disagreed with each other by more than the "
              "model's error there. Rank counts not calibrated are marked; ranks above the core count share "
              "cores.", ""]
    for tr in models:
        lines += [f"### {tr}", "", "| ranks | calibrated | sizes | median error | p90 error | noise floor | "
                  "median job spread | rows with a busy job |", "|---:|:---:|---:|---:|---:|---:|---:|---:|"]
        for s in results["summary"]:
            if s["transport"] != tr:
                continue
            lines.append(f"| {s['nranks']} | {'yes' if s['calibrated'] else 'no'} | {s['n']} | {_pct(s['median'])} | "
                         f"{_pct(s['p90'])} | {_pct(s['noise_floor'])} | {_pct(s['median_spread'])} | "
                         f"{s['busy_rows']} |")
        lines.append("")
    cs = results["choice_summary"]
    lines += ["## Tuner choice", "",
              "Where the model picks another of the tuner's candidates than the flat choice (a predicted gain "
              "beyond the model's margin), both schedules were timed in one job, interleaved over "
              "several passes.", ""]
    if cs["switched"]:
        lines += [f"The model switched on {cs['switched']} calls; its choice was at least as fast on "
                  f"{cs['at_least_as_fast']} ({_pct(cs['share'])}).", "",
                  "| transport | ranks | collective | size | flat | model | flat (us) | model (us) |",
                  "|---|---:|---|---:|---|---|---:|---:|"]
        for c in results["choice"]:
            lines.append(f"| {c['transport']} | {c['nranks']} | {c['collective']} | {format_size(c['size_bytes'])} | "
                         f"{c['flat']} | {c['model']} | {c['flat_us']:.1f} | {c['model_us']:.1f} |")
    else:
        lines.append("The model kept the flat choice on every call validated (no predicted gain beyond its margin).")
    lines += ["", "## Parameters", "", "| parameter | meaning | " + " | ".join(models) + " |",
              "|---|---|" + "---:|" * len(models)]
    for name, meaning in PARAM_MEANINGS.items():
        lines.append(f"| `{name}` | {meaning} | " + " | ".join(f"{getattr(m.params, name):.4g}"
                                                              for m in models.values()) + " |")
    lines.append("| margin | 1 + p90 of the cross-validated relative error | "
                 + " | ".join(f"{m.margin:.3f}" for m in models.values()) + " |")
    lines.append("| fit | in-sample median / p90, cross-validated median / p90 | " + " | ".join(
        f"{_pct(m.fit_stats.get('in_sample_median'))} / {_pct(m.fit_stats.get('in_sample_p90'))}, "
        f"{_pct(m.fit_stats.get('cv_median'))} / {_pct(m.fit_stats.get('cv_p90'))}" for m in models.values()) + " |")
    busy = [j for j in results["jobs"] if j["load"] and j["load"]["foreign_fraction"] >= 0.1]
    lines += ["", "## Host load", "",
              f"{len(busy)} of {len(results['jobs'])} bench jobs ran while other processes used 10 % or more of "
              "the cores (their times include that work)"
              + (": " + ", ".join(f"{j['transport']} {j['nranks']} ranks {j['load']['foreign_fraction']:.0%}"
                                  for j in busy) if busy else "") + ".",
              f"Validation took {results['duration_s']:.0f} s.", ""]
    return "\n".join(lines)


def write_report(path: str, results: dict, models: dict[str, HostCostModel], command: str, model_path: str,
                 calibration_meta: dict | None = None) -> None:
    """Write (replace) the markdown report."""
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as fh:
        fh.write(render(results, models, command, model_path, calibration_meta))
