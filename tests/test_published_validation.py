"""The published-measurements file, its split, the fit's independence from the held-out half, the report."""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ringflow.cli import build_app
from ringflow.errors import ConfigError, InvalidArgument
from ringflow.workload.compute import EfficiencyModel
from ringflow.workload.fitting import (
    FITTED_PATH,
    case_digest,
    load_fitted,
    main,
    refit,
    release,
    release_changes,
    stored_constants,
)
from ringflow.workload.published import (
    SETS,
    Constants,
    Prediction,
    evaluate,
    fit,
    load_cases,
    memory_target,
    predict,
    row,
    split_sets,
)
from ringflow.workload.published_report import markdown


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    return load_cases()


def test_file_parses_and_every_case_has_a_source_and_a_set(cases: list[dict]) -> None:
    assert len(cases) >= 30
    for c in cases:
        assert c["source"]["url"].startswith("https://"), c["id"]
        assert c["source"].get("where"), f"{c['id']}: say where in the source the number is"
        assert c["set"] in SETS and c["value"] > 0
    kinds = {(c["kind"], c["generation"]) for c in cases}
    for kind in ("collective", "training"):
        for gen in ("ampere", "hopper", "blackwell"):
            assert (kind, gen) in kinds
    assert any(c["kind"] == "collective" and (c["topology"].get("nodes") or 1) > 1 for c in cases)


def test_the_split_is_by_group_and_follows_the_stated_rule(cases: list[dict]) -> None:
    rule = split_sets(cases)
    assert {c["id"]: c["set"] for c in cases} == rule
    by_group: dict[str, set[str]] = {}
    for c in cases:
        by_group.setdefault(c["group"], set()).add(c["set"])
    assert all(len(sets) == 1 for sets in by_group.values()), "a group on both sides of the split"
    assert {"fit", "held_out"} <= {s for sets in by_group.values() for s in sets}
    # twins the split must keep together share a group
    groups = {c["id"]: c["group"] for c in cases}
    for twins in (("llama3-405b-8k", "llama3-405b-16k"), ("h100x5-allreduce-nvls", "h100x6-allreduce-nvls",
                                                          "h100x7-allreduce-nvls", "h100x8-allreduce-nvls"),
                  ("b300-2node-eth-allreduce-ring", "b300-16node-eth-allreduce-ring"),
                  ("bridge-25.11-h100-llama3-70b-fp8", "bridge-26.02-h100-llama3-70b-fp8")):
        assert len({groups[t] for t in twins}) == 1, twins
    # the figures library defaults were derived from are fitting cases
    assert all(c["set"] == "fit" for c in cases if c.get("sets_default"))


def test_a_set_against_the_rule_or_a_case_without_group_is_refused(tmp_path: Path, cases: list[dict]) -> None:
    bad = copy.deepcopy(cases[:3])
    bad[1]["set"] = "fit" if bad[1]["set"] == "held_out" else "held_out"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"cases": bad}))
    with pytest.raises(ConfigError, match=bad[1]["id"]):
        load_cases(p)
    del bad[1]["group"]
    p.write_text(yaml.safe_dump({"cases": bad}))
    with pytest.raises(ConfigError, match="group"):
        load_cases(p)


def _stub(seen: list[str]):
    """A predictor that depends on a case's configuration only (never its published value)."""
    def predictor(case: dict, consts: Constants) -> Prediction:
        seen.append(case["id"])
        h = int(hashlib.sha256(case["id"].encode()).hexdigest()[:6], 16) / 0xFFFFFF
        if case["kind"] == "collective":
            base = 400.0 * (0.8 + 0.4 * h) * consts.nvlink_eff / 0.822
            link = "net" if (case["topology"].get("nodes") or 1) > 1 else "nvlink"
            return Prediction(base, "ok", {"link_class": link})
        return Prediction(100.0 * (0.8 + 0.4 * h) * consts.software.get(case["era"], 1.0))
    return predictor


def test_fitted_constants_depend_on_the_fitting_set_only(cases: list[dict]) -> None:
    seen: list[str] = []
    base = fit(cases, _stub(seen)).to_dict()
    held = {c["id"] for c in cases if c["set"] == "held_out"}
    assert seen and not held & set(seen), "the fit predicted a held-out case"
    for names in base["fitted_on"].values():
        assert not held & set(names)
    assert base["fitted_on"]["compute.eff_max"] and "software[megatron-lm-2021]" not in base["fitted_on"]
    moved = copy.deepcopy(cases)
    for c in moved:
        if c["set"] == "held_out":
            c["value"] *= 1.5
    assert fit(moved, _stub([])).to_dict() == base
    # the check can fail: moving fitting values moves the constants
    for c in moved:
        if c["set"] == "fit":
            c["value"] *= 1.5
    again = fit(moved, _stub([])).to_dict()
    assert again != base


def test_the_real_fit_ignores_held_out_values(cases: list[dict]) -> None:
    pick = [c for c in cases if c["id"] in ("h100x8-allreduce-ring", "h100x8-allreduce-nvls", "h100-2node-nic-ring",
                                           "gb200-3xnvl8-allreduce-ring")]
    assert {c["set"] for c in pick} == {"fit", "held_out"}
    first = fit(pick)
    assert 0 < first.nvlink_eff <= 1 and 0 < first.net_eff <= 1
    assert first.fitted_on["nvlink_eff"] == ["h100x8-allreduce-ring"]
    assert first.fitted_on["net_eff"] == ["h100-2node-nic-ring"]
    moved = copy.deepcopy(pick)
    for c in moved:
        if c["set"] == "held_out":
            c["value"] *= 0.5
    assert fit(moved).to_dict() == first.to_dict()


def test_a_missing_preset_is_reported_not_dropped(cases: list[dict]) -> None:
    c = copy.deepcopy(next(x for x in cases if x["id"] == "h100x8-allreduce-ring"))
    c["topology"] = {"preset": "no-such-server"}
    pr = predict(c, Constants.defaults())
    assert pr.value is None and pr.status.startswith("not expressible") and "no-such-server" in pr.status
    c["topology"] = {"preset": "no-such-server", "standin": {"preset": "dgx-h100"}}
    pr = predict(c, Constants.defaults())
    assert pr.value and "stand-in dgx-h100" in pr.info["note"]


def test_a_case_without_a_source_is_refused(tmp_path: Path, cases: list[dict]) -> None:
    bad = copy.deepcopy(cases[:2])
    del bad[1]["source"]["url"]
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({"cases": bad}))
    with pytest.raises(ConfigError, match="source.url"):
        load_cases(p)


def _small(cases: list[dict]) -> list[dict]:
    ids = ("h100x8-allreduce-ring", "h100x8-allreduce-nvls", "h100-2node-nic-ring", "a100-2node-8hdr-allreduce-ring",
           "bridge-25.11-h100-llama3-8b-fp8", "bridge-25.11-h100-llama3-70b-fp8", "megascale-175b-12288")
    return [c for c in cases if c["id"] in ids]


def test_the_report_has_both_sets_and_the_gaps(cases: list[dict]) -> None:
    res = evaluate(cases=_small(cases))
    text = markdown(res, "ringflow validate --published")
    for part in ("## Fitting set", "## Held-out set", "## Fitted constants", "## Not expressible yet",
                 "megascale-175b-12288", "optimistic", "pessimistic"):
        assert part in text
    held = [r for r in res["rows"] if r["set"] == "held_out" and r["error"] is not None]
    assert held and all(r["error"] == pytest.approx(r["predicted"] / r["published"] - 1) for r in held)
    assert res["summary"]["held_out"]["all"]["n"] == len(held)
    for part in ("## Manifest", "### By framework", "### By scale", "held-out cases used by any fit: none",
                 "## Memory per GPU", "### Published memory readings", "torchtitan-llama3.1-8b-fsdp8-cp1-32k"):
        assert part in text
    trained = [r for r in res["rows"] if r["kind"] == "training" and r["status"] == "ok"]
    assert trained and all(r["fits_in_memory"] and r["memory_gib"] > 0 for r in trained)
    assert res["memory_measured"] and all(m["published_gib"] > 0 and m["predicted_gib"] > 0
                                          for m in res["memory_measured"])
    m = res["manifest"]
    assert m["refit"] and not m["held_out_in_a_fit"]
    assert m["counts"]["fit"]["cases"] + m["counts"]["held_out"]["cases"] == len(res["rows"])
    assert all(r["group"] for r in res["rows"])


@pytest.mark.long
def test_every_training_run_that_ran_fits_in_the_validations_own_result(cases: list[dict]) -> None:
    consts = stored_constants(cases)
    rows = [row(c, predict(c, consts)) for c in cases if c["kind"] == "training"]
    ran = [r for r in rows if r["status"] == "ok"]
    assert len(ran) >= 25
    out = [f"{r['id']}: {r['memory_gib']:.1f} of {r['capacity_gib']:.1f} GiB" for r in ran if not r["fits_in_memory"]]
    assert not out, out
    assert all(0 < r["memory_gib"] <= r["capacity_gib"] for r in ran)
    target = memory_target(rows)
    assert target["met"] and target["value"].startswith(f"{len(ran)} of {len(ran)} fit")
    # the check can fail: the same run with 8 sequences per micro-batch does not fit
    big = next(c for c in cases if c["id"] == "bridge-25.11-h100-llama3-70b-fp8")
    tight = copy.deepcopy(big)
    tight["layout"]["micro_batch"] = 8
    r = row(tight, predict(tight, consts))
    assert r["fits_in_memory"] is False and r["memory_gib"] > r["capacity_gib"]
    assert not memory_target([r])["met"] and memory_target([r])["cases"] == [tight["id"]]


def test_cli_validate_published(tmp_path: Path, cases: list[dict]) -> None:
    data = tmp_path / "cases.yaml"
    data.write_text(yaml.safe_dump({"cases": _small(cases)}))
    report, out = tmp_path / "published.md", tmp_path / "published.json"
    res = CliRunner().invoke(build_app(), ["validate", "published", "--data", str(data), "--report", str(report),
                                           "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "held-out set" in res.output and "fitted constants" in res.output
    assert "## Held-out set" in report.read_text()
    doc = json.loads(out.read_text())
    assert {r["id"] for r in doc["rows"]} == {c["id"] for c in _small(cases)}
    assert all(r["group"] for r in doc["rows"]) and "fitted_on" in doc["constants"]
    assert doc["manifest"]["split_rule"] and doc["manifest"]["counts"]["held_out"]["groups"] >= 1


def test_nccl_chooser_takes_nccls_choice_for_default_cases(cases: list[dict]) -> None:
    res = evaluate(cases=_small(cases), chooser="nccl")
    rows = {r["id"]: r for r in res["rows"]}
    assert rows["h100x8-allreduce-nvls"]["algorithm"].startswith("nccl: ")     # NCCL's default in the source
    assert not rows["h100x8-allreduce-ring"]["algorithm"].startswith("nccl")   # NCCL_ALGO=RING stays forced
    assert res["constants"]["chooser"] == "nccl"
    with pytest.raises(InvalidArgument, match="chooser"):
        fit(cases, chooser="fastest")


def test_nccl_chooser_runs_all_to_all_as_nccls_grouped_sends(cases: list[dict]) -> None:
    a2a = [c for c in cases if c["id"] in ("h100-2node-alltoall", "p5-4node-alltoall-efa")]
    consts = Constants.defaults("nccl")
    for c in a2a:   # NCCL has no tuned all-to-all: its PXN sends, as the simulator's default runs them
        p = predict(c, consts)
        assert p.status == "ok" and p.info["algorithm"] == "pxn/simple", (c["id"], p.status)


def test_no_stored_constant_was_fitted_on_a_held_out_case(cases: list[dict]) -> None:
    doc = load_fitted()
    sets = {c["id"]: c["set"] for c in cases}
    fitted_on = doc["constants"]["fitted_on"]
    assert {"nvlink_eff", "net_eff", "compute.eff_max"} <= set(fitted_on)
    for name, ids in fitted_on.items():
        assert ids, name
        assert all(sets[i] == "fit" for i in ids), (name, [i for i in ids if sets[i] != "fit"])
    # the stored file is the registry's fitting half as it is now, and the library's compute curve is its curve
    assert doc["fitting_cases"] == {c["id"]: case_digest(c) for c in cases if c["set"] == "fit"}
    k = stored_constants(cases)
    e = EfficiencyModel()
    assert (e.eff_max, e.d_half, e.n_half) == (k.eff_max, k.d_half, k.n_half)


def test_stored_constants_are_refused_once_a_fitting_case_changes(cases: list[dict]) -> None:
    moved = copy.deepcopy(cases)
    victim = next(c for c in moved if c["set"] == "fit")
    victim["value"] *= 1.01
    with pytest.raises(ConfigError, match=victim["id"]):
        stored_constants(moved)
    held = copy.deepcopy(cases)
    next(c for c in held if c["set"] == "held_out")["value"] *= 1.5
    assert stored_constants(held).to_dict() == stored_constants(cases).to_dict()


@pytest.mark.long
def test_refit_writes_every_constant_with_the_fitting_cases_it_used(tmp_path: Path, cases: list[dict]) -> None:
    ids = ("h100x8-allreduce-ring", "h100x8-allreduce-nvls", "h100-2node-nic-ring", "narayanan-t1-18.4b",
           "narayanan-t1-3.6b", "llama3-405b-16k-cp16")
    data = tmp_path / "cases.yaml"
    data.write_text(yaml.safe_dump({"cases": [c for c in cases if c["id"] in ids]}))
    out = tmp_path / "fitted.json"
    seen: list[str] = []
    doc = refit(data, out, predictor=_stub(seen))
    held = {c["id"] for c in cases if c["id"] in ids and c["set"] == "held_out"}
    assert held and seen and not held & set(seen)
    on = doc["constants"]["fitted_on"]
    assert on["compute.eff_max"] == ["narayanan-t1-18.4b"]
    assert "compute.d_half" not in on and doc["constants"]["d_half"] == 0   # one case fits one parameter
    assert on["software[meta-llama3-2024]"] == ["llama3-405b-16k-cp16"]
    assert json.loads(out.read_text()) == doc
    # the command line entry point writes the same file
    again = tmp_path / "again.json"
    ok = main(["--data", str(data), "-o", str(again)]) == 0
    assert ok and set(json.loads(again.read_text())["constants"]["fitted_on"]) >= {"nvlink_eff", "compute.eff_max"}


def test_release_digests_count_the_held_out_cases_changed_since(tmp_path: Path, cases: list[dict]) -> None:
    data = tmp_path / "cases.yaml"
    data.write_text(yaml.safe_dump({"cases": cases}))
    rel = tmp_path / "release.json"
    release("t1", data, rel)
    assert release_changes(cases, rel) == {"tag": "t1", "changed": [], "new": [], "removed": []}
    edited = copy.deepcopy(cases)
    h = next(c for c in edited if c["set"] == "held_out")
    h["layout" if "layout" in h else "value"] = {"tp": 2} if "layout" in h else h["value"] * 2
    next(c for c in edited if c["set"] == "fit")["value"] *= 2   # fitting cases are not the release's business
    assert release_changes(edited, rel)["changed"] == [h["id"]]
    # the packaged release covers the packaged held-out cases
    assert release_changes(cases)["tag"] and not release_changes(cases)["new"]
    assert FITTED_PATH.exists()
