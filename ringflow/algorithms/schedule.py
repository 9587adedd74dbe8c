"""The schedule: one collective algorithm written once, read by verifier, runtime and simulator.

Glossary (these words mean exactly this everywhere in ringflow):

- **buffer**: one of a rank's three arrays: ``in`` (input), ``out`` (output),
  ``scratch`` (temporary). In-place collectives alias ``in`` and ``out``.
- **block**: a buffer is cut into blocks; for the per-rank collectives
  (all-gather output, reduce-scatter/scatter input, all-to-all) block ``b``
  belongs to rank ``b`` (or ``nblocks/nranks`` blocks per rank), for reductions
  blocks are an even split of the whole buffer (the seed's "n blocks").
- **segment**: each block is cut into ``nsegs`` segments, for pipelining (the
  seed's S chunks of a ring broadcast).
- **chunk**: the unit the schedule moves: one segment of one block, numbered
  ``block * nsegs + seg``. A ChunkRef may span several consecutive chunks.
  Chunks are indices only; ``layout.chunk_bounds`` maps them to elements.
- **step**: a global, ordered phase. In a step, every send is matched by a
  receive on the peer in the same step (same channel, in order). Sends read
  chunk values as of the start of the step; receives write their
  destinations; local ops (copy, reduce) run after the step's transfers, in
  listed order.
- **channel**: a parallel instance of the algorithm (one ring or tree of
  several), each with its own connections; ops carry their channel.
- **switch**: a participant that is not a rank: an in-network reducer / multicaster
  (NVLink SHARP's NVSwitch, an IB SHARP switch). Switches are numbered after the ranks
  (``nranks .. nranks + nswitches - 1``), hold only ``scratch``, contribute nothing and
  own no output; only GPU engines run schedules with switches (the CPU runtime cannot).
"""
from __future__ import annotations

import enum
import functools
import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import InvalidArgument, InvalidUsage

SCHEMA_VERSION = 1


class Collective(str, enum.Enum):
    """The collectives ringflow knows (values are the CLI / JSON names)."""

    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_REDUCE = "all_reduce"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_GATHER = "all_gather"
    GATHER = "gather"
    SCATTER = "scatter"
    ALL_TO_ALL = "all_to_all"
    ALL_TO_ALLV = "all_to_allv"
    BARRIER = "barrier"
    SENDRECV = "sendrecv"

    @classmethod
    def parse(cls, name: str | Collective) -> Collective:
        """Accept 'all_reduce', 'allreduce', 'all-reduce' (any case)."""
        if isinstance(name, Collective):
            return name
        key = str(name).lower().replace("-", "_")
        for c in cls:
            if key in (c.value, c.value.replace("_", "")):
                return c
        raise InvalidArgument(f"unknown collective {name!r}",
                              f"valid collectives: {', '.join(c.value for c in cls)}")

    @property
    def is_reduction(self) -> bool:
        return self in (Collective.REDUCE, Collective.ALL_REDUCE, Collective.REDUCE_SCATTER)

    @property
    def has_root(self) -> bool:
        return self in (Collective.BROADCAST, Collective.REDUCE, Collective.GATHER, Collective.SCATTER)

    @property
    def per_rank_sized(self) -> bool:
        """A call's count is per rank and its size S (nccl-tests' "size") is over all ranks."""
        return self in (Collective.ALL_GATHER, Collective.GATHER, Collective.REDUCE_SCATTER, Collective.SCATTER,
                        Collective.ALL_TO_ALL, Collective.ALL_TO_ALLV)


class Buffer(str, enum.Enum):
    """A rank's buffers."""

    IN = "in"
    OUT = "out"
    SCRATCH = "scratch"


class OpKind(str, enum.Enum):
    """What one operation does.

    SEND: send ``src`` to ``peer``.  RECV: ``dst`` := incoming.
    RECV_REDUCE: ``dst`` := ``src`` (op) incoming.  COPY: ``dst`` := ``src``.
    REDUCE: ``dst`` := ``dst`` (op) ``src``.
    """

    SEND = "send"
    RECV = "recv"
    RECV_REDUCE = "recv_reduce"
    COPY = "copy"
    REDUCE = "reduce"

    @property
    def is_transfer(self) -> bool:
        return self in (OpKind.SEND, OpKind.RECV, OpKind.RECV_REDUCE)

    @property
    def is_recv(self) -> bool:
        return self in (OpKind.RECV, OpKind.RECV_REDUCE)


@dataclass(frozen=True, order=True)
class ChunkRef:
    """Chunks ``[index, index + span)`` of one buffer."""

    buffer: Buffer
    index: int
    span: int = 1

    def indices(self) -> range:
        return range(self.index, self.index + self.span)

    def __str__(self) -> str:
        rng = f"{self.index}" if self.span == 1 else f"{self.index}:{self.index + self.span}"
        return f"{self.buffer.value}[{rng}]"

    def to_json(self) -> list[str | int]:
        return [self.buffer.value, self.index, self.span]

    @classmethod
    def from_json(cls, data: list[Any]) -> ChunkRef:
        return cls(Buffer(data[0]), int(data[1]), int(data[2]))


@dataclass(frozen=True)
class Op:
    """One operation of one rank in one step."""

    kind: OpKind
    src: ChunkRef | None = None
    dst: ChunkRef | None = None
    peer: int | None = None
    channel: int = 0

    @property
    def span(self) -> int:
        ref = self.src if self.kind == OpKind.SEND else self.dst
        assert ref is not None
        return ref.span

    def __str__(self) -> str:
        ch = f"@c{self.channel}" if self.channel else ""
        if self.kind == OpKind.SEND:
            return f"send {self.src} ->r{self.peer}{ch}"
        if self.kind == OpKind.RECV:
            return f"recv {self.dst} <-r{self.peer}{ch}"
        if self.kind == OpKind.RECV_REDUCE:
            local = "" if self.src == self.dst else f"{self.src}+"
            return f"recv+ {self.dst}={local}<-r{self.peer}{ch}"
        if self.kind == OpKind.COPY:
            return f"copy {self.dst}={self.src}"
        return f"reduce {self.dst}+={self.src}"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind.value}
        if self.src is not None:
            d["src"] = self.src.to_json()
        if self.dst is not None:
            d["dst"] = self.dst.to_json()
        if self.peer is not None:
            d["peer"] = self.peer
        if self.channel:
            d["channel"] = self.channel
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Op:
        return cls(OpKind(d["kind"]),
                   ChunkRef.from_json(d["src"]) if "src" in d else None,
                   ChunkRef.from_json(d["dst"]) if "dst" in d else None,
                   d.get("peer"), int(d.get("channel", 0)))


@dataclass(frozen=True)
class BufferLayout:
    """How a buffer is cut: ``nblocks`` blocks of ``nsegs`` segments.

    For SCRATCH, ``like`` names the buffer whose block sizes it copies and
    ``copies`` how many such copies it holds (chunk ``copy * nchunks(like) + i``).
    With ``own_block``, each copy holds only the rank's own block (block ``rank``
    of ``like`` cut into ``nblocks``): chunk ``copy * nsegs + seg`` (sharded servers).
    """

    nblocks: int
    nsegs: int = 1
    like: Buffer | None = None
    copies: int = 1
    own_block: bool = False

    @property
    def blocks_per_copy(self) -> int:
        return 1 if self.own_block else self.nblocks

    @property
    def nchunks(self) -> int:
        return self.blocks_per_copy * self.nsegs * self.copies

    def chunk(self, block: int, seg: int = 0, copy: int = 0) -> int:
        """The chunk index of (copy, block, segment)."""
        return (copy * self.blocks_per_copy + block) * self.nsegs + seg

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"nblocks": self.nblocks, "nsegs": self.nsegs}
        if self.like is not None:
            d["like"] = self.like.value
            d["copies"] = self.copies
        if self.own_block:
            d["own_block"] = True
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BufferLayout:
        return cls(int(d["nblocks"]), int(d.get("nsegs", 1)),
                   Buffer(d["like"]) if d.get("like") else None, int(d.get("copies", 1)),
                   bool(d.get("own_block", False)))


Step = tuple[Op, ...]


@dataclass(frozen=True)
class Schedule:
    """A frozen schedule: per rank, an ordered tuple of steps, each a tuple of ops."""

    collective: Collective
    algorithm: str
    nranks: int
    layouts: dict[Buffer, BufferLayout]
    programs: tuple[tuple[Step, ...], ...]
    root: int | None = None
    nchannels: int = 1
    params: dict[str, Any] = field(default_factory=dict)
    nswitches: int = 0   # in-network participants after the ranks (module docstring: switch)

    @property
    def nparticipants(self) -> int:
        """Ranks plus switches: the length of `programs`."""
        return self.nranks + self.nswitches

    def is_switch(self, participant: int) -> bool:
        """True if `participant` is a switch, not a rank."""
        return participant >= self.nranks

    @property
    def nsteps(self) -> int:
        return max((len(p) for p in self.programs), default=0)

    def steps(self, rank: int) -> tuple[Step, ...]:
        """The steps of one rank."""
        return self.programs[rank]

    def ops(self) -> Iterable[tuple[int, int, Op]]:
        """Every (rank, step, op)."""
        for r, prog in enumerate(self.programs):
            for s, step in enumerate(prog):
                for op in step:
                    yield r, s, op

    def table(self) -> str:
        """A readable per-rank, per-step table."""
        head = f"{self.collective.value} / {self.algorithm}: {self.nranks} ranks, {self.nsteps} steps"
        if self.root is not None:
            head += f", root {self.root}"
        if self.nchannels > 1:
            head += f", {self.nchannels} channels"
        if self.nswitches:
            head += f", {self.nswitches} switch(es) r{self.nranks}+"
        lines = [head]
        for s in range(self.nsteps):
            lines.append(f"step {s}:")
            for r, prog in enumerate(self.programs):
                ops = prog[s] if s < len(prog) else ()
                if ops:
                    who = f"r{r}" if r < self.nranks else f"r{r}(switch)"
                    lines.append(f"  {who}: " + "; ".join(str(o) for o in ops))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (schema version SCHEMA_VERSION)."""
        return {
            "schema": "ringflow.schedule", "version": SCHEMA_VERSION,
            "collective": self.collective.value, "algorithm": self.algorithm,
            "nranks": self.nranks, "root": self.root, "nchannels": self.nchannels,
            "params": self.params,
            "layouts": {b.value: lay.to_json() for b, lay in self.layouts.items()},
            "programs": [[[op.to_json() for op in step] for step in prog] for prog in self.programs],
            **({"nswitches": self.nswitches} if self.nswitches else {}),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, data: dict[str, Any] | str) -> Schedule:
        """Rebuild a schedule from `to_json` output; checks the schema version."""
        d: dict[str, Any] = json.loads(data) if isinstance(data, str) else data
        if d.get("schema") != "ringflow.schedule" or d.get("version") != SCHEMA_VERSION:
            raise InvalidArgument(f"not a ringflow schedule of version {SCHEMA_VERSION}: "
                                  f"schema={d.get('schema')!r} version={d.get('version')!r}",
                                  "write it with Schedule.to_json() of this ringflow version")
        return cls(Collective(d["collective"]), d["algorithm"], int(d["nranks"]),
                   {Buffer(b): BufferLayout.from_json(lay) for b, lay in d["layouts"].items()},
                   tuple(tuple(tuple(Op.from_json(o) for o in step) for step in prog)
                         for prog in d["programs"]),
                   d.get("root"), int(d.get("nchannels", 1)), dict(d.get("params", {})), int(d.get("nswitches", 0)))


class ScheduleBuilder:
    """Builds a Schedule op by op; `build()` freezes it. No global state."""

    def __init__(self, collective: Collective | str, nranks: int, algorithm: str, *,
                 layouts: dict[Buffer, BufferLayout], root: int | None = None,
                 nchannels: int = 1, **params: Any) -> None:
        if nranks < 1:
            raise InvalidArgument(f"nranks={nranks}", "need at least one rank")
        self.collective = Collective.parse(collective)
        if self.collective.has_root and (root is None or not 0 <= root < nranks):
            raise InvalidArgument(f"{self.collective.value} needs a root in [0, {nranks}), got {root}",
                                  "pass root=<rank>")
        self.nranks, self.algorithm, self.root = nranks, algorithm, root
        self.layouts = dict(layouts)
        nswitches = int(params.pop("nswitches", 0))   # switch participants (module docstring), after the ranks
        self.nchannels, self.params = nchannels, params
        if nswitches < 0:
            raise InvalidArgument(f"nswitches={nswitches}", "give 0 or more switch participants")
        self.nswitches = nswitches
        self._steps: list[dict[int, list[Op]]] = [dict() for _ in range(nranks + nswitches)]
        self._built = False

    def _add(self, rank: int, step: int, op: Op) -> None:
        if self._built:
            raise InvalidUsage("schedule already built", "create a new ScheduleBuilder")
        total = self.nranks + self.nswitches
        if not 0 <= rank < total or (op.peer is not None and not 0 <= op.peer < total):
            raise InvalidArgument(f"rank {rank} / peer {op.peer} outside [0, {total})",
                                  "ranks are 0..nranks-1, switches follow them")
        if step < 0:
            raise InvalidArgument(f"negative step {step}")
        for ref in (op.src, op.dst):
            if ref is not None and ref.buffer not in self.layouts:
                raise InvalidArgument(f"{ref} uses buffer {ref.buffer.value!r} with no layout",
                                      "declare it in layouts=")
        self._steps[rank].setdefault(step, []).append(op)

    def send(self, rank: int, step: int, peer: int, src: ChunkRef, channel: int = 0) -> None:
        self._add(rank, step, Op(OpKind.SEND, src=src, peer=peer, channel=channel))

    def recv(self, rank: int, step: int, peer: int, dst: ChunkRef, channel: int = 0) -> None:
        self._add(rank, step, Op(OpKind.RECV, dst=dst, peer=peer, channel=channel))

    def recv_reduce(self, rank: int, step: int, peer: int, dst: ChunkRef, src: ChunkRef | None = None,
                    channel: int = 0) -> None:
        self._add(rank, step, Op(OpKind.RECV_REDUCE, src=src or dst, dst=dst, peer=peer, channel=channel))

    def copy(self, rank: int, step: int, dst: ChunkRef, src: ChunkRef) -> None:
        self._add(rank, step, Op(OpKind.COPY, src=src, dst=dst))

    def reduce(self, rank: int, step: int, dst: ChunkRef, src: ChunkRef) -> None:
        self._add(rank, step, Op(OpKind.REDUCE, src=src, dst=dst))

    def transfer(self, step: int, sender: int, receiver: int, src: ChunkRef, dst: ChunkRef, *,
                 reduce: bool = False, local: ChunkRef | None = None, channel: int = 0) -> None:
        """A matched send on `sender` and receive (copy or reduce) on `receiver` in one step."""
        self.send(sender, step, receiver, src, channel)
        if reduce:
            self.recv_reduce(receiver, step, sender, dst, local, channel)
        else:
            self.recv(receiver, step, sender, dst, channel)

    def build(self) -> Schedule:
        """Freeze into a Schedule; every rank gets the same number of steps."""
        self._built = True
        nsteps = max((max(s) + 1 for s in self._steps if s), default=0)
        programs = tuple(tuple(tuple(steps.get(i, ())) for i in range(nsteps)) for steps in self._steps)
        return Schedule(self.collective, self.algorithm, self.nranks, dict(self.layouts), programs,
                        self.root, self.nchannels, dict(self.params), self.nswitches)


T = TypeVar("T")
MEMO_MAX = 4096   # schedules remembered per memoised property


def per_schedule(fn: Callable[[Schedule], T]) -> Callable[[Schedule], T]:
    """Memoise a property of a schedule's structure per schedule object (schedules are frozen: the same object
    always gives the same answer; a new object at a freed one's id is told apart by identity)."""
    memo: dict[int, tuple[Schedule, T]] = {}
    lock = threading.Lock()

    @functools.wraps(fn)
    def wrapper(schedule: Schedule) -> T:
        with lock:
            hit = memo.get(id(schedule))
        if hit is not None and hit[0] is schedule:
            return hit[1]
        value = fn(schedule)
        with lock:
            if len(memo) >= MEMO_MAX:
                memo.clear()
            memo[id(schedule)] = (schedule, value)
        return value
    return wrapper


@per_schedule
def is_self_checking(schedule: Schedule) -> bool:
    """True if step 0 moves exactly one channel-0 message each way between every pair of ranks: the
    runtime then checks the call's arguments on those messages instead of a CHECK exchange first."""
    n = schedule.nranks
    if n == 1:
        return True
    for r in range(n):
        prog = schedule.steps(r)
        if not prog:
            return False
        sends, recvs = [], []
        for op in prog[0]:
            if op.kind == OpKind.SEND:
                sends.append((op.peer, op.channel))
            elif op.kind.is_recv:
                recvs.append((op.peer, op.channel))
        want = sorted((p, 0) for p in range(n) if p != r)
        if sorted(sends) != want or sorted(recvs) != want:
            return False
    return True
