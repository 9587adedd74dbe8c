"""Tables and the markdown report of `ringflow validate --published` (see `published.py` for the method)."""
from __future__ import annotations

import re
from typing import Any

CASE_HEADER = ["case", "gen", "metric", "published", "predicted", "error", "direction", "algorithm", "status"]
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
        out.append([r["id"], r["generation"], METRIC_UNITS[r["metric"]], _num(r["published"]), _num(r["predicted"]),
                    err, _direction(r["error"]), r["algorithm"], status])
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
    eras = sorted({r["era"] for r in result["rows"] if r["era"]})
    for era in eras:
        k = c["software"].get(era)
        rows.append([f"software_factor ({era})", "1 (not fitted)" if k is None else f"{k:.3f}", "1",
                     ", ".join(fitted.get(f"software[{era}]", [])) or "no expressible fitting case"])
    return rows


def compare_rows(result: dict[str, Any]) -> list[list[str]]:
    """Fitted constants against the library's defaults (nothing fitted), per set."""
    out = []
    for which in ("fit", "held_out"):
        for label, st in (("fitted", result["summary"][which]["all"]), ("library defaults",
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
             f"Generated by `{command}` from `ringflow/data/published.yaml` ({n} cases: {n_fit} in the fitting set, "
             f"{n - n_fit} held out). Error = predicted / published - 1: positive is optimistic (the model "
             "predicts more bandwidth or throughput than was measured), negative pessimistic.", "",
             "## Method", "",
             "- Split (`split_sets`, a rule fixed before any prediction): within each (kind, GPU generation) group, in "
             "file order, the cases alternate fit, held out, fit, ...; a case added later goes at the end of the file, "
             "so no earlier case changes set.",
             "- Fitted on the fitting set only (`published.fit`), each by a few multiplicative steps toward a "
             "median of published / predicted of 1 over its own fitting cases: the NVLink efficiency (from "
             "collectives inside one NVLink domain), the NIC efficiency (from collectives across servers), the "
             "NVSwitch chip's in-switch reduction rate (from NVLS collectives that rate bounds) and one "
             "software factor per training software era (`EfficiencyModel.software_factor`). Held-out values are "
             "never read by the fit.",
             "- Collectives: `ringflow.sim` (analytic engine) with the fitted link efficiencies; a case without a "
             "forced algorithm (NCCL's default in the source) takes " + (
                 "NCCL's own choice from its tuning model (`--nccl`, as `ringflow sim --nccl`), simulated where "
                 "the simulator runs that algorithm" if result["constants"].get("chooser") == "nccl" else
                 "the simulator's own choice") + ". Training: `workload.step_time` with the alpha-beta "
             "communication model and the fitted constants.",
             "- Targets: held-out mean absolute error <= 7 %, every held-out case within 15 %, every collective on "
             "one server within 5 %.", "",
             "## Fitted constants", "", *_md_table(CONST_HEADER, constant_rows(result)),
             "## Targets", "", *_md_table(["target", "this run", "status", "cases missing it"], target_rows(result)),
             "## Fitted against nothing fitted", "", *_md_table(COMPARE_HEADER, compare_rows(result)),
             "## Summary per GPU generation", "", *_md_table(GROUP_HEADER, group_rows(result)),
             "## Held-out set", "", *_md_table(CASE_HEADER, case_rows(result, "held_out")),
             "## Fitting set", "", *_md_table(CASE_HEADER, case_rows(result, "fit")),
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
