"""Every RINGFLOW_* environment knob in one table, read in one place.

Values come from, in order: an override set in code (`override()`), the
environment, the default. The README's knob table is generated from `KNOBS`
(`python -m ringflow.config --markdown`) and a test keeps them in sync.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .units import parse_size


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r} (use 0 or 1)")


def _float(text: str) -> float:
    return float(text)


def _int(text: str) -> int:
    return int(text)


def _str(text: str) -> str:
    return text


def _check_rounds(text: str) -> str:
    t = text.strip().lower()
    if t not in ("auto", "pairs", "log"):
        raise ValueError(f"not a check pattern: {text!r} (use auto, pairs or log)")
    return t


@dataclass(frozen=True)
class Knob:
    """One RINGFLOW_* knob: its name, default, parser and meaning."""

    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str
    area: str

    @property
    def env(self) -> str:
        return f"RINGFLOW_{self.name}"


KNOBS: dict[str, Knob] = {k.name: k for k in [
    Knob("DEBUG", "", _str, "Log level: VERSION, WARN, INFO or TRACE (TRACE shows every schedule step); "
         "messages carry a rank prefix.", "runtime"),
    Knob("DEBUG_FILE", "", _str, "Write logs to this file instead of stderr (%h host, %p pid, %r rank).", "runtime"),
    Knob("TIMEOUT", 600.0, _float, "Seconds any blocking call waits for ranks that are alive but do not arrive "
         "before raising Timeout (per-call `timeout=` overrides). NCCL's default is 10 min, Gloo's 30 min; dead, "
         "departed and unreachable peers are reported within seconds regardless.", "runtime"),
    Knob("HEARTBEAT_INTERVAL", 1.0, _float, "Seconds between TCP keepalive probes on the control sockets (the "
         "kernel answers them, so a rank that computes or holds the GIL stays alive).", "runtime"),
    Knob("HEARTBEAT_TIMEOUT", 6.0, _float, "Seconds without a keepalive answer (or with sent data "
         "unacknowledged) before a peer's host counts as gone.", "runtime"),
    Knob("SOCKET_IFNAME", "", _str, "Interfaces for TCP, NCCL syntax: `eth` prefix, `^docker` excludes, "
         "`=eth0` exact; loopback only when named.", "runtime"),
    Knob("SHM_DISABLE", False, _bool, "1 disables the shared-memory transport (everything goes over TCP).", "runtime"),
    Knob("CMA_DISABLE", False, _bool, "1 turns off single-copy reads between same-host ranks "
         "(process_vm_readv, Open MPI's smsc/cma); large messages then go through shared-memory slots.",
         "runtime"),
    Knob("NATIVE", True, _bool, "0 runs every collective in Python instead of the native executor (the C module "
         "built at install, used for plans whose peers are all on shared memory), and the call recorder's per-call "
         "path in Python instead of C.", "runtime"),
    Knob("STREAM_COPY_MIN_BYTES", 4 * 2**20, parse_size, "Local copies of at least this many bytes use "
         "streaming (non-temporal) stores, which skip reading the destination; 0 turns them off. Needs the "
         "native module built at install (a C compiler).", "runtime"),
    Knob("BUFFSIZE", 4 * 2**20, parse_size, "Staging buffer size per peer and channel in bytes "
         "(NCCL_BUFFSIZE, default 4 MiB).", "runtime"),
    Knob("NCHANNELS", 0, _int, "Number of channels (parallel rings/streams); 0 = chosen per size.", "runtime"),
    Knob("ALGO", "", _str, "Restrict algorithms: `ring`, `tree`, or per collective "
         "`allreduce:ring;allgather:bruck`.", "algorithms"),
    Knob("RINGS", "", _str, "Explicit ring orders (NCCL_RINGS): ranks separated by '-' or ' ', rings by '|'.",
         "topology"),
    Knob("LL_THRESHOLD", 16 * 2**10, parse_size, "Messages below this size (bytes) take the low-latency "
         "path (NCCL_LL_THRESHOLD, 16 KiB).", "runtime"),
    Knob("SINGLE_RING_THRESHOLD", 256 * 2**10, parse_size, "Below this size (bytes) one channel is used "
         "(NCCL_SINGLE_RING_THRESHOLD, 256 KiB).", "runtime"),
    Knob("CHECKS_DISABLE", False, _bool, "1 skips the cross-rank argument checks (count, dtype, op).", "runtime"),
    Knob("RECEIVER_CHECK", True, _bool, "1 checks a call's arguments on its first step's messages, adding "
         "zero-byte messages where that step lacks a pair (no separate exchange before the data); 0 opens such "
         "calls with a CHECK exchange. The same on every rank.", "runtime"),
    Knob("CHECK_ROUNDS", "auto", _check_rounds, "How a communicator of 3 or more ranks checks a call's arguments "
         "across ranks: `pairs` (every rank hears from every peer in one step), `log` (ceil(log2 n) dissemination "
         "rounds, which small calls' own messages carry), or `auto` (the one the communicator's cost model prices "
         "lower, `algorithms.check_rounds`). The same on every rank.", "runtime"),
    Knob("TCP_CONGESTION", "auto", _str, "TCP congestion control of data sockets: `auto` (same-host peers "
         "use cubic or reno, since BBR paces even loopback: +40 us per 64 KiB message after a bulk "
         "transfer; other peers keep the system's), `system`, or a name the kernel offers.", "runtime"),
    Knob("TRAFFIC_CLASS", -1, _int, "DSCP/TOS value set on a communicator's sockets (-1: leave unset).", "runtime"),
    Knob("TUNER_MODEL", "", _str, "A host-model file written by `ringflow calibrate` on this host: communicators "
         "whose ranks all run here take, among the tuner's candidates, the one the model predicts fastest where "
         "that beats the flat alpha-beta choice by more than the model's own error (docs/hostmodel.md).",
         "algorithms"),
    Knob("RECORD", "", _str, "Record every collective and point-to-point call of every rank into this directory "
         "(one JSON-lines file per rank and a manifest; `ringflow record`, docs/record.md).", "runtime"),
    Knob("FLIGHT_RECORDER", 256, _int, "Calls each communicator keeps when RINGFLOW_DUMP_DIR or RINGFLOW_RECORD "
         "says where records go: in a file-backed ring written as calls happen (on disk even if the rank is "
         "killed) and in memory, written out on a timeout, a failed peer, SIGUSR1 or comm.dump() (0 turns the "
         "flight recorder off, and `ringflow run` makes no job directory).", "runtime"),
    Knob("DUMP_DIR", "", _str, "Where flight records go (default: the RINGFLOW_RECORD directory; `ringflow run` "
         "sets it to its job directory; neither set: no flight recorder, no cost per call).", "runtime"),
    Knob("TOPO_FILE", "", _str, "Use this topology file (YAML/JSON) instead of detecting the machine.", "topology"),
    Knob("SECRET", "", _str, "Job secret proving store/transport connections belong to the job "
         "(the launcher generates one).", "runtime"),
    Knob("STORE_ADDR", "", _str, "host:port of the rendezvous store (set by `ringflow run`).", "runtime"),
    Knob("STORE_IDLE_TIMEOUT", 300.0, _float, "Seconds the store keeps an authenticated connection that sends "
         "nothing (0: forever); a connection waiting in `get`/`wait` is never idle, and a client whose connection "
         "was closed dials again on its next request.", "runtime"),
    Knob("STORE_MAX_CLIENTS", 4096, _int, "Authenticated connections the store serves at once (one thread and one "
         "descriptor each); a new one past the cap takes the place of the connection idle longest, and is refused "
         "with `StoreFull` when none is idle. Set it above the ranks (and other clients) of the largest job on the "
         "store, and below the store process's descriptor limit.", "runtime"),
]}

_overrides: dict[str, Any] = {}
_lock = threading.Lock()


def get(name: str) -> Any:
    """The value of knob `name` (without the RINGFLOW_ prefix)."""
    knob = KNOBS.get(name)
    if knob is None:
        raise ConfigError(f"unknown knob {name!r}", f"known knobs: {', '.join(sorted(KNOBS))}")
    with _lock:
        if name in _overrides:
            return _overrides[name]
    raw = os.environ.get(knob.env)
    if raw is None or raw == "":
        return knob.default
    try:
        return knob.parse(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{knob.env}={raw!r} is invalid: {exc}", knob.doc) from None


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Temporarily set knobs in code: `with override(ALGO="ring"): ...`."""
    for k in values:
        if k not in KNOBS:
            raise ConfigError(f"unknown knob {k!r}", f"known knobs: {', '.join(sorted(KNOBS))}")
    with _lock:
        saved = {k: _overrides.get(k, _MISSING) for k in values}
        _overrides.update(values)
    try:
        yield
    finally:
        with _lock:
            for k, v in saved.items():
                if v is _MISSING:
                    _overrides.pop(k, None)
                else:
                    _overrides[k] = v


_MISSING = object()


def markdown_table() -> str:
    """The README's knob table."""
    rows = ["| knob | default | area | meaning |", "|---|---|---|---|"]
    for k in KNOBS.values():
        default = "" if k.default in ("", None) else str(k.default)
        rows.append(f"| `{k.env}` | {default or '(unset)'} | {k.area} | {k.doc} |")
    return "\n".join(rows)


README_START, README_END = "<!-- knobs:start -->", "<!-- knobs:end -->"


def update_readme(path: str) -> None:
    """Rewrite the knob table between the README's knob markers."""
    with open(path) as fh:
        text = fh.read()
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    with open(path, "w") as fh:
        fh.write(f"{head}{README_START}\n{markdown_table()}\n{README_END}{tail}")


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--update-readme":
        update_readme(sys.argv[2])
    else:
        print(markdown_table())
