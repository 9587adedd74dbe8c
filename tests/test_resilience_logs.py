"""RINGFLOW_DEBUG levels on real ranks: rank-prefixed lines, TRACE shows every schedule step,
RINGFLOW_DEBUG_FILE with %r gives one file per rank; bad levels are a typed error."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from resilience_ranks import Job  # noqa: E402

from ringflow import __version__, config
from ringflow.errors import ConfigError
from ringflow.runtime import logs

pytestmark = [pytest.mark.usefixtures("no_leaked_shared_memory")]


LINE = re.compile(r"^\S+:(\d+) \[(\d+)\] (TRACE|INFO|WARN|VERSION) ringflow: (.*)$")


def _run(tmp_path: Path, level: str, to_file: bool = False, nbytes: int = 65536,
         n: int = 2) -> list[list[tuple[str, str]]]:
    """n ranks do a barrier and one checked all-reduce; each rank's (level, message) log lines."""
    env = {"RINGFLOW_DEBUG": level}
    if to_file:
        env["RINGFLOW_DEBUG_FILE"] = str(tmp_path / "rf-%r.log")
    with Job(n, "lossbench", tmp_path, ["--sizes", str(nbytes), "--iters", "1", "--warm", "0"], env=env) as job:
        assert job.wait(60) == [0] * n, job.logs()
        assert all(row["wrong"] == 0 for r in range(n) for row in job.result(r)["rows"])
    per_rank = []
    for r in range(n):
        text = (tmp_path / (f"rf-{r}.log" if to_file else f"log{r}.txt")).read_text()
        lines = []
        for ln in text.splitlines():
            m = LINE.match(ln)
            if m:
                assert m.group(2) == str(r), f"rank {r} wrote a line prefixed for rank {m.group(2)}: {ln}"
                lines.append((m.group(3), m.group(4)))
            else:
                assert "ringflow:" not in ln, f"unprefixed ringflow line: {ln}"
        per_rank.append(lines)
    return per_rank


def test_trace_shows_every_schedule_step_with_rank_prefix_in_per_rank_files(tmp_path: Path) -> None:
    for r, lines in enumerate(_run(tmp_path, "TRACE", to_file=True, nbytes=1 << 20, n=3)):
        levels = {lv for lv, _ in lines}
        assert {"TRACE", "INFO"} <= levels
        steps = [msg for lv, msg in lines if lv == "TRACE"]
        numbered = [re.match(r"op #(\d+) .*all_reduce.* step (\d+): ", s) for s in steps]
        assert all(numbered), steps[:5]
        by_op: dict[int, list[int]] = {}
        for m in numbered:
            by_op.setdefault(int(m.group(1)), []).append(int(m.group(2)))
        assert all(v == list(range(len(v))) for v in by_op.values()), by_op  # every step, in order
        assert any(len(v) > 1 for v in by_op.values()), by_op
        assert any("send " in s and f"to rank {(r + 1) % 3} on c" in s for s in steps), steps[:5]
        assert any(f"from rank {(r - 1) % 3} on c" in s for s in steps), steps[:5]
        infos = [msg for lv, msg in lines if lv == "INFO"]
        assert any(m == f"version {__version__}" for m in infos)
        assert any(m.startswith("communicator ") and f"rank {r}/3 ready" in m for m in infos), infos


@pytest.mark.long
def test_info_has_no_trace_and_warn_and_version_are_quiet(tmp_path: Path) -> None:
    info = _run(tmp_path / "info", "INFO")
    assert all(lines and {lv for lv, _ in lines} == {"INFO"} for lines in info)
    warn = _run(tmp_path / "warn", "WARN")
    assert warn == [[], []]  # nothing went wrong, so nothing to say
    version = _run(tmp_path / "version", "VERSION")
    assert version == [[("VERSION", f"version {__version__}")]] * 2
    assert _run(tmp_path / "unset", "") == [[], []]


def test_bad_level_is_a_config_error_and_file_names_expand() -> None:
    with config.override(DEBUG="LOUD"):
        with pytest.raises(ConfigError, match="VERSION, WARN, INFO or TRACE"):
            logs.setup(0)
    assert logs.log_path("/tmp/rf-%h-%p-%r.log", 3).endswith("-3.log")
    assert "%" not in logs.log_path("/tmp/rf-%h-%p-%r.log", 3)
