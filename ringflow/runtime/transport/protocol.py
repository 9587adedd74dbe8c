"""The shared-memory protocol's numbers, defined once for every side that speaks it.

The Python transport (shm.py), the native executor (native/_hotpath.c) and the host model
(hostmodel/features.py) read the segment layout, the flag words and the size thresholds that pick a
message's path from here. setup.py writes them into the C header ``native/_protocol.h`` (`c_header`)
before it compiles, and ``_hotpath.protocol()`` returns the values the C module was built with, so a
test can compare them. This module imports nothing from ringflow: setup.py loads it by path.

Segment layout (one connection, created by the sender; word = 8 bytes)::

    word 0 ready magic (published last by the creator) | 1 nslots | 2 slot_bytes
    word 3 the segment's address in the sender         | 4 the sender's pid
    word 8 tail: slots consumed by the receiver        | 16 sender waiting | 24 receiver waiting
    word 32 set to 1 by the receiver if it can read the sender's memory (single copy, `cma`)
    word 40 the sender's next slot | 41 the sender's next message number | 48 the receiver's
    from word 64 (byte 512): one 8-word header per slot: flag (= slot number + 1, published after the
        data and the other header words), message seq, message nbytes, slice offset, sig, kind (low 32
        bits; high 32: region id + 1 of a message sent by reference), op_seq, tag
    from byte 4096: nslots data slots of slot_bytes each
"""
from __future__ import annotations

MAGIC_WORD = 0x52464C5753484D31  # 'RFLWSHM1'
W_MAGIC, W_NSLOTS, W_SLOTB, W_ADDR, W_PID = 0, 1, 2, 3, 4
W_TAIL, W_SWAIT, W_RWAIT, W_CMA = 8, 16, 24, 32
# each side's own position, kept in the segment so the native executor and shm.py share it: the sender's
# next slot and message numbers; the receiver's next slot is W_TAIL, its message number W_RSEQ
W_SHEAD, W_SSEQ, W_RSEQ = 40, 41, 48
SLOT_HDR_WORD = 64  # the first slot header's word; slot i's header is words SLOT_HDR_WORD + 8 i ..+ 7
HDR_WORDS = 8
H_FLAG, H_SEQ, H_TOTAL, H_OFF, H_SIG, H_KIND, H_OP_SEQ, H_TAG = range(HDR_WORDS)
DATA_OFF = 4096
MAX_SLOTS = (DATA_OFF - SLOT_HDR_WORD * 8) // (HDR_WORDS * 8)
REF_CMA = 0xFFFFFFFF  # the region field (id + 1) of a message sent by address (single copy)
KIND_DATA, KIND_CHECK, KIND_RELAY = 1, 2, 11  # transport.frames.Kind's values the shared-memory path carries
DETAIL_MAX = 4096  # bytes of a mismatched argument-check message a receiver keeps (the peer's call, in words)

ZERO_COPY_MIN_BYTES = 64 * 1024  # smaller messages are cheaper to copy than to hand over by reference
# a kernel copy pins both sides' pages and runs at about half the speed of an in-cache memcpy; it wins
# only where the slot path's two copies go to DRAM (2-rank all_reduce on a 2-vCPU VM, halving-doubling:
# 1 MiB messages 250-320 us through the slots against 430-860 us by kernel copy; 4 MiB messages faster
# by kernel copy)
CMA_MIN_BYTES = 2 * 2**20
# ... for a receiver that copies from a source the sender has not just written (no dirty lines in the
# sender's cache to cross cores): a kernel copy into the destination replaces two memcpys (into the
# slot, out of it) from here (2-rank broadcast, all_gather and all_to_all of 512 KiB: 26-43, 67-75 and
# 70-77 us through the slots against 57-75, 107-112 and 88-98 us by kernel copy; 1 MiB about even)
CMA_COPY_MIN_BYTES = 2**20
# a lone sender (nothing else to do in its step) with a core of its own copies slices into the slots
# while the receiver drains them: two cores on one message. A single kernel copy from cache is as
# fast; once source and destination leave the cache it is not (2-rank broadcast on this VM: equal at
# 32 MiB, 12.5 vs 8 GB/s at 64 MiB; 10.5 vs 12 GB/s the other way round at 8 MiB)
PIPELINE_MIN_BYTES = 32 * 2**20
# a message that fits in one slot is still cut into a few slices, so the receiver copies one slice
# while the sender fills the next (one copy's latency instead of two in a row); never below this
MIN_SLICE_BYTES = 64 * 1024
SLICES_PER_SLOT_MESSAGE = 4
# a single-copy reduction reads the peer's data in chunks of this size into a cache-resident buffer
# (cma.chunk_bytes); messages from CMA_LARGE_CHUNK_FROM_BYTES up take the larger chunk
CMA_CHUNK_BYTES, CMA_LARGE_CHUNK_BYTES, CMA_LARGE_CHUNK_FROM_BYTES = 512 * 1024, 2**20, 16 * 2**20

# the names the C header defines (RF_<name>), in order
C_NAMES = ("MAGIC_WORD", "W_MAGIC", "W_NSLOTS", "W_SLOTB", "W_ADDR", "W_PID", "W_TAIL", "W_SWAIT", "W_RWAIT",
           "W_CMA", "W_SHEAD", "W_SSEQ", "W_RSEQ", "SLOT_HDR_WORD", "HDR_WORDS", "DATA_OFF", "MAX_SLOTS",
           "REF_CMA", "KIND_DATA", "KIND_CHECK", "KIND_RELAY", "DETAIL_MAX", "ZERO_COPY_MIN_BYTES",
           "CMA_MIN_BYTES", "CMA_COPY_MIN_BYTES", "PIPELINE_MIN_BYTES", "MIN_SLICE_BYTES", "SLICES_PER_SLOT_MESSAGE",
           "CMA_CHUNK_BYTES", "CMA_LARGE_CHUNK_BYTES", "CMA_LARGE_CHUNK_FROM_BYTES")
HEADER_PATH = "ringflow/runtime/native/_protocol.h"  # relative to the repository root


def constants() -> dict[str, int]:
    """Every protocol number the C side uses, by name."""
    g = globals()
    return {name: int(g[name]) for name in C_NAMES}


def c_header() -> str:
    """The text of native/_protocol.h: one #define per protocol number (generated; see setup.py)."""
    lines = ["/* Generated from ringflow/runtime/transport/protocol.py by setup.py: edit that file, not this one. */",
             "#ifndef RINGFLOW_PROTOCOL_H", "#define RINGFLOW_PROTOCOL_H", ""]
    lines += [f"#define RF_{name} {value}ull" for name, value in constants().items()]
    lines += ["", "/* name, value: the table _hotpath.protocol() returns */", "#define RF_PROTOCOL_TABLE(X) \\"]
    lines += [f"    X({name}) \\" for name in C_NAMES]
    lines += ["", "#endif", ""]
    return "\n".join(lines)


def slice_bytes(total: int, slot_bytes: int) -> int:
    """Bytes per slice of a `total`-byte message (both ends and both executors derive it from the header's total)."""
    if total <= 2 * MIN_SLICE_BYTES:
        return slot_bytes
    per = -(-total // SLICES_PER_SLOT_MESSAGE)
    return min(slot_bytes, max(MIN_SLICE_BYTES, per + (-per) % 64))
