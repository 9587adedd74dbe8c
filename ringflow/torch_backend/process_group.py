"""`ProcessGroupRingflow`: a torch.distributed ProcessGroup whose operations run on a ringflow Communicator.

torch calls these methods with lists of CPU tensors and an options object; each builds a job that
stages the tensors (contiguous working views, complex as real pairs, bool as uint8), runs the
ringflow call with the group's (or the call's) timeout, and copies results back where the user's
tensor was not contiguous. Ranks are group-local, as in torch.
"""
from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..errors import InvalidArgument, InvalidUsage
from ..runtime.call.ops import tensor_view
from .convert import NATIVE, NUMPY_OF, Staged, op_of, pack, same_dtype, unpack, work_view
from .store import communicator_from_store, group_timeout_s
from .work import Lane, RingflowWork, finished

COLL, SEND, RECV = 0, 1, 2
_NO_TIME = datetime.timedelta(0)
_PREMUL_SUM = 8   # hash() of a ReduceOp is its RedOpType's value; PREMUL_SUM's factor varies (never cached)


def _numel_all(tensors: Sequence[torch.Tensor]) -> list[int]:
    return [int(t.numel()) for t in tensors]


class ProcessGroupRingflow(dist.ProcessGroup):
    """torch.distributed's process group for backend "ringflow" (CPU tensors)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta | float) -> None:
        super().__init__(rank, size)
        self._r, self._n = int(rank), int(size)   # cached: ProcessGroup.rank()/size() are calls into C++
        self._timeout_s = group_timeout_s(timeout)
        self.comm = communicator_from_store(store, rank, size, self._timeout_s)
        self._lanes = [Lane("coll"), Lane("send"), Lane("recv")]
        # the collective lane's parts the inline all_reduce reads (attribute look-ups, not property calls)
        self._coll, self._coll_lock, self._succeeded = self._lanes[COLL].runtime, self._lanes[COLL].lock, \
            self._lanes[COLL].succeeded
        self._group_name = ""
        self._op_cache: dict[tuple[int, torch.dtype], tuple[str, Any]] = {}
        # (op, NumPy dtype) -> the op's name, where ringflow reduces tensors of that dtype as they are
        self._direct_ops: dict[tuple[int, np.dtype], str] = {}

    # ---------------------------------------------------------------- identity
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """The backend's name."""
        return "ringflow"

    def name(self) -> str:
        """The backend's name."""
        return "ringflow"

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        """The name torch registered this group under (DeviceMesh and functional collectives resolve it)."""
        if not self._group_name:
            raise InvalidUsage("the process group has no name yet", "create it with init_process_group/new_group")
        return self._group_name

    def __repr__(self) -> str:
        return f"<ProcessGroupRingflow rank {self._r}/{self._n} name={self._group_name!r}>"

    # ---------------------------------------------------------------- dispatch
    def _timeout(self, opts: Any) -> float:
        """The call's timeout in seconds: the options' own where set (torch leaves it unset, -1 ms, or 0), else
        the group's."""
        t = getattr(opts, "timeout", None)
        s = t.total_seconds() if type(t) is datetime.timedelta else -1.0
        return s if s > 0 else self._timeout_s

    def _ops(self, opts: Any, tensors: Sequence[torch.Tensor]) -> list[tuple[str, Any]]:
        """op_of for each tensor, cached per (op, dtype) except PREMUL_SUM (its factor varies)."""
        op = _op(opts)
        kind = int(getattr(op, "op", op))
        out = []
        for x in tensors:
            key = (kind, x.dtype)
            hit = self._op_cache.get(key)
            if hit is None:
                hit = op_of(op, x.dtype)
                if hit[1] is None:
                    self._op_cache[key] = hit
            out.append(hit)
        return out

    def _submit(self, lane: int, what: str, body: Callable[[float], None], outputs: list[torch.Tensor],
                opts: Any = None) -> RingflowWork:
        timeout = self._timeout(opts)
        inline = opts is not None and not getattr(opts, "asyncOp", True)
        return self._lanes[lane].submit(lambda: body(timeout), what, outputs, inline)

    def _now(self, what: str, job: Callable[[float], object], outputs: list[torch.Tensor], opts: Any) -> RingflowWork:
        """Submit a call on the user's own tensors (the fast path: no staging objects, no body frame)."""
        t = self._timeout(opts)
        if not opts.asyncOp and not self._coll.busy and not self._coll.closed:   # the lane idle: run here
            with self._coll_lock:
                try:
                    job(t)
                except BaseException as exc:  # noqa: BLE001 - delivered through the Work
                    return finished(what, outputs, exc)
            return self._succeeded(what, outputs)
        return self._lanes[COLL].submit(lambda: job(t), what, outputs, False)

    def _reduce_flat(self, flat: torch.Tensor, name: str, factor: Any, t: float, root: int | None = None) -> None:
        if factor is not None:
            flat.mul_(factor)
        if root is None:
            self.comm.all_reduce(flat, name, timeout=t)
        else:
            self.comm.reduce(flat, root, name, timeout=t)

    # ---------------------------------------------------------------- reductions
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> RingflowWork:
        """All-reduce each tensor in place."""
        if opts is not None and len(tensors) == 1 and _HASH_IS_KIND:
            # the common case: ringflow reduces a NumPy view of the user's memory itself (no staging, no extra
            # frames); a fresh tensor and a repeated one both run through the door's remembered call shape
            a = tensor_view(tensors[0])
            if a is not None and (name := self._direct_ops.get((hash(opts.reduceOp), a.dtype))) is not None:
                tm = opts.timeout   # _timeout, inlined
                t = tm.total_seconds() if type(tm) is datetime.timedelta and tm > _NO_TIME else self._timeout_s
                if not opts.asyncOp and not self._coll.busy and not self._coll.closed:
                    # as _now, without the job's frame: the hottest call of training loops
                    with self._coll_lock:
                        try:
                            self.comm.all_reduce(a, name, timeout=t)
                        except BaseException as exc:  # noqa: BLE001 - delivered through the Work
                            return finished("allreduce", tensors, exc)
                    return self._succeeded("allreduce", tensors)
                return self._lanes[COLL].submit(lambda: self.comm.all_reduce(a, name, timeout=t), "allreduce",
                                                tensors, False)
        ops = self._ops(opts, tensors)
        if len(tensors) == 1 and opts is not None:
            x, (name, factor) = tensors[0], ops[0]
            if factor is None and x.dtype in NATIVE:
                kind = hash(_op(opts))
                if kind != _PREMUL_SUM and x.dtype in NUMPY_OF:
                    self._direct_ops[(kind, NUMPY_OF[x.dtype])] = name
                if x.is_contiguous() and not x.is_neg():   # bfloat16 or a first call: ringflow takes the tensor
                    return self._now("allreduce", lambda t: self.comm.all_reduce(x, name, timeout=t), tensors, opts)

        def body(t: float) -> None:
            for x, (name, factor) in zip(tensors, ops, strict=True):
                s = Staged(x)
                self._reduce_flat(s.arg, name, factor, t)
                s.finish()
        return self._submit(COLL, "allreduce", body, tensors, opts)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> RingflowWork:
        """All-reduce several tensors of one dtype as one flat buffer."""
        same_dtype(tensors, "allreduce_coalesced")
        name, factor = self._ops(opts, tensors[:1])[0]

        def body(t: float) -> None:
            flat = pack(tensors)
            self._reduce_flat(flat, name, factor, t)
            unpack(flat, tensors)
        return self._submit(COLL, "allreduce_coalesced", body, tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> RingflowWork:
        """Reduce each tensor into the root's."""
        root = int(opts.rootRank)
        ops = self._ops(opts, tensors)

        def body(t: float) -> None:
            for x, (name, factor) in zip(tensors, ops, strict=True):
                s = Staged(x)
                self._reduce_flat(s.arg, name, factor, t, root)
                if self._r == root:
                    s.finish()
        return self._submit(COLL, "reduce", body, tensors, opts)

    def _rs(self, out: torch.Tensor, flat_in: torch.Tensor, name: str, factor: Any, t: float) -> None:
        """Reduce-scatter flat_in (a private copy when it is scaled) into out."""
        so = Staged(out)
        if flat_in.numel() != self._n * so.flat.numel():
            raise InvalidArgument(f"reduce_scatter: input has {flat_in.numel()} elements, output "
                                  f"{so.flat.numel()}", f"input must be {self._n} x the output")
        if factor is not None:
            flat_in.mul_(factor)
        self.comm.reduce_scatter(flat_in, name, out=so.arg, timeout=t)
        so.finish()

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> RingflowWork:
        """Reduce the i-th input of every rank into rank i's output."""
        out, ins = output_tensors[0], input_lists[0]
        name, factor = self._ops(opts, [out])[0]
        if len(ins) != self._n or len(set(_numel_all(ins))) > 1:
            raise InvalidArgument(f"reduce_scatter: {len(ins)} inputs of sizes {_numel_all(ins)}",
                                  f"pass {self._n} inputs of equal size")
        return self._submit(COLL, "reduce_scatter", lambda t: self._rs(out, pack(ins), name, factor, t),
                            output_tensors, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> RingflowWork:
        """Reduce-scatter one flat input into output (reduce_scatter_tensor)."""
        name, factor = self._ops(opts, [output])[0]
        if opts is not None and factor is None and input.dim() == 1 and (o := tensor_view(output)) is not None \
                and (i := tensor_view(input)) is not None:
            return self._now("reduce_scatter_tensor",
                             lambda t: self.comm.reduce_scatter(i, name, out=o, timeout=t), [output], opts)
        return self._submit(COLL, "reduce_scatter_tensor",
                            lambda t: self._rs(output, self._private(input, factor is not None),
                                               name, factor, t), [output], opts)

    @staticmethod
    def _private(x: torch.Tensor, copy: bool) -> torch.Tensor:
        if copy:
            return work_view(x.detach()).reshape(-1).clone()
        s = Staged(x, writeback=False)
        return s.arg if s.arg.dim() == 1 else s.flat

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> RingflowWork:
        """reduce_scatter_single on each (output, input) pair, in one job."""
        ops = self._ops(opts, outputs)

        def body(t: float) -> None:
            for o, i, (name, factor) in zip(outputs, inputs, ops, strict=True):
                self._rs(o, self._private(i, factor is not None), name, factor, t)
        return self._submit(COLL, "reduce_scatter_tensor_coalesced", body, outputs, opts)

    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ---------------------------------------------------------------- data movement
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> RingflowWork:
        """Copy the root's tensors into every rank's."""
        root = int(opts.rootRank)
        if len(tensors) == 1 and (a := tensor_view(tensors[0])) is not None:
            return self._now("broadcast", lambda t: self.comm.broadcast(a, root, timeout=t), tensors, opts)

        def body(t: float) -> None:
            for x in tensors:
                s = Staged(x)
                self.comm.broadcast(s.arg, root, timeout=t)
                s.finish()
        return self._submit(COLL, "broadcast", body, tensors, opts)

    def _gather_list(self, outs: list[torch.Tensor], inp: torch.Tensor, t: float) -> None:
        """All-gather inp into the list outs (uneven sizes through an all-to-all with counts)."""
        flat = work_view(inp.detach()).reshape(-1)
        sizes = _numel_all(outs)
        if len(outs) != self._n:
            raise InvalidArgument(f"allgather: {len(outs)} outputs for {self._n} ranks", "one output per rank")
        buf = torch.empty(sum(sizes), dtype=flat.dtype)
        if len(set(sizes)) == 1 and sizes[0] == flat.numel():
            self.comm.all_gather(flat, out=buf, timeout=t)
        else:
            self.comm.all_to_all(flat.repeat(self._n), out=buf, send_counts=[flat.numel()] * self._n,
                                 recv_counts=sizes, timeout=t)
        unpack(buf, outs)

    def allgather(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                  opts: Any = None) -> RingflowWork:
        """Gather every rank's input into each rank's output list."""
        return self._submit(COLL, "allgather", lambda t: self._gather_list(output_lists[0], input_list[0], t),
                            output_lists[0], opts)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts: Any = None) -> RingflowWork:
        """allgather for each input, in one job."""
        def body(t: float) -> None:
            for outs, inp in zip(output_lists, input_list, strict=True):
                self._gather_list(outs, inp, t)
        return self._submit(COLL, "allgather_coalesced", body, [o for ol in output_lists for o in ol], opts)

    def _ag(self, out: torch.Tensor, inp: torch.Tensor, t: float) -> None:
        so, si = Staged(out), Staged(inp, writeback=False)
        if so.flat.numel() != self._n * si.flat.numel():
            raise InvalidArgument(f"all_gather_into_tensor: output has {so.flat.numel()} elements, input "
                                  f"{si.flat.numel()}", f"output must be {self._n} x the input")
        self.comm.all_gather(si.arg, out=so.arg, timeout=t)
        so.finish()

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> RingflowWork:
        """Gather every rank's input into one flat output (all_gather_into_tensor)."""
        if opts is not None and (o := tensor_view(output)) is not None and (i := tensor_view(input)) is not None:
            return self._now("all_gather_into_tensor", lambda t: self.comm.all_gather(i, out=o, timeout=t),
                             [output], opts)
        return self._submit(COLL, "all_gather_into_tensor", lambda t: self._ag(output, input, t), [output], opts)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> RingflowWork:
        """all_gather_single on each (output, input) pair, in one job."""
        def body(t: float) -> None:
            for o, i in zip(outputs, inputs, strict=True):
                self._ag(o, i, t)
        return self._submit(COLL, "all_gather_into_tensor_coalesced", body, outputs, opts)

    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> RingflowWork:
        """Gather every rank's input into the root's output list."""
        root, inp = int(opts.rootRank), input_tensors[0]
        outs = output_tensors[0] if self._r == root else []

        def body(t: float) -> None:
            flat = work_view(inp.detach()).reshape(-1)
            if outs and (len(outs) != self._n or set(_numel_all(outs)) != {flat.numel()}):
                raise InvalidArgument(f"gather: outputs {_numel_all(outs)} for an input of {flat.numel()}",
                                      f"the root passes {self._n} outputs the size of the input")
            buf = self.comm.gather(flat, root, out=torch.empty(self._n * flat.numel(), dtype=flat.dtype),
                                   timeout=t)
            if outs:
                unpack(buf, outs)
        return self._submit(COLL, "gather", body, outs, opts)

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> RingflowWork:
        """Give rank i the root's i-th input."""
        root, out = int(opts.rootRank), output_tensors[0]
        ins = input_tensors[0] if self._r == root else []

        def body(t: float) -> None:
            so = Staged(out)
            n = so.flat.numel()
            if ins and (len(ins) != self._n or set(_numel_all(ins)) != {n}):
                raise InvalidArgument(f"scatter: inputs {_numel_all(ins)} for an output of {n}",
                                      f"the root passes {self._n} inputs the size of the output")
            buf = pack(ins) if ins else torch.empty(self._n * n, dtype=so.flat.dtype)
            self.comm.scatter(buf, root, out=so.flat, timeout=t)
            so.finish()
        return self._submit(COLL, "scatter", body, output_tensors, opts)

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> RingflowWork:
        """Send input i to rank i; receive rank i's into output i."""
        def body(t: float) -> None:
            buf = torch.empty(sum(_numel_all(output_tensors)), dtype=work_view(output_tensors[0]).dtype)
            self.comm.all_to_all(pack(input_tensors), out=buf, send_counts=_numel_all(input_tensors),
                                 recv_counts=_numel_all(output_tensors), timeout=t)
            unpack(buf, output_tensors)
        return self._submit(COLL, "alltoall", body, output_tensors, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> RingflowWork:
        """all_to_all_single: rows of dim 0, equal or by split sizes."""
        if opts is not None and not output_split_sizes and not input_split_sizes \
                and (o := tensor_view(output)) is not None and (i := tensor_view(input)) is not None:
            return self._now("all_to_all_single", lambda t: self.comm.all_to_all(i, out=o, timeout=t), [output],
                             opts)

        def body(t: float) -> None:
            so = Staged(output)
            flat = self._private(input, False)
            if not output_split_sizes and not input_split_sizes:
                self.comm.all_to_all(flat, out=so.arg, timeout=t)
            else:
                n = self._n
                rin = flat.numel() // max(1, input.shape[0]) if input.dim() else 1
                rout = so.flat.numel() // max(1, output.shape[0]) if output.dim() else 1
                sc = list(input_split_sizes) or [input.shape[0] // n] * n
                rc = list(output_split_sizes) or [output.shape[0] // n] * n
                self.comm.all_to_all(flat, out=so.flat, send_counts=[int(s) * rin for s in sc],
                                     recv_counts=[int(r) * rout for r in rc], timeout=t)
            so.finish()
        return self._submit(COLL, "all_to_all_single", body, [output], opts)

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> RingflowWork:
        """Wait until every rank of the group arrives."""
        return self._submit(COLL, "barrier", lambda t: self.comm.barrier(timeout=t), [], opts)

    # ---------------------------------------------------------------- point to point
    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> RingflowWork:  # noqa: N803
        """Send each tensor to dstRank (matched by tag, in order)."""
        flats = [Staged(x, writeback=False).flat for x in tensors]

        def body(t: float) -> None:
            for f in flats:
                self.comm.send(f, int(dstRank), int(tag), timeout=t)
        return self._submit(SEND, f"send to {dstRank}", body, tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> RingflowWork:  # noqa: N803
        """Receive into each tensor from srcRank (matched by tag, in order)."""
        def body(t: float) -> None:
            for x in tensors:
                s = Staged(x)
                self.comm.recv(s.flat, int(srcRank), int(tag), timeout=t)
                s.finish()
        return self._submit(RECV, f"recv from {srcRank}", body, tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> RingflowWork:
        """Not supported: ringflow matches receives by source."""
        raise dist.DistBackendError("ringflow recv: InvalidArgument: receiving from any source is not supported "
                                    "(fix: pass src= to dist.recv / irecv)")

    # ---------------------------------------------------------------- lifetime
    def abort(self) -> None:
        """Abort: pending and later operations fail with DistBackendError; peers learn it."""
        self.comm.abort()

    def shutdown(self) -> None:
        """Finish queued operations and release the communicator."""
        for ln in self._lanes:
            ln.close(self._timeout_s)
        self.comm.destroy()




def _hash_is_kind() -> bool:
    """Whether hash() of a ReduceOp is its RedOpType's value in this torch (the direct-op cache keys on it)."""
    r = dist.ReduceOp
    kinds: list[Any] = [r.SUM, r.AVG, r.PRODUCT, r.MIN, r.MAX, r.BAND, r.BOR, r.BXOR]
    try:
        values = [int(k) for k in kinds]
        return [hash(r(k)) for k in kinds] == values and _PREMUL_SUM not in values
    except (TypeError, ValueError, AttributeError):
        return False


_HASH_IS_KIND = _hash_is_kind()


def _op(opts: Any) -> Any:
    return getattr(opts, "reduceOp", dist.ReduceOp.SUM) if opts is not None else dist.ReduceOp.SUM


def create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupRingflow:
    """The backend creator torch calls for every group (the default one and each new_group)."""
    try:
        return ProcessGroupRingflow(store, rank, size, timeout)
    except Exception as exc:
        raise dist.DistBackendError(f"ringflow: cannot create the process group (rank {rank} of {size}): "
                                    f"{type(exc).__name__}: {exc}") from exc
