"""Caches keyed by a topology object, held weakly so that a topology's cached tables go with it."""
from __future__ import annotations

import weakref
from typing import Any


def per_topology(store: weakref.WeakKeyDictionary[Any, dict], topo: Any) -> dict:
    """`topo`'s dict in `store`; a fresh, unkept dict for a topology that cannot be weakly referenced or hashed
    (no caching)."""
    try:
        return store.setdefault(topo, {})
    except TypeError:
        return {}
