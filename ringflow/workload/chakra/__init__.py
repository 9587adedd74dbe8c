"""Chakra (MLCommons) execution traces: ringflow traces out (`export`) and in (`import_files`)."""
from __future__ import annotations

from .convert import export, import_files

__all__ = ["export", "import_files"]
