"""Pick the cheapest (algorithm, segments, channels) per (collective, size, ranks, topology).

Like NCCL's tuning table, but computed: every candidate schedule is priced with
`cost.schedule_cost` (alpha-beta on the topology, or on the documented single-host default
without one) and the cheapest wins. Results are cached per (collective, size bucket = next
power of two, nranks, topology, dtype size, root, RINGFLOW_ALGO, RINGFLOW_NCHANNELS), so a
repeated call costs a dictionary lookup.

``nbytes`` is S of the closed forms: the buffer for all_reduce / reduce / broadcast, the whole
output for all_gather / gather, the whole input for reduce_scatter / scatter, one rank's
input for all_to_all.

Candidates that need more scratch per rank than max(2 S, 32 MiB) (one-shot and the single
parameter server hold n copies of the buffer) are skipped unless RINGFLOW_ALGO restricts the choice.

RINGFLOW_ALGO restricts the choice: ``ring`` or ``ring,tree`` (every collective; names that
do not implement a collective are ignored for it, as NCCL_ALGO does), ``^one_shot`` (exclude),
or per collective ``allreduce:ring;allgather:bruck``. Unknown names raise UnknownAlgorithm.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import config
from ..errors import ConfigError, InvalidArgument, UnknownAlgorithm
from .cost import Cost, schedule_cost
from .layout import CallShape
from .registry import ALGORITHMS, algorithms_for, get_schedule, info
from .schedule import Collective, Schedule

if TYPE_CHECKING:  # pragma: no cover
    from ..topology import Topology

SEG_CHOICES = (1, 2, 4, 8, 16, 32)
MIN_SEG_BYTES = 4096  # no segment below 4 KiB: smaller pieces only add steps
# Candidates needing more scratch per rank than this are skipped unless RINGFLOW_ALGO names them
# (one-shot / the single parameter server keep n copies of the buffer): max(2 S, 32 MiB).
SCRATCH_CAP_FACTOR, SCRATCH_CAP_MIN_BYTES = 2, 32 * 2**20

Rings = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Candidate:
    """One priced candidate."""

    algorithm: str
    nsegs: int
    nchannels: int
    time_s: float
    steps: int
    bytes_per_rank: int
    scratch_bytes: int = 0
    messages: int = 0    # sum over steps of the most messages any rank sends + receives

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (time in microseconds)."""
        return {"algorithm": self.algorithm, "nsegs": self.nsegs, "nchannels": self.nchannels,
                "time_us": self.time_s * 1e6, "steps": self.steps, "bytes_per_rank": self.bytes_per_rank,
                "scratch_bytes": self.scratch_bytes, "messages": self.messages}


@dataclass(frozen=True)
class Choice:
    """The tuner's answer: the winner and every candidate, cheapest first."""

    collective: str
    nbytes: int
    nranks: int
    algorithm: str
    nsegs: int
    nchannels: int
    time_s: float
    candidates: tuple[Candidate, ...]
    topology: str | None
    rings: Rings | None = None
    host_groups: Rings | None = None

    def schedule(self, root: int | None = None) -> Schedule:
        """The chosen (cached) schedule, ready for an engine."""
        return get_schedule(self.collective, self.algorithm, self.nranks, root=root, nsegs=self.nsegs,
                            nchannels=self.nchannels, rings=self.rings, host_groups=self.host_groups)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times in microseconds)."""
        return {"collective": self.collective, "nbytes": self.nbytes, "nranks": self.nranks,
                "algorithm": self.algorithm, "nsegs": self.nsegs, "nchannels": self.nchannels,
                "time_us": self.time_s * 1e6, "topology": self.topology,
                "rings": [list(r) for r in self.rings] if self.rings else None,
                "candidates": [c.to_dict() for c in self.candidates]}


def parse_algo_spec(spec: str, collective: Collective | str) -> list[str]:
    """The algorithms RINGFLOW_ALGO allows for `collective` (all of them when unrestricted)."""
    c = Collective.parse(collective)
    valid = algorithms_for(c)
    spec = (spec or "").strip()
    if not spec:
        return valid
    glob: list[str] = []
    per: dict[Collective, list[str]] = {}
    exclude = False
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        if ":" in part:
            cname, listed = part.split(":", 1)
            try:
                coll = Collective.parse(cname.strip())
            except InvalidArgument as exc:
                raise ConfigError(f"RINGFLOW_ALGO={spec!r}: {exc.message}", exc.hint) from None
            per[coll] = [n.strip() for n in listed.split(",") if n.strip()]
        else:
            if part.startswith("^"):
                exclude, part = True, part[1:]
            glob += [n.strip() for n in part.split(",") if n.strip()]
    for names in [glob, *per.values()]:
        for name in names:
            info(name)  # UnknownAlgorithm listing the valid names
    if c in per:
        names = [info(n).name for n in per[c]]
        bad = [n for n in names if n not in valid]
        if bad:
            raise UnknownAlgorithm(f"RINGFLOW_ALGO={spec!r}: {', '.join(bad)} does not implement {c.value}",
                                   f"algorithms for {c.value}: {', '.join(valid)}")
        return names
    if glob:
        names = [info(n).name for n in glob]
        if exclude:
            kept = [v for v in valid if v not in names]
            return kept or valid
        kept = [n for n in names if n in valid]
        return kept or valid
    return valid


def count_for(c: Collective, nbytes: int, nranks: int, dtype_size: int) -> int:
    """Elements per call (CallShape.count) for S = nbytes of collective `c`."""
    if c.per_rank_sized:
        return max(nbytes // (dtype_size * nranks), 0)
    return max(nbytes // dtype_size, 0)


def _bucket(nbytes: int) -> int:
    return 1 if nbytes <= 1 else 1 << (nbytes - 1).bit_length()


_Key = tuple[Collective, int, int, tuple[int, str] | None, int, int | None, str, int, str]
_cache: dict[_Key, Choice] = {}
_lock = threading.Lock()


def _topo_context(topo: Topology | None, nranks: int,
                  nchannels_knob: int) -> tuple[list[tuple[int, Rings | None]], Rings | None]:
    """Channel options (nchannels, rings) and host groups for the candidates."""
    opts: list[tuple[int, Rings | None]]
    if topo is None:
        knob = config.get("RINGS")
        if knob and nchannels_knob <= 0:
            from ..topology import parse_rings
            parsed: Rings = tuple(parse_rings(str(knob), nranks))
            opts = [(1, parsed[:1])]
            if len(parsed) > 1:
                opts.append((len(parsed), parsed))
            return opts, None
        return ([(1, None)] if nchannels_knob <= 0 else [(nchannels_knob, None)]), None
    from ..topology import find_rings
    eps = topo.endpoints()[:nranks]
    if len(eps) < nranks:
        from ..errors import TopologyError
        raise TopologyError(f"topology {topo.name!r} has {len(eps)} endpoints, the job has {nranks} ranks",
                            "use a larger topology (e.g. '2xdgx-h100') or fewer ranks")
    found = find_rings(topo, eps, nchannels_knob if nchannels_knob > 0 else None)
    rings = tuple(tuple(r.ranks) for r in found)
    if nchannels_knob > 0:
        opts = [(nchannels_knob, rings)]
    else:
        opts = [(1, rings[:1])]
        if len(rings) > 1:
            opts.append((len(rings), rings))
    groups = topo.host_groups(eps)
    hg = tuple(tuple(g) for g in groups) if len(groups) > 1 and len({len(g) for g in groups}) == 1 else None
    return opts, hg


def choose(collective: Collective | str, nbytes: int, nranks: int, topo: Topology | None = None,
           dtype_size: int = 4, *, root: int | None = None) -> Choice:
    """The cheapest algorithm, segment and channel count for this call (cached)."""
    c = Collective.parse(collective)
    if nranks < 1 or nbytes < 0 or dtype_size < 1:
        raise InvalidArgument(f"nranks={nranks}, nbytes={nbytes}, dtype_size={dtype_size}",
                              "need nranks >= 1, nbytes >= 0, dtype_size >= 1")
    spec, nch = str(config.get("ALGO") or ""), int(config.get("NCHANNELS") or 0)
    rings_knob = str(config.get("RINGS") or "")
    bucket = _bucket(nbytes)
    if c.has_root and root is None:
        root = 0
    key: _Key = (c, bucket, nranks, None if topo is None else (id(topo), topo.name), dtype_size, root, spec, nch,
                 rings_knob)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    allowed = parse_algo_spec(spec, c)
    opts, hg = _topo_context(topo, nranks, nch)
    count = count_for(c, bucket, nranks, dtype_size)
    splits = tuple((count,) * nranks for _ in range(nranks)) if c == Collective.ALL_TO_ALLV else None
    shape = CallShape(c, nranks, count, dtype_size, splits)  # all_to_allv: priced with uniform splits
    cands: list[tuple[Candidate, Rings | None]] = []
    explicit = bool(spec) and len(allowed) < len(algorithms_for(c))
    scratch_cap = max(SCRATCH_CAP_FACTOR * bucket, SCRATCH_CAP_MIN_BYTES)
    for name in allowed:
        a = ALGORITHMS[name]
        if name == "hierarchical" and hg is None:
            continue
        segs = [s for s in SEG_CHOICES if s == 1 or bucket // s >= MIN_SEG_BYTES] if c in a.pipelined else [1]
        chans = opts if a.multichannel else [(1, None)]
        for nseg in segs:
            for nchan, rings in chans:
                sched = get_schedule(c, name, nranks, root=root, nsegs=nseg, nchannels=nchan, rings=rings,
                                     host_groups=hg if name == "hierarchical" else None)
                cost: Cost = schedule_cost(sched, shape, topo)
                if cost.scratch_bytes > scratch_cap and not explicit:
                    continue
                cands.append((Candidate(name, nseg, sched.nchannels, cost.time_s, cost.steps, cost.bytes_per_rank,
                                        cost.scratch_bytes, cost.messages), rings if a.multichannel else None))
    if not cands:
        raise UnknownAlgorithm(f"no algorithm left for {c.value} on {nranks} ranks",
                               f"RINGFLOW_ALGO={spec!r}; algorithms for {c.value}: {', '.join(algorithms_for(c))}")
    cands.sort(key=lambda x: (x[0].time_s, x[0].steps, x[0].algorithm, x[0].nsegs))
    best, rings = cands[0]
    choice = Choice(c.value, nbytes, nranks, best.algorithm, best.nsegs, best.nchannels, best.time_s,
                    tuple(x[0] for x in cands), None if topo is None else topo.name, rings,
                    hg if best.algorithm == "hierarchical" else None)
    with _lock:
        if len(_cache) > 4096:
            _cache.clear()
        _cache[key] = choice
    return choice


def clear_cache() -> None:
    """Forget cached choices (after changing a topology in place)."""
    with _lock:
        _cache.clear()
