"""The repository describes the product as it is: no large files, no work diaries in the docs."""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_TRACKED_BYTES = 1_000_000

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
            "thirtieth|fortieth|fiftieth|(?:twenty|thirty|forty|fifty)-\\w+|\\d+(?:st|nd|rd|th)")
SESSION_DIARY = re.compile(rf"\b(?:{ORDINALS})\s+session\b", re.IGNORECASE)
RECORDING_NUMBER = re.compile(r"\brec\d{2,3}\b")


def _docs() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_tracked_file_is_over_one_megabyte() -> None:
    big = []
    for rel in _tracked_files():
        path = ROOT / rel
        if path.is_file() and not path.is_symlink() and path.stat().st_size > MAX_TRACKED_BYTES:
            big.append(f"{rel} ({path.stat().st_size:,} bytes)")
    assert not big, f"tracked files over 1 MB: {big}"


@pytest.mark.parametrize("path", _docs(), ids=lambda p: p.name)
def test_docs_hold_no_recording_numbers_or_session_diaries(path: pathlib.Path) -> None:
    text = path.read_text(encoding="utf-8")
    hits = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for pattern in (RECORDING_NUMBER, SESSION_DIARY):
            for m in pattern.finditer(line):
                hits.append(f"{path.name}:{lineno}: {m.group(0)!r}")
    assert not hits, "describe the product as it is, not its history:\n" + "\n".join(hits)


def test_the_calibrate_command_is_named_as_it_is() -> None:
    files = _docs() + sorted((ROOT / "ringflow").rglob("*.py"))
    stale = [str(p.relative_to(ROOT)) for p in files if "ringflow sim calibrate" in p.read_text(encoding="utf-8")]
    assert not stale, f"`ringflow sim calibrate` is `ringflow calibrate`: {stale}"


def test_the_patterns_catch_what_they_are_for() -> None:
    # the examples are put together here, so that this file holds no diary line of its own
    for ordinal in ("thirty-fifth", "Second", "23rd", "twentieth"):
        diary = " ".join(("in the", ordinal, "session"))
        assert SESSION_DIARY.search(diary), diary
    for fine in ("a session of the store", "sessions", "session-scoped fixture"):
        assert not SESSION_DIARY.search(fine), fine
    numbered = ["rec" + str(n) for n in (143, 55, 63)]
    assert RECORDING_NUMBER.search(f"see {numbered[0]}") and RECORDING_NUMBER.search("-".join(numbered[1:]))
    assert not RECORDING_NUMBER.search("record143") and not RECORDING_NUMBER.search("rec1")
