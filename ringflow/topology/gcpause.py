"""A pause of Python's cyclic garbage collector while a large graph or table is built.

Building a 2,048-server cluster or the simulator's tables of it allocates hundreds of thousands of
long-lived dicts; every 700 allocations the collector runs, and its full passes rescan the whole growing
heap, which costs a third of the build. Paused, it runs once afterwards. Nothing is freed later than
reference counting frees it; only reference cycles made during the pause wait for the next collection.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Automatic garbage collection off inside the block (as it was before, after it; nests)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


__all__ = ["gc_paused"]
