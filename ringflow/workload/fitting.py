"""Every fitted constant of the published validation, refitted from the fitting half in one command.

``python -m ringflow.workload.fitting`` (the library function `refit`) fits, from the cases of
``ringflow/data/published.yaml`` that the split rule puts in the fitting half and from no other:

- the simulator's link efficiencies and NVSwitch reduction rate (`published.fit`);
- the compute curve of `compute.EfficiencyModel` (``eff_max``, ``d_half``, ``n_half``) on the fitting cases of the
  reference software era (`REFERENCE_ERA`, whose per-stack factor is 1 by definition): ``eff_max`` moves toward a
  median published / predicted of 1, ``d_half`` and ``n_half`` are searched over a grid (least squares of the log
  ratio); a shape parameter with too few fitting cases to be fitted takes its neutral value 0; every refit
  starts from the same point (`START`), so refitting unchanged cases gives the same constants;
- per GPU model, the SM clock its tensor cores sustain through training over the clock its rates assume
  (``sustained``), on the dense fitting runs on that GPU of every stack the compute model describes by its kernels;
- one per-stack ``software_factor`` per software era it has no kernel profile of, on that era's fitting cases.

It writes ``ringflow/data/fitted.json``: the values, the case ids each was fitted on (``fitted_on``), the split
rule and a digest of every fitting case. `compute.EfficiencyModel` takes its curve from that file, and
`published.evaluate` uses its constants for the packaged registry, refusing them when the fitting cases have
changed since. ``--release TAG`` records a digest of every held-out case under a release tag
(``ringflow/data/published_release.json``; with ``--add-new`` the recorded cases keep their digests and only
new held-out cases are added); the report counts the held-out cases changed since.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .published import DATA_PATH, SPLIT_RULE, Constants, Predictor, fit, load_cases, predict

FITTED_PATH = Path(__file__).resolve().parents[1] / "data" / "fitted.json"
RELEASE_PATH = Path(__file__).resolve().parents[1] / "data" / "published_release.json"
COMMAND = "python -m ringflow.workload.fitting"
REFERENCE_ERA = "megatron-lm-2021"
CURVE_PARAMS = ("eff_max", "d_half", "n_half")   # fitted in this order, as many as there are reference cases
GRIDS = {"d_half": (0.0, 25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0, 600.0, 800.0),
         "n_half": (0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)}
START = {"eff_max": 0.7, "d_half": 0.0, "n_half": 0.0}   # where every refit starts (not the stored values)
EFF_ROUNDS = 3     # multiplicative steps of eff_max per shape candidate
SHAPE_ROUNDS = 2   # passes over the shape parameters


def case_digest(case: dict[str, Any]) -> str:
    """A short digest of everything a case says (its set included)."""
    return hashlib.sha256(json.dumps(case, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fit_compute_curve(fit_cases: list[dict[str, Any]], consts: Constants, predictor: Predictor) -> None:
    """Fit the compute curve in `consts` on the reference era's fitting cases (see module docstring)."""
    ref = [c for c in fit_cases if c["kind"] == "training" and c.get("era") == REFERENCE_ERA]
    if not ref:
        return
    names = CURVE_PARAMS[:len(ref)]
    for p in CURVE_PARAMS:
        setattr(consts, p, START[p])

    def solve() -> tuple[float, list[str]]:
        ok: list[tuple[dict[str, Any], float]] = []
        for _ in range(EFF_ROUNDS):
            got = [(c, predictor(c, consts).value) for c in ref]
            ok = [(c, v) for c, v in got if v is not None and v > 0]
            if not ok:
                return math.inf, []
            consts.eff_max = min(1.0, consts.eff_max * statistics.median(c["value"] / v for c, v in ok))
        got = [(c, predictor(c, consts).value) for c in ref]
        ok = [(c, v) for c, v in got if v is not None and v > 0]
        return sum(math.log(c["value"] / v) ** 2 for c, v in ok), [c["id"] for c, _ in ok]

    loss, ids = solve()
    for _ in range(SHAPE_ROUNDS if len(names) > 1 else 0):
        for p in names[1:]:
            best = (loss, getattr(consts, p), consts.eff_max, ids)
            for v in GRIDS[p]:
                setattr(consts, p, v)
                got = solve()
                if got[0] < best[0] - 1e-12:
                    best = (got[0], v, consts.eff_max, got[1])
            loss, ids = best[0], best[3]
            setattr(consts, p, best[1])
            consts.eff_max = best[2]
    for p in names:
        consts.fitted_on[f"compute.{p}"] = list(ids)


def refit(path: str | Path | None = None, out: str | Path | None = FITTED_PATH, predictor: Predictor = predict,
          chooser: str = "sim") -> dict[str, Any]:
    """Fit every constant on the fitting half of the registry and write them (with what each used) to `out`."""
    cases = load_cases(path)
    consts = fit(cases, predictor, chooser)
    doc = {"command": COMMAND, "data": Path(path or DATA_PATH).name, "split_rule": SPLIT_RULE,
           "reference_era": REFERENCE_ERA, "constants": consts.to_dict(),
           "fitting_cases": {c["id"]: case_digest(c) for c in cases if c["set"] == "fit"}}
    if out:
        Path(out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def load_fitted(path: str | Path = FITTED_PATH) -> dict[str, Any]:
    """The fitted-constants document `refit` wrote."""
    try:
        doc = json.loads(Path(path).read_text())
        doc["constants"]["eff_max"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read fitted constants {path}: {exc}", f"run {COMMAND}") from exc
    return doc


def stored_constants(cases: list[dict[str, Any]], path: str | Path = FITTED_PATH) -> Constants:
    """The stored constants, refused when the fitting half they came from is not the registry's fitting half."""
    doc = load_fitted(path)
    now = {c["id"]: case_digest(c) for c in cases if c["set"] == "fit"}
    if doc["fitting_cases"] != now:
        moved = sorted(k for k in set(now) | set(doc["fitting_cases"]) if now.get(k) != doc["fitting_cases"].get(k))
        raise ConfigError(f"the fitted constants in {path} predate changes to fitting cases: {', '.join(moved)}",
                          f"refit them: {COMMAND}")
    return Constants.from_dict(doc["constants"])


def release(tag: str, path: str | Path | None = None, out: str | Path = RELEASE_PATH,
            add_new: bool = False) -> dict[str, Any]:
    """Record a digest of every held-out case under the release `tag`; with `add_new`, the cases already in the
    recorded release keep the digest they had there (so their changes since still count) and only the held-out
    cases it lacks are added."""
    cases = load_cases(path)
    now = {c["id"]: case_digest(c) for c in cases if c["set"] == "held_out"}
    if add_new:
        try:
            then = json.loads(Path(out).read_text()).get("held_out") or {}
        except (OSError, ValueError):
            then = {}
        now = {k: then.get(k, v) for k, v in now.items()}
    doc = {"tag": tag, "held_out": now}
    Path(out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return doc


def release_changes(cases: list[dict[str, Any]], path: str | Path = RELEASE_PATH) -> dict[str, Any]:
    """Held-out cases changed, added or gone since the recorded release of the table."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {"tag": None, "changed": [], "new": [], "removed": []}
    then = doc.get("held_out") or {}
    now = {c["id"]: case_digest(c) for c in cases if c["set"] == "held_out"}
    return {"tag": doc.get("tag"), "changed": sorted(k for k in now if k in then and now[k] != then[k]),
            "new": sorted(set(now) - set(then)), "removed": sorted(set(then) - set(now))}


def main(argv: list[str] | None = None) -> int:
    """Command line: refit every constant (default), or record a release of the held-out cases."""
    ap = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="registry file (default: the packaged one)")
    ap.add_argument("-o", "--out", default=str(FITTED_PATH), help="where to write the fitted constants")
    ap.add_argument("--release", metavar="TAG", help="record the held-out cases' digests under this tag instead")
    ap.add_argument("--add-new", action="store_true",
                    help="with --release: keep the recorded digests, add only the held-out cases not yet recorded")
    args = ap.parse_args(argv)
    if args.release:
        doc = release(args.release, args.data, add_new=args.add_new)
        print(f"release {doc['tag']}: {len(doc['held_out'])} held-out cases recorded in {RELEASE_PATH}")
        return 0
    doc = refit(args.data, args.out)
    for name, ids in sorted(doc["constants"]["fitted_on"].items()):
        print(f"{name}: fitted on {len(ids)} cases: {', '.join(ids)}")
    c = doc["constants"]
    print(f"eff_max {c['eff_max']:.4f} d_half {c['d_half']:g} n_half {c['n_half']:g} nvlink_eff "
          f"{c['nvlink_eff']:.4f} net_eff {c['net_eff']:.4f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
