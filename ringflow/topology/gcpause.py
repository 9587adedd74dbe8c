"""A pause of Python's cyclic garbage collector while a large graph or table is built.

Building a 2,048-server cluster or the simulator's tables of it allocates hundreds of thousands of
long-lived dicts; every 700 allocations the collector runs, and its full passes rescan the whole growing
heap, which costs a third of the build. Paused, it does not run; at the end of the pause what the block built
joins the oldest generation at once (`gc.freeze` then `gc.unfreeze` move objects without examining them)
instead of being examined by the young collections on its way there, so only full collections examine it, as
they examine everything long-lived (not while anything else is frozen: the pause then leaves the generations
as they are). Nothing is freed later than reference counting frees it; reference cycles made during the pause
wait for the next full collection.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Automatic garbage collection off inside the block (as it was before, after it; nests); what the block
    built then belongs to the oldest generation."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():   # nothing frozen by anyone else (whom unfreeze would thaw)
                gc.freeze()
                gc.unfreeze()
            gc.enable()


__all__ = ["gc_paused"]
