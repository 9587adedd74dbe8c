"""Chakra execution traces: export a ringflow trace as one `.et` file per rank, and import `.et` files.

A Chakra file is a length-delimited protobuf stream (each message preceded by its size as a varint, as
Chakra's `protolib.encodeMessage` writes it): one GlobalMetadata, then the rank's Nodes. Per rank, each
call becomes a COMM_COLL_NODE, COMM_SEND_NODE or COMM_RECV_NODE, preceded by a COMP_NODE for the compute
before it; every node has a data dependency on the rank's previous blocking node (an asynchronous call's
node is not waited on by the nodes after it). Communication nodes carry Chakra's attributes `comm_type`,
`comm_size` (bytes, nccl-tests' size: all parts for a gather), `comm_src` / `comm_dst` / `comm_tag`,
`pg_name` (the group), `comm_group` (its global ranks) and `is_cpu_op`, plus `ringflow.call` (the call as
JSON) so that a ringflow trace comes back unchanged; traces from elsewhere are rebuilt from the Chakra fields.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import InvalidArgument
from ..recorded import TRACE_FORMAT
from ..replay import compute_gaps, instance_key, origin_ns, timeline, waited_key
from ..replay_sim import size_bytes_of

COMM_TYPES = {"all_reduce": 0, "reduce": 1, "all_gather": 2, "gather": 3, "scatter": 4, "broadcast": 5,
              "all_to_all": 6, "reduce_scatter": 7, "barrier": 9}
OPS = {v: k for k, v in COMM_TYPES.items()} | {8: "reduce_scatter"}   # REDUCE_SCATTER_BLOCK
CHAKRA_VERSION = "0.0.4"
FILE_RE = re.compile(r"\.(\d+)\.et$")


def _pb() -> Any:
    from . import et_def_pb2
    return et_def_pb2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _messages(data: bytes) -> Iterator[bytes]:
    i = 0
    while i < len(data):
        n = shift = 0
        while True:
            if i >= len(data):
                raise InvalidArgument("a Chakra file ends inside a message length", "the file is truncated")
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if i + n > len(data):
            raise InvalidArgument("a Chakra file ends inside a message", "the file is truncated")
        yield data[i:i + n]
        i += n


def _attr(pb: Any, name: str, **value: Any) -> Any:
    a = pb.AttributeProto(name=name)
    (kind, v), = value.items()
    if kind == "int64_list":
        a.int64_list.values.extend(v)
    else:
        setattr(a, kind, v)
    return a


def export(trace: dict[str, Any], directory: str | Path, name: str = "ringflow") -> list[Path]:
    """Write `<name>.<rank>.et` for every rank of the trace into `directory`; the files written."""
    pb = _pb()
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    groups = trace["groups"]
    t0 = origin_ns(trace)
    paths = []
    for rank, calls in sorted(timeline(trace).items()):
        waits = [c for c in calls if c["lane"] == "wait"]
        meta = pb.GlobalMetadata(version=CHAKRA_VERSION)
        meta.attr.extend([_attr(pb, "ringflow.format", string_val=TRACE_FORMAT),
                          _attr(pb, "ringflow.rank", int64_val=rank),
                          _attr(pb, "ringflow.trace", string_val=json.dumps(
                              {k: v for k, v in trace.items() if k not in ("calls", "waits")})),
                          _attr(pb, "ringflow.waits", string_val=json.dumps(waits))])
        out = [_varint(meta.ByteSize()) + meta.SerializeToString()]
        nid, chain = 0, None
        ids: dict[tuple, int] = {}     # this rank's operations -> their node
        waited: list[int] = []         # nodes a wait since the last node was on: the next node depends on them
        for c, gap in zip(calls, compute_gaps(calls, t0), strict=True):
            deps: list[int] = ([] if chain is None else [chain]) + waited
            if gap > 0:
                comp = pb.Node(id=nid, name="compute", type=pb.COMP_NODE, data_deps=deps,
                               start_time_micros=max(0, (c["enq_ns"] - t0) // 1000 - int(gap * 1e6)),
                               duration_micros=int(round(gap * 1e6)))
                comp.attr.append(_attr(pb, "is_cpu_op", bool_val=False))
                out.append(_varint(comp.ByteSize()) + comp.SerializeToString())
                deps, chain, nid, waited = [nid], nid, nid + 1, []
            if c["lane"] == "wait":
                if waited_key(c) in ids:
                    waited.append(ids[waited_key(c)])
                continue
            waited = []
            node = _comm_node(pb, nid, c, deps, groups, t0)
            out.append(_varint(node.ByteSize()) + node.SerializeToString())
            ids[instance_key(c)] = nid
            if not c.get("async"):
                chain = nid
            nid += 1
        p = d / f"{name}.{rank}.et"
        p.write_bytes(b"".join(out))
        paths.append(p)
    return paths


def _comm_node(pb: Any, nid: int, c: dict[str, Any], deps: list[int], groups: dict[str, Any], t0: int) -> Any:
    start, end = c.get("start_ns") or c["enq_ns"], c.get("end_ns") or c.get("start_ns") or c["enq_ns"]
    node = pb.Node(id=nid, name=f"{c['op']} #{c['seq']}", data_deps=deps,
                   start_time_micros=max(0, (start - t0) // 1000), duration_micros=max(0, (end - start) // 1000))
    attrs = [_attr(pb, "is_cpu_op", bool_val=False), _attr(pb, "pg_name", string_val=str(c["comm"])),
             _attr(pb, "ringflow.call", string_val=json.dumps(c, sort_keys=True))]
    nbytes = int(c.get("nbytes") or 0)
    if c["lane"] == "coll":
        node.type = pb.COMM_COLL_NODE
        members = [m for m in groups.get(c["comm"], []) if m is not None]
        op = str(c["op"])
        attrs += [_attr(pb, "comm_type", int64_val=COMM_TYPES.get(op, COMM_TYPES["all_to_all"])),
                  _attr(pb, "comm_size", int64_val=size_bytes_of(op, nbytes, len(members))),
                  _attr(pb, "comm_group", int64_list=members)]
    else:
        send = c["lane"] == "send"
        node.type = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
        pr = c.get("peer_rank")
        me, peer = int(c["rank"]), int(pr if pr is not None else c.get("peer") or 0)
        attrs += [_attr(pb, "comm_size", int64_val=nbytes), _attr(pb, "comm_src", int32_val=me if send else peer),
                  _attr(pb, "comm_dst", int32_val=peer if send else me),
                  _attr(pb, "comm_tag", int32_val=int(c.get("tag") or 0))]
    node.attr.extend(attrs)
    return node


def _value(a: Any) -> Any:
    kind = a.WhichOneof("value")
    if kind is None:
        return None
    v = getattr(a, kind)
    return list(v.values) if kind.endswith("_list") else v


def import_files(paths: list[Path] | str | Path) -> dict[str, Any]:
    """A ringflow trace from Chakra files (a directory of `*.<rank>.et`, or a list of files)."""
    pb = _pb()
    if isinstance(paths, (str, Path)):
        p = Path(paths)
        files = sorted(p.glob("*.et")) if p.is_dir() else [p]
    else:
        files = [Path(f) for f in paths]
    if not files:
        raise InvalidArgument(f"no .et files in {paths}", "export with `ringflow record chakra` or give .et files")
    calls: list[dict[str, Any]] = []
    waits: list[dict[str, Any]] = []
    base: dict[str, Any] | None = None
    groups: dict[str, list[int]] = {}
    ranks: list[int] = []
    for i, f in enumerate(files):
        msgs = list(_messages(f.read_bytes()))
        if not msgs:
            raise InvalidArgument(f"{f} is empty", "a Chakra file starts with its GlobalMetadata")
        meta = pb.GlobalMetadata.FromString(msgs[0])
        mattr = {a.name: _value(a) for a in meta.attr}
        m = FILE_RE.search(f.name)
        rank = int(mattr.get("ringflow.rank", int(m.group(1)) if m else i))
        ranks.append(rank)
        if base is None and "ringflow.trace" in mattr:
            base = json.loads(mattr["ringflow.trace"])
        waits.extend(json.loads(mattr.get("ringflow.waits") or "[]"))
        nodes = [pb.Node.FromString(b) for b in msgs[1:]]
        calls.extend(_calls_of(pb, rank, nodes, groups))
    if base is not None:
        return dict(base, calls=sorted(calls, key=lambda c: (c["enq_ns"], c["rank"])),
                    waits=sorted(waits, key=lambda c: (c["enq_ns"], c["rank"])))
    world = sorted(ranks)
    for c in calls:
        if c["comm"] == "":
            c["comm"] = "world"
    groups.setdefault("world", world)
    calls.sort(key=lambda c: (c["enq_ns"], c["rank"]))
    return {"format": TRACE_FORMAT, "clock": "chakra", "world": "world", "world_size": len(world),
            "groups": groups, "ranks": {str(r): {} for r in world}, "calls": calls, "flight": {}}


def _calls_of(pb: Any, rank: int, nodes: list[Any], groups: dict[str, list[int]]) -> list[dict[str, Any]]:
    """One rank's calls from its nodes; without `ringflow.call`, from the Chakra fields alone."""
    out = []
    seqs: dict[Any, int] = defaultdict(int)
    done: dict[int, int] = {}   # node id -> end time (us)
    for n in nodes:
        attrs = {a.name: _value(a) for a in n.attr}
        t_start = n.start_time_micros or max((done.get(d, 0) for d in n.data_deps), default=0)
        done[n.id] = t_start + n.duration_micros
        if n.type not in (pb.COMM_COLL_NODE, pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
            continue
        if "ringflow.call" in attrs:
            out.append(json.loads(attrs["ringflow.call"]))
            continue
        comm = str(attrs.get("pg_name") or "")
        size = int(attrs.get("comm_size") or 0)
        c: dict[str, Any] = {"kind": "call", "rank": rank, "enq_ns": t_start * 1000, "start_ns": t_start * 1000,
                             "end_ns": (t_start + n.duration_micros) * 1000, "status": "ok", "async": False,
                             "site": n.name, "dtype": "uint8"}
        if n.type == pb.COMM_COLL_NODE:
            members = [int(x) for x in attrs.get("comm_group") or []]
            if members and not comm:
                comm = "g" + "-".join(map(str, members))
            if members:
                groups.setdefault(comm, members)
            op = OPS.get(int(attrs.get("comm_type") or 0), "all_reduce")
            per = size // max(1, len(members)) if op in ("all_gather", "gather") and members else size
            c.update({"comm": comm, "lane": "coll", "seq": seqs[comm], "op": op, "count": per, "nbytes": per,
                      "root": None})
            seqs[comm] += 1
        else:
            src, dst, tag = int(attrs.get("comm_src") or 0), int(attrs.get("comm_dst") or 0), int(
                attrs.get("comm_tag") or 0)
            send = n.type == pb.COMM_SEND_NODE
            peer = dst if send else src
            key = ("p2p", comm, src, dst, tag)
            c.update({"comm": comm, "lane": "send" if send else "recv", "seq": seqs[key],
                      "op": "send" if send else "recv", "count": size, "nbytes": size, "peer": peer,
                      "peer_rank": peer, "tag": tag})
            seqs[key] += 1
        out.append(c)
    return out
