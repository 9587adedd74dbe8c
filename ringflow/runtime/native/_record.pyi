from collections.abc import Callable
from types import CodeType
from typing import Any

# Recorder.call in C: put in a Recorder subclass (runtime/record_native.py), called as rec.call(...)
call: Any

def setup(internal: dict[CodeType, bool], queued: object, is_internal: Callable[[str], bool], max_walk: int,
          flush_every: int, untrack: bool = ...) -> None: ...
def pack(entries: list[list[Any]], desc_id: Callable[[list[Any]], int]) -> str: ...
def clock_ns() -> int: ...
