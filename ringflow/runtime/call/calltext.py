"""Collective calls in words: the sentences of mismatch and timeout errors, and the hints' dialect.

A call's description (`executor.describe`, the JSON exchanged by the argument check and answered to a
STATUS query) becomes a phrase such as ``all_reduce of 8 x float32 (op sum)``; a mismatch names both
sides' calls in one sentence, a timeout names the ranks that did not arrive and what each last did.
The structured facts travel as the exception's `detail` dict.

Hints name the API the user called: ringflow's own (``shrink()``, a new communicator) or torch's
(``dist.destroy_process_group()``, ``dist.new_group``, the process group's ``timeout=``), chosen by
the communicator's `hint_dialect`.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import InvalidArgument

#: the fields of a call description that ranks must agree on, in the order a sentence names them
FIELDS = ("collective", "count", "dtype", "op", "root", "shape")
MAX_TIMEOUT_CHARS = 300   # a Timeout's sentence stays readable: the full story is in `detail`

RINGFLOW, TORCH = "ringflow", "torch"

#: what to do, per situation and dialect
_HINTS: dict[str, dict[str, str]] = {
    "mismatch": {
        RINGFLOW: "every rank must call the same collective with the same count, dtype, op and root",
        TORCH: "every rank must call the same torch.distributed collective with tensors of the same numel and "
               "dtype, the same op and the same src/dst",
    },
    "broken": {
        RINGFLOW: "every rank must call the same collective with the same arguments; create a new communicator "
                  "(or shrink() it) to continue",
        TORCH: "every rank must make the same torch.distributed calls; call dist.destroy_process_group() and "
               "init_process_group again (or make a new group with dist.new_group) to continue",
    },
    "timeout": {
        RINGFLOW: "a peer is slow, stuck or called a different collective; raise timeout= or RINGFLOW_TIMEOUT, "
                  "or check every rank calls the same sequence",
        TORCH: "a peer is slow, stuck or called a different collective; raise the process group's timeout "
               "(init_process_group(..., timeout=datetime.timedelta(...)) or RINGFLOW_TIMEOUT), or check every "
               "rank calls the same sequence",
    },
    "timed_out_before": {
        RINGFLOW: "create a new communicator (or shrink() it)",
        TORCH: "call dist.destroy_process_group() and init_process_group again, or make a new group with "
               "dist.new_group",
    },
    "departed": {
        RINGFLOW: "every rank must make the same collective calls before destroying; this communicator cannot "
                  "complete them: shrink() it or create a new one",
        TORCH: "every rank must make the same collective calls before dist.destroy_process_group(); this group "
               "cannot complete them: make a new one with dist.new_group, or destroy it and init_process_group "
               "again",
    },
    "failed": {
        RINGFLOW: "the communicator is unusable; shrink it or create a new one",
        TORCH: "the process group is unusable; call dist.destroy_process_group() and init_process_group again "
               "(or make a new group with dist.new_group)",
    },
    "aborted": {
        RINGFLOW: "create a new communicator (or shrink) to continue",
        TORCH: "call dist.destroy_process_group() and init_process_group again (or make a new group with "
               "dist.new_group)",
    },
}

#: ringflow-API hint texts (as raised by modules that know no dialect) -> their situation
_BY_TEXT = {text: kind for kind, d in _HINTS.items() for dialect, text in d.items() if dialect == RINGFLOW}
_BY_TEXT.update({
    "create a new communicator": "timed_out_before",
    "see that rank's output; create a new communicator or shrink": "failed",
    "every rank must make the same calls; create a new communicator": "broken",
})

_RECOVERY = re.compile(r"shrink|new communicator|ringflow\.init\(\)")


def hint(kind: str, dialect: str = RINGFLOW) -> str:
    """The fix hint for situation `kind` ("mismatch", "timeout", "departed", ...) in `dialect`."""
    texts = _HINTS[kind]
    return texts.get(dialect, texts[RINGFLOW])


def translate_hint(text: str | None, dialect: str) -> str | None:
    """A ringflow-API hint rewritten in `dialect`: its counterpart, or for an unlisted hint that names ringflow's
    recovery (shrink, a new communicator) torch's; unchanged otherwise."""
    if text is None or dialect == RINGFLOW:
        return text
    kind = _BY_TEXT.get(text)
    if kind is None and _RECOVERY.search(text):
        kind = "aborted"
    return text if kind is None else hint(kind, dialect)


def parse_call(desc: str | bytes | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A call description as a dict; None if `desc` is not one (e.g. the bytes of a data message)."""
    if isinstance(desc, Mapping):
        return dict(desc)
    if not desc:
        return None
    try:
        d = json.loads(desc)
    except (ValueError, UnicodeDecodeError):
        return None
    return d if isinstance(d, dict) and "collective" in d else None


def phrase(call: Mapping[str, Any] | str | None) -> str:
    """A call in words: "all_reduce of 8 x float32 (op sum)", "broadcast of 4 x int32 from root 1"."""
    d = parse_call(call) if not isinstance(call, Mapping) else dict(call)
    if d is None:
        return str(call) if call else "no collective yet"
    coll = str(d.get("collective"))
    if coll == "barrier":
        return "barrier"
    shape = d.get("shape")
    what = f"{coll} of {_shape(shape) if shape is not None else d.get('count')} x {d.get('dtype')}"
    if d.get("op") is not None:
        what += f" (op {d['op']})"
    if d.get("root") is not None:
        what += f" {'to' if coll in ('reduce', 'gather') else 'from'} root {d['root']}"
    return what


def _shape(shape: Any) -> str:
    try:
        dims = [int(s) for s in shape]
    except (TypeError, ValueError):
        return str(shape)
    return "x".join(map(str, dims)) if len(dims) > 1 else str(dims[0] if dims else 1)


def differences(theirs: Mapping[str, Any], mine: Mapping[str, Any]) -> list[str]:
    """The fields two calls disagree on, as "count 8 vs 6"."""
    return [f"{f} {theirs.get(f)} vs {mine.get(f)}" for f in FIELDS
            if f in theirs or f in mine if theirs.get(f) != mine.get(f)]


def mismatch_sentence(peer: int, theirs: Mapping[str, Any] | None, mine: Mapping[str, Any] | None,
                      rank: int | None = None, got_nbytes: int | None = None, want_nbytes: int | None = None,
                      third_person: bool = False) -> str:
    """ "rank 1 called all_reduce of 8 x float32 (op sum) but this rank (0) called all_reduce of 6 x float32
    (op sum)"; `third_person`: "... but rank 0 called ..." (a text other ranks read)."""
    me = f"rank {rank}" if third_person and rank is not None else (
        "this rank" if rank is None else f"this rank ({rank})")
    mine_s = phrase(mine) if mine else "another call"
    if theirs is not None:
        text = f"rank {peer} called {phrase(theirs)} but {me} called {mine_s}"
        diff = differences(theirs, mine or {})
        if diff and theirs.get("collective") == (mine or {}).get("collective"):
            text += f" ({', '.join(diff)})"
        return text
    sent = f"a {got_nbytes}-byte message" if got_nbytes is not None else "a message"
    wanted = f" where {want_nbytes} bytes were expected" if want_nbytes is not None and want_nbytes >= 0 else ""
    return f"rank {peer} sent {sent}{wanted} for a different call (its arguments did not arrive) while {me} " \
           f"called {mine_s}"


def mismatch_detail(peer: int, theirs: Mapping[str, Any] | None, mine: Mapping[str, Any] | None,
                    got_nbytes: int | None, want_nbytes: int | None, **extra: Any) -> dict[str, Any]:
    """The structured facts of a mismatch (the exception's `detail`)."""
    return {"reason": "mismatch", "peer": peer, "peer_call": None if theirs is None else dict(theirs),
            "this_call": None if mine is None else dict(mine), "peer_nbytes": got_nbytes,
            "expected_nbytes": want_nbytes, **extra}


def _ranks(ranks: Sequence[int]) -> str:
    rs = sorted(ranks)
    head = ", ".join(map(str, rs[:6])) + (f" and {len(rs) - 6} more" if len(rs) > 6 else "")
    return f"rank {head}" if len(rs) == 1 else f"ranks {head}"


def timeout_sentence(call: Mapping[str, Any] | str | None, op_seq: int, waiting_on: Sequence[int],
                     answers: Mapping[int, Mapping[str, Any]], silent: Sequence[int]) -> str:
    """A Timeout in one sentence of at most MAX_TIMEOUT_CHARS: which ranks did not arrive at call #op_seq and
    what each was last doing (ranks with the same last call are named together)."""
    head = f"{phrase(call)} (call #{op_seq}) timed out"
    if waiting_on:
        head += f" waiting for {_ranks(waiting_on)}"
    behind: dict[tuple[int, bool], list[int]] = {}
    for p, a in answers.items():
        seq = a.get("op_seq", -1)
        if isinstance(seq, int) and seq < op_seq:
            behind.setdefault((seq, bool(a.get("in_call"))), []).append(p)
    parts = []
    for (seq, inside), ranks in sorted(behind.items(), key=lambda kv: kv[1]):
        who = f"{_ranks(ranks)} {'has' if len(ranks) == 1 else 'have'} not entered it"
        if seq < 0:
            parts.append(f"{who} (no collective call yet)")
        else:
            state = "still inside" if inside else "done with"
            parts.append(f"{who} ({state} call #{seq}, {phrase(answers[ranks[0]].get('call'))})")
    if silent:
        parts.append(f"{_ranks(silent)} did not answer (stopped, or busy without releasing the GIL)")
    if not parts:
        parts.append("every rank has entered this call (one is slow inside it)")
    text = f"{head}: " + "; ".join(parts)
    if len(text) > MAX_TIMEOUT_CHARS:
        more = " ... (the rest in the error's detail)"
        text = text[:MAX_TIMEOUT_CHARS - len(more)].rstrip(" ;,") + more
    return text


def timeout_detail(call: Mapping[str, Any] | str | None, op_seq: int, waiting_on: Sequence[int],
                   answers: Mapping[int, Mapping[str, Any]], silent: Sequence[int]) -> dict[str, Any]:
    """The structured facts of a Timeout (the exception's `detail`)."""
    return {"reason": "timeout", "op_seq": op_seq, "call": parse_call(call) if isinstance(call, (str, bytes))
            else call, "waiting_on": sorted(waiting_on), "silent": sorted(silent),
            "peers": {int(p): {"op_seq": a.get("op_seq"), "in_call": a.get("in_call"),
                               "call": parse_call(a.get("call")) or a.get("call")} for p, a in answers.items()}}


def mismatch_error(peer: int, detail_bytes: bytes, got_nbytes: int, want_nbytes: int, what: str) -> InvalidArgument:
    """The InvalidArgument of a message from `peer` that does not match this rank's call `what` (its description):
    both calls in words where the peer's description came with the message (a CHECK frame), and in `detail`."""
    theirs, mine = parse_call(detail_bytes), parse_call(what)
    return InvalidArgument(mismatch_sentence(peer, theirs, mine, got_nbytes=got_nbytes, want_nbytes=want_nbytes),
                           hint("mismatch"),
                           detail=mismatch_detail(peer, theirs, mine, got_nbytes, want_nbytes))


PEER_CALL_WAIT_S = 1.0   # how long a rank that found a mismatch waits for the peer's description of its call


def both_calls(watchdog: Any, rank: int, last_call: tuple[int, str], peer: int, theirs: Mapping[str, Any] | None,
               got_nbytes: int | None, want_nbytes: int | None,
               wait_s: float = PEER_CALL_WAIT_S) -> tuple[str, str, dict[str, Any]]:
    """A mismatch with `peer` in call #op_seq (`last_call`: this rank's (op_seq, description)), in words from this
    rank's side and from a third party's, and its detail. This rank's call is told to every peer first; a peer's
    call that did not come with its message (a data message, not the argument check's) is waited for up to
    `wait_s`, as the peer, which found the same disagreement, tells it."""
    op_seq, desc = last_call
    mine = parse_call(desc)
    watchdog.tell_call(op_seq, desc)
    peer_seq = op_seq
    if theirs is None:
        told = watchdog.peer_call(peer, op_seq, wait_s)
        if told is not None:
            peer_seq, theirs = told[0], parse_call(told[1])
    first = mismatch_sentence(peer, theirs, mine, rank, got_nbytes, want_nbytes)
    third = mismatch_sentence(peer, theirs, mine, rank, got_nbytes, want_nbytes, third_person=True)
    if peer_seq != op_seq:
        where = f" (its call #{peer_seq}, this rank's #{op_seq})"
        first, third = first + where, third + where
    detail = mismatch_detail(peer, theirs, mine, got_nbytes, want_nbytes, rank=rank, op_seq=op_seq,
                             peer_op_seq=peer_seq if theirs is not None else None)
    return first, third, detail


#: ringflow-API phrases in messages and their torch.distributed counterparts
_TORCH_PHRASES = (
    ("left the communicator (destroy() or the end of its `with` block)",
     "left the process group (dist.destroy_process_group())"),
    ("the communicator's channels are out of step", "the process group's channels are out of step"),
    ("communicator aborted by rank", "process group aborted by rank"),
    ("communicator failed earlier", "process group failed earlier"),
    ("communicator is destroyed", "process group is destroyed"),
)


def in_dialect(exc: BaseException, dialect: str) -> str:
    """An error's text (message, then "(fix: hint)") with ringflow-API hints and phrases in `dialect`."""
    message, fix = getattr(exc, "message", None), getattr(exc, "hint", None)
    if not isinstance(message, str):
        return str(exc)
    if dialect == RINGFLOW:
        return str(exc)
    if dialect == TORCH:
        for text, kind in sorted(_BY_TEXT.items(), key=lambda kv: -len(kv[0])):
            message = message.replace(f"(fix: {text})", f"(fix: {hint(kind, TORCH)})")
        for ours, theirs in _TORCH_PHRASES:
            message = message.replace(ours, theirs)
    fix = translate_hint(fix, dialect)
    return f"{message} (fix: {fix})" if fix else message
