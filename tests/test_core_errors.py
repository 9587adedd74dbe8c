"""The error hierarchy, and the deprecated `SystemError` alias of `RingflowSystemError`."""
from __future__ import annotations

import builtins
import warnings

import pytest

import ringflow
from ringflow import errors
from ringflow.errors import ProtocolError, RingflowError, RingflowSystemError


def test_ringflow_system_error_keeps_its_bases_and_subclass() -> None:
    assert issubclass(RingflowSystemError, RingflowError) and issubclass(RingflowSystemError, OSError)
    assert issubclass(ProtocolError, RingflowSystemError)
    assert RingflowSystemError is not builtins.SystemError
    exc = RingflowSystemError("socket failed", "check the network")
    assert exc.message == "socket failed" and exc.hint == "check the network"
    assert str(exc) == "socket failed (fix: check the network)"
    assert ringflow.RingflowSystemError is RingflowSystemError


def test_system_error_alias_warns_and_is_the_same_class() -> None:
    with pytest.warns(DeprecationWarning, match="RingflowSystemError"):
        from ringflow.errors import SystemError as old
    assert old is RingflowSystemError
    with pytest.warns(DeprecationWarning, match="RingflowSystemError"):
        assert errors.SystemError is RingflowSystemError
    with pytest.warns(DeprecationWarning, match="RingflowSystemError"):
        assert ringflow.SystemError is RingflowSystemError
    with pytest.warns(DeprecationWarning):
        from ringflow import SystemError as old_top
    assert old_top is RingflowSystemError


def test_the_alias_is_not_exported_and_the_builtin_is_untouched() -> None:
    assert "SystemError" not in errors.__all__ and "SystemError" not in ringflow.__all__
    assert "RingflowSystemError" in errors.__all__ and "RingflowSystemError" in ringflow.__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        namespace: dict[str, object] = {}
        exec("from ringflow.errors import *", namespace)  # a star import must not touch the deprecated name
    assert "SystemError" not in namespace and namespace["RingflowSystemError"] is RingflowSystemError


def test_unknown_attributes_still_raise_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        errors.Nope  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ringflow.Nope  # noqa: B018
