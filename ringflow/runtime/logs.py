"""RINGFLOW_DEBUG logging in the NCCL_DEBUG style: levels VERSION, WARN, INFO, TRACE; every line
carries the host, pid and rank, like ``host:pid [rank] ringflow INFO ...``.

- unset: ringflow installs nothing (Python's default shows warnings, without a prefix);
- VERSION: one line with the ringflow version per process at `init`, then warnings only;
- WARN: warnings (a dead peer, a refused connection with its address, a bad frame);
- INFO: plus communicator creation, shrink, transport choice;
- TRACE: plus one line per schedule step the executor runs (peers, bytes, channels, local ops).

``RINGFLOW_DEBUG_FILE`` writes to a file instead of stderr; ``%h`` (host), ``%p`` (pid) and
``%r`` (rank) are replaced, so each rank can have its own file. `setup` is idempotent: a process
that creates many communicators keeps one handler (and one open file).
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import threading
from typing import Any

from .. import config
from ..errors import ConfigError

TRACE = 5
# [True] while the level is TRACE: the executors log every step, and calls take the Python executor
tracing = [os.environ.get("RINGFLOW_DEBUG", "").upper() == "TRACE"]
VERSION = logging.WARNING + 1  # the version line under RINGFLOW_DEBUG=VERSION (shown like a warning)
logging.addLevelName(TRACE, "TRACE")
logging.addLevelName(VERSION, "VERSION")
logging.addLevelName(logging.WARNING, "WARN")

LEVELS = {"VERSION": logging.WARNING, "WARN": logging.WARNING, "WARNING": logging.WARNING,
          "INFO": logging.INFO, "TRACE": TRACE}
ROOT_LOGGER = "ringflow"

_lock = threading.Lock()
_state: dict[str, Any] = {"rank": "-", "handler": None, "level": None, "version_said": False}
_HOST = socket.gethostname()


class _RankFilter(logging.Filter):
    """Adds the process's (world) rank and host to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.rf_rank = _state["rank"]
        record.rf_host = _HOST
        return True


def parse_level(text: str) -> int | None:
    """RINGFLOW_DEBUG text -> logging level (None: unset); ConfigError for unknown names."""
    t = text.strip().upper()
    if not t:
        return None
    if t not in LEVELS:
        raise ConfigError(f"RINGFLOW_DEBUG={text!r} is not a level", "use VERSION, WARN, INFO or TRACE")
    return LEVELS[t]


def log_path(pattern: str, rank: int | str) -> str:
    """RINGFLOW_DEBUG_FILE with %h, %p, %r replaced."""
    return pattern.replace("%h", _HOST).replace("%p", str(os.getpid())).replace("%r", str(rank))


def setup(rank: int | str) -> logging.Logger:
    """Configure the ringflow logger from RINGFLOW_DEBUG / RINGFLOW_DEBUG_FILE for this rank."""
    text = str(config.get("DEBUG"))
    level = parse_level(text)
    logger = logging.getLogger(ROOT_LOGGER)
    with _lock:
        _state["rank"] = rank
        if level is None:
            return logger
        if _state["handler"] is None:
            pattern = str(config.get("DEBUG_FILE"))
            if pattern:
                handler: logging.Handler = logging.FileHandler(log_path(pattern, rank), mode="a",
                                                               encoding="utf-8")
            else:
                handler = logging.StreamHandler(sys.stderr)
            handler.addFilter(_RankFilter())
            handler.setFormatter(logging.Formatter("%(rf_host)s:%(process)d [%(rf_rank)s] %(levelname)s "
                                                   "%(message)s"))
            logger.addHandler(handler)
            logger.propagate = False
            _state["handler"] = handler
        logger.setLevel(level)
        _state["level"] = level
        say_version = text.strip().upper() in ("VERSION", "INFO", "TRACE") and not _state["version_said"]
        _state["version_said"] = _state["version_said"] or say_version
    tracing[0] = level <= TRACE
    if say_version:
        from .. import __version__
        logger.log(VERSION if level == logging.WARNING else logging.INFO, "ringflow: version %s", __version__)
    return logger


def reset() -> None:
    """Remove ringflow's handler (tests)."""
    logger = logging.getLogger(ROOT_LOGGER)
    with _lock:
        h = _state["handler"]
        if h is not None:
            logger.removeHandler(h)
            h.close()
        _state.update(handler=None, level=None, version_said=False, rank="-")
        logger.propagate = True
        logger.setLevel(logging.NOTSET)
    tracing[0] = False


def trace_step(op_seq: int, description: str, step: int, xfers: Any, locals_: Any) -> None:
    """One TRACE line for a schedule step about to run (called by the executor when TRACE is on)."""
    parts = []
    for x in xfers:
        verb = {"SEND": "send", "RECV": "recv", "RECV_REDUCE": "recv-reduce"}.get(x.kind.name, x.kind.name.lower())
        direction = "to" if verb == "send" else "from"
        parts.append(f"{verb} {x.buf.name.lower()}[{x.off}:{x.off + x.nbytes}] ({x.nbytes} B) {direction} "
                     f"rank {x.peer} on {x.key}")
    for lo in locals_:
        parts.append(f"{lo.kind.name.lower()} {lo.n} elems {lo.src.name.lower()}[{lo.src_off}] -> "
                     f"{lo.dst.name.lower()}[{lo.dst_off}]")
    logging.getLogger("ringflow.runtime").log(TRACE, "ringflow: op #%d %s step %d: %s", op_seq, description, step,
                                               "; ".join(parts) or "nothing")
