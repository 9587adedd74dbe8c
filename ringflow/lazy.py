"""Package attributes that load their module on first use, so importing a package stays light."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_attributes(package: str, where: Mapping[str, str],
                    names: Sequence[str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module-level `__getattr__` and `__dir__`: attribute X loads `package.where[X]` on first use
    (and is kept in the package's namespace from then on); `names` are the package's public names."""
    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        sys.modules[package].__dict__[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(sys.modules[package].__dict__) | set(names))
    return __getattr__, __dir__
