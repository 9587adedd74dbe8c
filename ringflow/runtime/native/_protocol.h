/* Generated from ringflow/runtime/transport/protocol.py by setup.py: edit that file, not this one. */
#ifndef RINGFLOW_PROTOCOL_H
#define RINGFLOW_PROTOCOL_H

#define RF_MAGIC_WORD 5928509897422949681ull
#define RF_W_MAGIC 0ull
#define RF_W_NSLOTS 1ull
#define RF_W_SLOTB 2ull
#define RF_W_ADDR 3ull
#define RF_W_PID 4ull
#define RF_W_TAIL 8ull
#define RF_W_SWAIT 16ull
#define RF_W_RWAIT 24ull
#define RF_W_CMA 32ull
#define RF_W_SHEAD 40ull
#define RF_W_SSEQ 41ull
#define RF_W_RSEQ 48ull
#define RF_SLOT_HDR_WORD 64ull
#define RF_HDR_WORDS 8ull
#define RF_DATA_OFF 4096ull
#define RF_MAX_SLOTS 56ull
#define RF_REF_CMA 4294967295ull
#define RF_KIND_DATA 1ull
#define RF_KIND_CHECK 2ull
#define RF_KIND_RELAY 11ull
#define RF_DETAIL_MAX 4096ull
#define RF_ZERO_COPY_MIN_BYTES 65536ull
#define RF_CMA_MIN_BYTES 2097152ull
#define RF_CMA_COPY_MIN_BYTES 1048576ull
#define RF_PIPELINE_MIN_BYTES 33554432ull
#define RF_MIN_SLICE_BYTES 65536ull
#define RF_SLICES_PER_SLOT_MESSAGE 4ull
#define RF_CMA_CHUNK_BYTES 524288ull
#define RF_CMA_LARGE_CHUNK_BYTES 1048576ull
#define RF_CMA_LARGE_CHUNK_FROM_BYTES 16777216ull

/* name, value: the table _hotpath.protocol() returns */
#define RF_PROTOCOL_TABLE(X) \
    X(MAGIC_WORD) \
    X(W_MAGIC) \
    X(W_NSLOTS) \
    X(W_SLOTB) \
    X(W_ADDR) \
    X(W_PID) \
    X(W_TAIL) \
    X(W_SWAIT) \
    X(W_RWAIT) \
    X(W_CMA) \
    X(W_SHEAD) \
    X(W_SSEQ) \
    X(W_RSEQ) \
    X(SLOT_HDR_WORD) \
    X(HDR_WORDS) \
    X(DATA_OFF) \
    X(MAX_SLOTS) \
    X(REF_CMA) \
    X(KIND_DATA) \
    X(KIND_CHECK) \
    X(KIND_RELAY) \
    X(DETAIL_MAX) \
    X(ZERO_COPY_MIN_BYTES) \
    X(CMA_MIN_BYTES) \
    X(CMA_COPY_MIN_BYTES) \
    X(PIPELINE_MIN_BYTES) \
    X(MIN_SLICE_BYTES) \
    X(SLICES_PER_SLOT_MESSAGE) \
    X(CMA_CHUNK_BYTES) \
    X(CMA_LARGE_CHUNK_BYTES) \
    X(CMA_LARGE_CHUNK_FROM_BYTES) \

#endif
