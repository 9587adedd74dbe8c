"""Property test over the CLI: random option values never end in a traceback.

Every command either runs (exit 0) or exits non-zero with a one-line typed error (ours: "error: Kind: ...
(fix: ...)", or click's usage error for a value of the wrong type or range). Commands that start real
processes or listen on ports (run, bench, store, calibrate, validate) are covered by their own tests.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import typing
from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ringflow.cli import build_app, main

SKIP = {"run", "bench", "store", "calibrate", "validate", "detect"}
INTS = st.one_of(st.integers(-3, 3), st.integers(4, 300), st.sampled_from([0, 1, 2, 8, 64, 1024]))
FLOATS = st.one_of(st.floats(-2, 10, allow_nan=False), st.sampled_from([0.0, 1e-9, 1.5, 400.0]))
SIZES = st.sampled_from(["0", "-1", "8", "1KiB", "64MiB", "1GiB", "3", "abc", "1.5MiB", "100GiB", ""])
WORDS = st.one_of(st.sampled_from(["dgx-h100", "dgx-a100", "host-cpu:4", "llama3-70b", "llama3-8b", "gpt3-175b",
                                   "rail", "fat-tree", "ring", "tree", "all_reduce", "float32", "bf16", "sum",
                                   "selective", "none", "auto", "4xdgx-h100", "seed", "exact"]),
                  st.text(alphabet="abcxyz-_:0123456789./", min_size=0, max_size=12))


def _commands() -> list[tuple[str, ...]]:
    root = typer.main.get_command(build_app())
    out: list[tuple[str, ...]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))
        elif not set(path) & SKIP:
            out.append(path)
    walk(root, ())
    return sorted(out)


def _lookup(path: tuple[str, ...]) -> Any:
    cmd: Any = typer.main.get_command(build_app())
    for p in path:
        cmd = cmd.commands[p]
    return cmd


def _value(draw: Any, param: Any) -> str:
    name = (param.name or "").lower()
    ann = param.type_descriptor.annotation
    kinds = set(typing.get_args(ann)) or {ann}
    if int in kinds:
        return str(draw(INTS))
    if float in kinds:
        return repr(draw(FLOATS))
    if any(k in name for k in ("size", "min", "max", "nbytes")):
        return draw(SIZES)
    return draw(WORDS)


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.long) if p == ("plan",) else p
                                  for p in _commands()], ids=lambda p: " ".join(p))
@settings(max_examples=10, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_options_run_or_fail_with_one_typed_line(path: tuple[str, ...], data: st.DataObject,
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    cmd = _lookup(path)
    argv: list[str] = list(path)
    for param in cmd.params:
        if param.param_type_name == "argument":
            argv.append(_value(data.draw, param))
            continue
        if param.name in ("help",) or not data.draw(st.booleans()):
            continue
        flag = max(param.opts, key=len)
        if param.is_flag:
            argv.append(flag)
        elif any(k in (param.name or "") for k in ("json", "plot", "trace", "out", "dump", "report")):
            continue   # file outputs: not what this test explores
        else:
            argv += [flag, _value(data.draw, param)]
    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
    text = err.getvalue()
    assert "Traceback" not in text and "Traceback" not in out.getvalue(), (argv, text[-2000:])
    if code not in (0, None):
        lines = [ln for ln in text.strip().splitlines() if ln.strip() and not set(ln.strip()) <= set("─│╭╮╰╯ ")]
        assert lines, (argv, code, "no error message")
        known = {o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
        for hint in re.findall(r"\(fix: (.*)\)", " ".join(lines)):
            named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", hint))
            assert named <= known, (argv, f"the fix names options {sorted(named - known)} that {path} lacks", hint)


# ----------------------------------------------------------------------------- contracts over every command
def _all_commands() -> list[tuple[tuple[str, ...], Any]]:
    """Every command and command group of the app, with its path."""
    out: list[tuple[tuple[str, ...], Any]] = []

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        out.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name))
    walk(typer.main.get_command(build_app()), ())
    return out


def _opts(param: Any) -> list[str]:
    return [*param.opts, *getattr(param, "secondary_opts", ())] if param.param_type_name == "option" else []


def test_no_command_gives_one_option_name_twice() -> None:
    for path, cmd in _all_commands():
        names = [o for p in cmd.params for o in _opts(p)]
        assert len(names) == len(set(names)), (path, sorted(o for o in names if names.count(o) > 1))


def test_each_short_option_means_one_thing_across_commands() -> None:
    """A short option (-o, -n, ...) names the same long option (the same meaning) in every command that has it."""
    longs: dict[str, list[tuple[tuple[str, ...], set[str]]]] = {}
    for path, cmd in _all_commands():
        for p in cmd.params:
            for short in (o for o in _opts(p) if not o.startswith("--")):
                longs.setdefault(short, []).append((path, {o for o in _opts(p) if o.startswith("--")}))
    assert {"-o", "-n"} <= set(longs)
    for short, uses in longs.items():
        common = set.intersection(*(names for _path, names in uses))
        assert common, (short, [(" ".join(path), sorted(names)) for path, names in uses])
    assert all(names == {"--out"} for _path, names in longs["-o"])


def test_help_shows_the_bracketed_words_of_every_option() -> None:
    """Help texts are printed as written: '[rank]' is not swallowed as rich markup."""
    from typer.testing import CliRunner
    seen = 0
    for path, cmd in _all_commands():
        words = {w.replace("\\[", "[") for p in cmd.params for w in re.findall(r"\\?\[[^\]\s]*\]", p.help or "")}
        if not words:
            continue
        res = CliRunner(env={"COLUMNS": "300"}).invoke(build_app(), [*path, "--help"])
        assert res.exit_code == 0, res.output
        for w in words:
            assert w in res.output, (path, w)
            seen += 1
    assert seen >= 2   # run's [rank] and [args...]


def _trace_file(tmp: Any) -> str:
    """A small merged trace: 2 ranks, 3 steps of one all-reduce each."""
    from ringflow.workload.recorded import TRACE_FORMAT
    calls = [{"rank": r, "comm": "w", "lane": "coll", "seq": s, "op": "all_reduce", "dtype": "float32", "count": 256,
              "nbytes": 1024, "root": None, "async": False, "status": "ok", "site": "t.py:1", "enq_ns": s * 10**6,
              "start_ns": s * 10**6, "end_ns": s * 10**6 + 10} for r in range(2) for s in range(3)]
    path = tmp / "trace.json"
    path.write_text(json.dumps({"format": TRACE_FORMAT, "clock": "barrier", "world": "w", "world_size": 2,
                                "groups": {"w": [0, 1]}, "ranks": {"0": {}, "1": {}}, "calls": calls, "flight": {}}))
    return str(path)


# Arguments that make each --json command quick; TRACE is replaced by a small trace file.
JSON_RUNS: dict[tuple[str, ...], list[str]] = {
    ("hw", "pcie"): ["--gen", "3"], ("hw", "list"): [],
    ("topo", "list"): [], ("topo", "show"): ["dgx-h100"], ("topo", "rings"): ["dgx1-v100"],
    ("topo", "cluster"): ["dgx-h100", "--nodes", "2"], ("topo", "path"): ["dgx-h100", "GPU0", "GPU1"],
    ("topo", "detect"): [],
    ("algo", "list"): [], ("algo", "show"): ["all_reduce", "ring"], ("algo", "verify"): ["all_reduce", "ring"],
    ("algo", "cost"): ["all_reduce", "ring"], ("algo", "choose"): ["all_reduce"],
    ("bench",): ["all_reduce", "-n", "2", "--min", "8", "--max", "64", "--iters", "2", "--warmup", "1"],
    ("sim",): ["all_reduce", "--topo", "dgx-h100", "--min", "1MiB", "--max", "2MiB"],
    ("traffic",): ["--formula", "seed"],
    ("train",): ["--model", "llama3-8b", "--nodes", "2", "--tp", "2", "--pp", "2"],
    ("plan",): ["--model", "llama3-8b", "--gpus", "16", "--no-check", "--top", "2"],
    ("ps",): ["--nodes", "2", "--iters", "5"],
    ("validate", "gpu"): [],
    ("diagnose",): ["TRACE"], ("replay",): ["TRACE", "--no-contention", "--engine", "analytic"],
}
# --json commands that measure this host for minutes or need network namespaces: their own tests cover them.
JSON_SLOW = {("validate", "host"), ("validate", "multihost"), ("validate", "published")}


def test_every_json_command_is_checked_below() -> None:
    with_json = {path for path, cmd in _all_commands() if any("--json" in _opts(p) for p in cmd.params)}
    assert with_json == set(JSON_RUNS) | JSON_SLOW, sorted(with_json ^ (set(JSON_RUNS) | JSON_SLOW))


@pytest.mark.parametrize("path", sorted(JSON_RUNS), ids=lambda p: " ".join(p))
def test_json_prints_json_alone_on_stdout(path: tuple[str, ...], tmp_path: Any) -> None:
    from typer.testing import CliRunner
    args = [_trace_file(tmp_path) if a == "TRACE" else a for a in JSON_RUNS[path]]
    res = CliRunner().invoke(build_app(), [*path, *args, "--json"])
    assert res.exit_code == 0, (res.output, res.exception)
    json.loads(res.stdout)   # nothing but the JSON: no table, no progress, no "wrote ..." line


def test_the_one_command_validate_flags_still_work_with_a_warning(tmp_path: Any) -> None:
    from typer.testing import CliRunner
    out = tmp_path / "refs.json"
    res = CliRunner().invoke(build_app(), ["validate", "--gpu", "--json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "deprecated" in res.stderr and "ringflow validate gpu --json -o" in res.stderr.replace("\n", "")
    assert json.loads(res.stdout) == json.loads(out.read_text())
    assert json.loads(res.stdout)[0]["reference_GBps"] > 0
    both = CliRunner().invoke(build_app(), ["validate", "--gpu", "--host"])
    assert both.exit_code != 0 and "separate checks" in str(both.exception)
    help_text = CliRunner(env={"COLUMNS": "200"}).invoke(build_app(), ["validate", "--help"]).output
    assert all(sub in help_text for sub in ("host", "gpu", "multihost", "published"))
    assert "--rate-mbit" not in help_text and "--calibrate-ranks" not in help_text   # each subcommand's own


BAD_PLOTS = [["sim", "all_reduce", "--topo", "dgx-h100", "--max", "1MiB", "--plot", "{missing}/a.png"],
             ["sim", "all_reduce", "--topo", "dgx-h100", "--nccl", "--plot", "{tmp}/a.txt"],
             ["train", "--nodes", "2", "--tp", "2", "--pp", "2", "--plot", "{missing}/t.png"],
             ["validate", "gpu", "--plot", "{tmp}/refs"]]


@pytest.mark.parametrize("argv", BAD_PLOTS, ids=["sim", "sim-nccl", "train", "gpu"])
def test_a_bad_plot_path_is_a_typed_error_naming_it_and_the_fix(argv: list[str], tmp_path: Any) -> None:
    from ringflow.errors import InvalidArgument
    argv = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in argv]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "Traceback" not in err.getvalue()
    text = " ".join(err.getvalue().split())
    assert InvalidArgument.__name__ in text and argv[-1] in text and "(fix: " in text


def test_sim_nccl_plot_is_written_and_reported(tmp_path: Any) -> None:
    from typer.testing import CliRunner
    png = tmp_path / "nccl.png"
    res = CliRunner(env={"COLUMNS": "300"}).invoke(build_app(), ["sim", "all_reduce", "--topo", "dgx-h100", "--nccl",
                                                                 "--min", "1MiB", "--max", "16MiB", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:4] == b"\x89PNG" and f"wrote plot to {png}" in res.stdout


@pytest.mark.parametrize("argv", [["validate", "published", "--report", "docs/published.md", "-o", "out.json"],
                                  ["validate", "--published", "--json", "--report", "docs/published.md"],
                                  ["validate", "published", "--out", "x.json", "--report", "docs/published.md"]])
def test_a_report_records_the_check_not_where_its_json_went(argv: list[str], monkeypatch: Any) -> None:
    """The same check writes the same report (docs/published.md is regenerated with -o somewhere)."""
    from ringflow.cli.hostmodel_cmds import _command_line
    monkeypatch.setattr("sys.argv", ["ringflow", *argv])
    assert _command_line(report=True) == "ringflow validate published --report docs/published.md"
