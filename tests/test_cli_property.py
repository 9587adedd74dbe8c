"""Property test over the CLI: random option values never end in a traceback.

Every command either runs (exit 0) or exits non-zero with a one-line typed error (ours: "error: Kind: ...
(fix: ...)", or click's usage error for a value of the wrong type or range). Commands that start real
processes or listen on ports (run, bench, store, calibrate, validate) are covered by their own tests.
"""
from __future__ import annotations

import contextlib
import io
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


@pytest.mark.parametrize("path", _commands(), ids=lambda p: " ".join(p))
@settings(max_examples=20, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
