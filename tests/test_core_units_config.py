"""Units parsing and the RINGFLOW_* knob table."""
from __future__ import annotations

import pathlib

import pytest

from ringflow import config
from ringflow.errors import ConfigError, InvalidArgument
from ringflow.units import format_size, parse_rate_gbps, parse_size, size_range


@pytest.mark.parametrize("text,expected", [
    ("8", 8), ("1KiB", 1024), ("64MiB", 64 * 2**20), ("8GiB", 8 * 2**30), ("4GB", 4 * 10**9),
    ("1e9", 10**9), ("256 KiB", 256 * 1024), (17, 17),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "12XB", "-1", "1..2"])
def test_parse_size_rejects(bad):
    with pytest.raises(InvalidArgument):
        parse_size(bad)


def test_format_and_range():
    assert format_size(1024) == "1KiB"
    assert format_size(3 * 2**30) == "3GiB"
    assert format_size(100) == "100B"
    assert size_range(8, 64) == [8, 16, 32, 64]
    assert parse_rate_gbps("400G") == 400.0
    assert parse_rate_gbps("1.6T") == 1600.0


def test_knob_defaults_env_and_override(monkeypatch):
    assert config.get("BUFFSIZE") == 4 * 2**20
    monkeypatch.setenv("RINGFLOW_BUFFSIZE", "1MiB")
    assert config.get("BUFFSIZE") == 2**20
    with config.override(BUFFSIZE=123):
        assert config.get("BUFFSIZE") == 123
    assert config.get("BUFFSIZE") == 2**20
    monkeypatch.setenv("RINGFLOW_SHM_DISABLE", "maybe")
    with pytest.raises(ConfigError, match="RINGFLOW_SHM_DISABLE"):
        config.get("SHM_DISABLE")
    with pytest.raises(ConfigError, match="known knobs"):
        config.get("NOPE")


def test_readme_documents_every_knob():
    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    missing = [k.env for k in config.KNOBS.values() if f"`{k.env}`" not in readme]
    assert not missing, f"README knob table lacks {missing}: regenerate with python -m ringflow.config"
