"""Shrink: after a failure, the survivors agree on who is alive and build a new communicator.

NCCL's recovery recipe (ncclCommAbort, then a new communicator), "abort, free resources, create a new
communicator, continue", done through the rendezvous store under a new generation (namespace ``<ns>/x<k>``)::

    1. every caller posts a vote: the ranks it knows are gone (connection closed or heartbeat
       lost, as seen by its watchdog, plus `exclude`);
    2. it waits for a vote from every rank that nobody has reported gone (re-reading its own
       watchdog and the others' votes while it waits, so a death noticed late still counts);
       a rank that has not voted by the deadline counts as gone;
    3. the first proposal written with compare-and-set becomes the decision for everyone, so
       all survivors use one member list even if their views differed;
    4. the members (old ranks in order) build a new Communicator, then the old one is destroyed
       (its sockets, shared-memory segments, threads and doorbells are freed).

Without failures `shrink()` re-initialises the same ranks under a new generation (a cheap way to
get fresh channels after an InvalidArgument or a timeout). A peer that merely aborted is not
voted out: it may call shrink too. Cost: one store round trip per vote poll and one
communicator creation; the store must still be alive (run it in the launcher or with
`ringflow store` rather than in a rank that may die).
"""
from __future__ import annotations

import glob
import json
import logging
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ...errors import Aborted, InvalidArgument, InvalidUsage, Timeout
from ..job.store import PrefixStore

if TYPE_CHECKING:  # pragma: no cover
    from .communicator import Communicator

log = logging.getLogger("ringflow.runtime")

# While waiting for votes, re-read the watchdog this often: a death first seen on a data socket
# reaches the watchdog a moment later, and the dead rank's vote will never come.
POLL_S = 0.02
STORE_GRACE_S = 1.0   # past the shrink's deadline, a last store request may take this long


def gone_peers(comm: Communicator) -> set[int]:
    """Ranks this rank's watchdog saw die (closed connection, host gone) or say goodbye, not mere aborts."""
    wd = getattr(comm, "_watchdog", None)
    if wd is None:
        return set()
    return {int(p) for p, why in list(wd.dead.items()) if "aborted" not in why} | {int(p) for p in list(wd.departed)}


def _votes(st: PrefixStore, ranks: Iterable[int]) -> dict[int, set[int]]:
    got: dict[int, set[int]] = {}
    for r in ranks:
        if st.check([f"vote/{r}"]):
            got[r] = {int(x) for x in json.loads(st.get(f"vote/{r}", 5.0))}
    return got


def agree(comm: Communicator, exclude: Iterable[int] = (), timeout: float | None = None) -> list[int]:
    """Run steps 1-3: the sorted old ranks that form the new communicator (this rank included)."""
    size, me = comm.size, comm.rank
    excl = {int(r) for r in exclude}
    if any(not 0 <= r < size for r in excl):
        raise InvalidArgument(f"exclude={sorted(excl)} names ranks outside 0..{size - 1}", "ranks are group-local")
    if me in excl:
        raise InvalidArgument(f"rank {me} excludes itself", "a rank that leaves should just destroy its communicator")
    k = comm._nshrink
    comm._nshrink = k + 1
    st = PrefixStore(f"{comm.ns}/shrink{k}", comm._sh.store)
    t = comm.timeout if timeout is None else float(timeout)
    if t <= 0:
        raise InvalidArgument(f"timeout={timeout}", "give a positive number of seconds")
    deadline = time.monotonic() + t
    with st.bounded(deadline + STORE_GRACE_S):   # no store request outlives the caller's timeout
        gone = excl | gone_peers(comm)
        st.set(f"vote/{me}", json.dumps(sorted(gone)))
        votes: dict[int, set[int]] = {me: set(gone)}
        while True:
            gone |= gone_peers(comm)
            for s in votes.values():
                gone |= s
            waiting = [r for r in range(size) if r not in gone and r not in votes]
            if not waiting:
                break
            if st.check(["decision"]):
                break  # somebody already decided (it gave up waiting for a rank): adopt it below
            if time.monotonic() >= deadline:
                log.warning("ringflow: rank %d: shrink: no vote from ranks %s before the deadline; leaving them out",
                            me, waiting)
                gone |= set(waiting)
                break
            try:
                st.wait([f"vote/{r}" for r in waiting], min(POLL_S, max(0.001, deadline - time.monotonic())))
            except Timeout:
                pass
            votes.update(_votes(st, waiting))
        proposal = json.dumps(sorted(gone)).encode()
        _, decided = st.compare_set("decision", None, proposal)
        out = {int(x) for x in json.loads(decided or proposal)}
        if me in out:
            raise Aborted(f"rank {me} was left out of the shrunk communicator (the others did not hear from it in "
                          "time)",
                          "call shrink() on every survivor promptly, or raise its timeout")
        return [r for r in range(size) if r not in out]


def remove_segments(comm: Communicator, ranks: Iterable[int]) -> int:
    """Unlink the shared-memory names `ranks` created in this communicator that no receiver mapped yet
    (a rank killed between creating a segment and its peer opening it); the number removed."""
    from ..transport.shm import SHM_DIR, segment_name, unlink_quiet
    n = 0
    for r in ranks:
        prefix = segment_name(comm._sh.job, comm.uid, int(r), 0, "x").rsplit("-", 2)[0]  # the name up to the source
        for path in glob.glob(os.path.join(SHM_DIR, prefix + "-*")):
            unlink_quiet(os.path.basename(path))
            n += 1
    return n


def shrink(comm: Communicator, exclude: Iterable[int] = (), timeout: float | None = None) -> Communicator:
    """A new communicator of the survivors of `comm` (which is destroyed); collective over survivors."""
    if comm._destroyed:
        raise InvalidUsage("shrink() on a destroyed communicator", "shrink before destroy()")
    t0 = time.monotonic()
    members = agree(comm, exclude, timeout)
    k = comm._nshrink - 1
    new = type(comm)(comm._sh, f"{comm.ns}/x{k}", members.index(comm.rank), len(members))
    new.parent_ranks = tuple(members)  # new rank i was rank parent_ranks[i] of the old communicator
    comm.destroy()
    left_out = sorted(set(range(comm.size)) - set(members))
    removed = remove_segments(comm, left_out)
    log.info("ringflow: shrink of %s: %d -> %d ranks (left out %s, %d orphaned segments removed) in %.1f ms; "
             "this rank %d -> %d", comm.ns, comm.size, len(members), left_out, removed,
             1e3 * (time.monotonic() - t0), comm.rank, new.rank)
    return new
