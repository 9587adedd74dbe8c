"""Tables and the markdown report of `ringflow validate --published` (see `published.py` for the method)."""
from __future__ import annotations

import re
from typing import Any

CASE_HEADER = ["case", "group", "gen", "metric", "published", "predicted", "error", "direction", "algorithm", "status"]
GROUP_HEADER = ["set", "kind", "generation", "cases", "MAE", "max abs error", "worst", "mean signed", "not expr."]
CONST_HEADER = ["constant", "value", "library default", "fitted on (fitting set only)"]
METRIC_UNITS = {"busbw_GBps": "busbw GB/s", "tokens_per_s_per_gpu": "tokens/s/GPU", "tflops_per_gpu": "TFLOP/s/GPU",
                "hw_tflops_per_gpu": "HW TFLOP/s/GPU", "mfu": "MFU"}


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:,.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def _short(text: str) -> str:
    """A status without long parenthesised lists (the full text is in the JSON and the report's gap list)."""
    return re.sub(r" ?\([^()]{80,}\)", "", re.sub(r"\([^()]*\([^()]{60,}\)[^()]*\)", "", text)).strip()


def _direction(err: float | None) -> str:
    if err is None:
        return ""
    return "optimistic" if err > 0 else "pessimistic" if err < 0 else "exact"


def case_rows(result: dict[str, Any], which: str) -> list[list[str]]:
    """One line per case of set `which` ('fit' or 'held_out'): signed error, optimistic when predicted > published."""
    out = []
    for r in result["rows"]:
        if r["set"] != which:
            continue
        status = _short(r["status"]) if r["status"] != "ok" else ("ok, " + r["standin"] if r["standin"] else "ok")
        if r.get("fits_in_memory") is False:
            status += " (the memory model says it does not fit)"
        err = "-" if r["error"] is None else f"{r['error']:+.1%}"
        out.append([r["id"], r["group"], r["generation"], METRIC_UNITS[r["metric"]], _num(r["published"]),
                    _num(r["predicted"]), err, _direction(r["error"]), r["algorithm"], status])
    return out


def group_rows(result: dict[str, Any]) -> list[list[str]]:
    """Error statistics per set, kind and GPU generation, then per set overall."""
    out = []
    for which, s in result["summary"].items():
        for g in [*s["groups"], {"kind": "all", "generation": "all", **s["all"]}]:
            if not g.get("n"):
                out.append([which, g["kind"], g["generation"], "0", "-", "-", "-", "-", str(g["not_expressible"])])
                continue
            out.append([which, g["kind"], g["generation"], str(g["n"]), f"{g['mae']:.1%}", f"{g['max_abs']:.1%}",
                        g["worst"], f"{g['mean_signed']:+.1%}", str(g["not_expressible"])])
    return out


def constant_rows(result: dict[str, Any]) -> list[list[str]]:
    """The fitted constants, the library's defaults and the fitting cases each came from."""
    from ..hardware.nvlink import NVSWITCH_REDUCE_GFLOPS
    from ..sim.params import DEFAULT_LINK_EFFICIENCY
    c = result["constants"]
    fitted = c["fitted_on"]
    rows = [["nvlink_eff (sim link_efficiency nvlink)", f"{c['nvlink_eff']:.3f}",
             f"{DEFAULT_LINK_EFFICIENCY['nvlink']:.3f}", ", ".join(fitted.get("nvlink_eff", [])) or "not fitted"],
            ["net_eff (sim link_efficiency ib, ethernet)", f"{c['net_eff']:.3f}",
             f"{DEFAULT_LINK_EFFICIENCY['ib']:.3f}", ", ".join(fitted.get("net_eff", [])) or "not fitted"],
            ["nvls_reduce_gflops (sim nvls_reduce_gflops, per NVSwitch chip)",
             f"{c['nvls_reduce_gflops']:.0f}" if c.get("nvls_reduce_gflops") else f"{NVSWITCH_REDUCE_GFLOPS[4]:.0f} "
             "(not fitted)", f"{NVSWITCH_REDUCE_GFLOPS[4]:.0f}",
             ", ".join(fitted.get("nvls_reduce_gflops", [])) or "no fitting case bound by the switch adders"]]
    from .fitting import REFERENCE_ERA
    lib = result.get("library_curve") or {}
    for name, what in (("eff_max", "peak fraction of wide GEMMs"), ("d_half", "GEMM width at half efficiency"),
                       ("n_half", "tokens per micro-batch at half efficiency")):
        ids = fitted.get(f"compute.{name}")
        rows.append([f"compute {name} ({what})", f"{c[name]:.4g}", f"{lib[name]:.4g}" if name in lib else "-",
                     ", ".join(ids) if ids else f"not fitted: too few {REFERENCE_ERA} fitting cases "
                     "(neutral value 0)"])
    for gpu, k in sorted((c.get("sustained") or {}).items()):
        rows.append([f"sustained SM clock in training ({gpu}, of the clock its rates assume)", f"{k:.3f}", "1",
                     ", ".join(fitted.get(f"sustained[{gpu}]", []))])
    from .published import REFERENCE_KERNEL_ERAS
    eras = sorted({r["era"] for r in result["rows"] if r["era"]})
    for era in eras:
        k = c["software"].get(era)
        if era == REFERENCE_ERA:
            rows.append([f"software_factor ({era})", "1", "1", "the reference era of the compute curve: 1 by "
                         "definition"])
            continue
        if era in REFERENCE_KERNEL_ERAS:
            rows.append([f"software_factor ({era})", "none", "1", "its kernels are the compute model's reference "
                         "profile (kernels.REFERENCE), no factor"])
            continue
        if k is None and all(r.get("kernels") for r in result["rows"] if r["era"] == era):
            rows.append([f"software_factor ({era})", "none", "1", "its cases are predicted by their kernel "
                         "profiles (workload/kernels.py), no factor"])
            continue
        rows.append([f"software_factor ({era})", "1 (not fitted)" if k is None else f"{k:.3f}", "1",
                     ", ".join(fitted.get(f"software[{era}]", [])) or "no expressible fitting case"])
    from .moe import DISPATCHERS
    for kind in DISPATCHERS:
        rate = (c.get("dispatch_eps") or {}).get(kind)
        rows.append([f"MoE dispatcher rate ({kind}, G routed elements/s per GPU and pass)",
                     f"{rate / 1e9:.1f}" if rate else "0 (term left out)", "0",
                     ", ".join(fitted.get(f"dispatch_eps[{kind}]", [])) or "no MoE fitting case"])
        host = (c.get("dispatch_host_s") or {}).get(kind)
        rows.append([f"MoE host time per dropless layer forward ({kind}, ms)",
                     f"{host * 1e3:.2f}" if host else "0 (term left out)", "0",
                     ", ".join(fitted.get(f"dispatch_host_s[{kind}]", [])) or "no MoE fitting case"])
    return rows


BY_HEADER = ["set", "cases", "MAE", "max abs error", "worst", "mean signed", "optimistic", "pessimistic"]


def by_rows(result: dict[str, Any], dim: str) -> list[list[str]]:
    """Error statistics per set and value of `dim` (generation, framework or scale), with their sign."""
    out = []
    for which, s in result["summary"].items():
        for g in s["by"][dim]:
            if not g.get("n"):
                out.append([which, g[dim] or "-", "0", "-", "-", "-", "-", "-", "-"])
                continue
            out.append([which, g[dim] or "-", str(g["n"]), f"{g['mae']:.1%}", f"{g['max_abs']:.1%}", g["worst"],
                        f"{g['mean_signed']:+.1%}", str(g["optimistic"]), str(g["pessimistic"])])
    return out


def manifest_lines(result: dict[str, Any]) -> list[str]:
    """The manifest in words: split rule, counts per half, leaks (none expected), the table's release."""
    m = result["manifest"]
    cnt = m["counts"]
    rel = m["release"]
    leaks = m["held_out_in_a_fit"]
    lines = [f"- Split rule (`published.SPLIT_RULE`): {m['split_rule']}.",
             f"- Fitting half: {cnt['fit']['cases']} cases in {cnt['fit']['groups']} groups; held-out half: "
             f"{cnt['held_out']['cases']} cases in {cnt['held_out']['groups']} groups.",
             "- Constants: " + ("refitted for this run" if m["refit"] else
                                "as stored in `ringflow/data/fitted.json` by `python -m ringflow.workload.fitting`, "
                                "whose fitting cases match the registry's fitting half") +
             "; held-out cases used by any fit: " + ("none" if not leaks else
                                                     "; ".join(f"{k}: {', '.join(v)}" for k, v in leaks.items())) + "."]
    if rel.get("tag"):
        changed = rel["changed"]
        lines.append(f"- Held-out cases changed since release {rel['tag']} of the table: {len(changed)}"
                     + (f" ({', '.join(changed)})" if changed else "") + f"; added since: {len(rel['new'])}"
                     + (f" ({', '.join(rel['new'])})" if rel["new"] else "") + f"; removed: {len(rel['removed'])}.")
    return lines + [""]


def compare_rows(result: dict[str, Any]) -> list[list[str]]:
    """Fitted constants against the library's defaults (nothing fitted), per set."""
    out = []
    for which in ("fit", "held_out"):
        for label, st in (("fitted", result["summary"][which]["all"]), ("simulator defaults, factors 1",
                                                                          result["unfitted"][which])):
            out.append([which, label, str(st.get("n", 0)), f"{st['mae']:.1%}" if st.get("n") else "-",
                        f"{st['max_abs']:.1%}" if st.get("n") else "-",
                        f"{st['mean_signed']:+.1%}" if st.get("n") else "-"])
    return out


COMPARE_HEADER = ["set", "constants", "cases", "MAE", "max abs error", "mean signed"]


def target_rows(result: dict[str, Any]) -> list[list[str]]:
    """Each target, this run's figure, met or missed, and the cases that miss it."""
    return [[t["target"], t["value"], "met" if t["met"] else "missed", ", ".join(t["cases"])]
            for t in result["targets"]]


def not_expressible(result: dict[str, Any]) -> list[list[str]]:
    """The cases the model cannot describe yet (or fails on) and what is missing."""
    return [[r["id"], r["set"], _short(r["status"].removeprefix("not expressible: "))]
            for r in result["rows"] if r["status"] != "ok"]


def memory_rows(result: dict[str, Any]) -> list[list[str]]:
    """Predicted memory per GPU of every training case that ran, under its run's stated settings."""
    return [[r["id"], r["set"], f"{r['memory_gib']:.1f}", f"{r['capacity_gib']:.1f}",
             "fits" if r["fits_in_memory"] else "does not fit"]
            for r in result["rows"] if r.get("memory_gib") is not None]


def measured_memory_rows(result: dict[str, Any]) -> list[list[str]]:
    """Published peak-memory readings against the prediction for the same layout and settings."""
    return [[m["id"], f"{m['published_gib']:.1f}", f"{m['predicted_gib']:.1f}", f"{m['error']:+.1%}", m["source"]]
            for m in result.get("memory_measured") or []]


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    def esc(x: str) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(esc(x) for x in r) + " |" for r in rows), ""]


def markdown(result: dict[str, Any], command: str) -> str:
    """The report: method, fitted constants, both sets' tables, per-generation summary, targets, gaps, sources."""
    n = len(result["rows"])
    n_fit = sum(r["set"] == "fit" for r in result["rows"])
    lines = ["# Validation against published measurements", "",
             f"Generated by `{command}` from `ringflow/data/published.yaml`, the one registry of published cases "
             f"({n} cases: {n_fit} in the fitting set, {n - n_fit} held out). Error = predicted / published - 1: "
             "positive is optimistic (the model predicts more bandwidth or throughput than was measured), negative "
             "pessimistic.", "",
             "## Method", "",
             "- Split (`published.split_sets`, a rule fixed in code): by group, never per case. A group is one "
             "configuration across container releases, sources and siblings (message sizes, GPU or node counts of "
             "one sweep, 8k/16k runs of one layout), so twins never sit on both sides. Groups holding a figure a "
             "library default was derived from fit; every other group goes by a stable hash of its name.",
             "- Every fitted constant is refitted by one command, `python -m ringflow.workload.fitting`, from the "
             "fitting set only, and the JSON lists the cases each used (`constants.fitted_on`): the NVLink "
             "efficiency (collectives inside one NVLink domain), the NIC efficiency (collectives across servers), "
             "the NVSwitch chip's in-switch reduction rate (NVLS collectives that rate bounds), each by a few "
             "multiplicative steps toward a median published / predicted of 1; the compute curve of "
             "`compute.EfficiencyModel` (eff_max, d_half, n_half) on the reference era's fitting cases, which "
             "`train` and `plan` use too; per GPU model the SM clock its tensor cores sustain through training "
             "over the clock its rates assume (`compute.GpuSpec.at_clock`), on the dense runs on that GPU of every "
             "stack the compute model describes by its kernels; one software factor per era it has no kernel "
             "profile of, on that era's dense runs; the token dispatcher's rate per dispatcher kind (alltoall, "
             "flex: DeepEP / HybridEP) on the MoE runs (`moe_fit`, bisection to a median published / predicted "
             "of 1). Held-out values are never read by a fit.",
             "- MoE layers (`workload/moe.py`): expert GEMMs as grouped GEMMs on the dense curve (a grouped GEMM "
             "of Qwen3-30B-A3B's experts measured 648-714 TFLOP/s on one H200), router and token "
             "permute/unpermute memory-bound (an indexing permute at 0.95 TB/s measured on one H200, a fused one "
             "at the elementwise rate), the dispatcher's fitted time per routed element, expert imbalance "
             "(published benchmarks force-balance: 1), EP all-to-alls hidden under compute where the run's "
             "configuration overlaps them.",
             "- Collectives: `ringflow.sim` (analytic engine) with the fitted link efficiencies; a case without a "
             "forced algorithm (NCCL's default in the source) takes " + (
                 "NCCL's own choice from its tuning model (`--nccl`, as `ringflow sim --nccl`), simulated where "
                 "the simulator runs that algorithm" if result["constants"].get("chooser") == "nccl" else
                 "the simulator's own choice") + ". Training: `workload.step_time` with the alpha-beta "
             "communication model and the fitted constants.",
             "- Targets: held-out mean absolute error <= 7 %, every held-out case within 15 %, every collective on "
             "one server within 5 %, every published training run fits in memory under the settings its run "
             "states (`memory_cases.case_memory`).", "",
             "## Manifest", "", *manifest_lines(result),
             "## Fitted constants", "", *_md_table(CONST_HEADER, constant_rows(result)),
             "## Targets", "", *_md_table(["target", "this run", "status", "cases missing it"], target_rows(result)),
             "## Fitted constants against the simulator's defaults", "",
             "The same predictions with the simulator's default link efficiencies, no sustained-clock and no "
             "per-stack factor (the compute curve as fitted in both).", "",
             *_md_table(COMPARE_HEADER, compare_rows(result)),
             "## Summary per GPU generation", "", *_md_table(GROUP_HEADER, group_rows(result)),
             "## Errors by GPU generation, framework and scale", "",
             "Framework: the training software era, or nccl for collectives. Scale: the GPUs a case runs on.", "",
             *(line for dim in ("generation", "framework", "scale")
               for line in [f"### By {dim}", "", *_md_table(["set", dim, *BY_HEADER[1:]], by_rows(result, dim))]),
             "## Held-out set", "", *_md_table(CASE_HEADER, case_rows(result, "held_out")),
             "## Fitting set", "", *_md_table(CASE_HEADER, case_rows(result, "fit")),
             "## Memory per GPU", "",
             "Every training case's peak memory per GPU on its fullest pipeline stage "
             "(`memory_cases.case_memory`), under the memory settings its run states (recompute modules, main-grad "
             "precision, allocator: `ringflow/data/memory_runs.yaml` or the case's own `memory:`), against the "
             "GPU's capacity. The registry's sources publish throughput, not memory.", "",
             *_md_table(["case", "set", "predicted GiB", "capacity GiB", "memory model"], memory_rows(result)),
             "### Published memory readings", "",
             "Runs whose source publishes peak memory per GPU (`ringflow/data/memory_measured.yaml`), predicted "
             "with the layout and settings the source states; error = predicted / published - 1.", "",
             *_md_table(["run", "published GiB", "predicted GiB", "error", "source"], measured_memory_rows(result)),
             "## Not expressible yet (or failing in the model)", "",
             *_md_table(["case", "set", "what is missing"], not_expressible(result)),
             "## Cases and sources", "",
             *_md_table(["case", "system", "source", "where", "assumed"],
                        [[r["id"], r["system"], r["url"], r["where"], r["assumed"]] for r in result["rows"]])]
    return "\n".join(lines).rstrip() + "\n"


def write_markdown(path: str, result: dict[str, Any], command: str) -> None:
    """Write the markdown report to `path`."""
    with open(path, "w") as fh:
        fh.write(markdown(result, command))
