/* The native executor: runs one rank's compiled plan of a collective over shared-memory slots
 * without returning to Python between steps, the GIL released.
 *
 * It speaks the shared-memory protocol of ringflow/runtime/transport/shm.py (the module docstring
 * there has the segment layout) word for word, so a peer on the Python path and one on this path
 * talk to each other. A plan is built once per call shape and bound arrays (hotpath.py) and run
 * many times. `run` returns when the plan is done, when a step found a mismatched message, on an
 * error, or after one bounded sleep without progress (STALLED), so Python can check abort, peers
 * that left and the deadline, then call `run` again to resume where it stopped.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stddef.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* the shared-memory protocol's numbers: generated from transport/protocol.py by setup.py */
#include "_protocol.h"
#include "_copy.h"
#define W_TAIL RF_W_TAIL
#define W_SWAIT RF_W_SWAIT
#define W_RWAIT RF_W_RWAIT
#define W_CMA RF_W_CMA
#define W_PID RF_W_PID
#define W_SHEAD RF_W_SHEAD
#define W_SSEQ RF_W_SSEQ
#define W_RSEQ RF_W_RSEQ
#define SLOT_HDR_WORD RF_SLOT_HDR_WORD
#define HDR_WORDS RF_HDR_WORDS
#define DATA_OFF RF_DATA_OFF
#define MAX_SLOTS RF_MAX_SLOTS
#define REF_CMA RF_REF_CMA
#define KIND_DATA RF_KIND_DATA
#define KIND_CHECK RF_KIND_CHECK
#define ZERO_COPY_MIN_BYTES ((int64_t)RF_ZERO_COPY_MIN_BYTES)
#define PIPELINE_MIN_BYTES ((int64_t)RF_PIPELINE_MIN_BYTES)
#define MIN_SLICE_BYTES ((int64_t)RF_MIN_SLICE_BYTES)
#define SLICES_PER_SLOT_MESSAGE ((int64_t)RF_SLICES_PER_SLOT_MESSAGE)
#define DETAIL_MAX ((int64_t)RF_DETAIL_MAX)

enum { T_SEND = 0, T_RECV = 1, T_RECV_REDUCE = 2, T_COPY = 3, T_REDUCE = 4 };
enum { RC_DONE = 0, RC_STALLED = 1, RC_MISMATCH = 2, RC_PROTOCOL = 3, RC_CMA = 4, RC_REGION = 5 };
enum { CHECK_RC = 16 }; /* a Runner's check exchange returned CHECK_RC + its rc (the plan has not started) */
enum { D_BOOL, D_I8, D_U8, D_I16, D_U16, D_I32, D_U32, D_I64, D_U64, D_F16, D_BF16, D_F32, D_F64 };
enum { O_SUM, O_PROD, O_MIN, O_MAX, O_BAND, O_BOR, O_BXOR };

/* ------------------------------------------------------------------ reductions: out = a (op) b */
#define INT_LOOP(T, EXPR)                                                                                   \
    do {                                                                                                    \
        T *o = (T *)out;                                                                                    \
        const T *x = (const T *)a, *y = (const T *)b;                                                       \
        for (int64_t i = 0; i < n; i++) {                                                                   \
            T p = x[i], q = y[i];                                                                           \
            o[i] = (T)(EXPR);                                                                               \
        }                                                                                                   \
    } while (0)

/* integer ops wrap as NumPy's do: sums and products in the unsigned type of the same width */
#define INT_OPS(T, UT)                                                                                      \
    switch (op) {                                                                                           \
    case O_SUM: INT_LOOP(T, (UT)p + (UT)q); return 0;                                                       \
    case O_PROD: INT_LOOP(T, (UT)p * (UT)q); return 0;                                                      \
    case O_MIN: INT_LOOP(T, p < q ? p : q); return 0;                                                       \
    case O_MAX: INT_LOOP(T, p > q ? p : q); return 0;                                                       \
    case O_BAND: INT_LOOP(T, p & q); return 0;                                                              \
    case O_BOR: INT_LOOP(T, p | q); return 0;                                                               \
    case O_BXOR: INT_LOOP(T, p ^ q); return 0;                                                              \
    }                                                                                                       \
    return -1

/* NumPy's minimum/maximum: a NaN on either side wins */
#define FMIN(p, q) ((isnan(p) || (p) < (q)) ? (p) : (q))
#define FMAX(p, q) ((isnan(p) || (p) > (q)) ? (p) : (q))

#define FLOAT_OPS(T)                                                                                        \
    switch (op) {                                                                                           \
    case O_SUM: INT_LOOP(T, p + q); return 0;                                                               \
    case O_PROD: INT_LOOP(T, p * q); return 0;                                                              \
    case O_MIN: INT_LOOP(T, FMIN(p, q)); return 0;                                                          \
    case O_MAX: INT_LOOP(T, FMAX(p, q)); return 0;                                                          \
    }                                                                                                       \
    return -1

static inline float bf16_to_f(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f_to_bf16(float f) /* round to nearest even, as ml_dtypes */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f))
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* half precision: computed in float and rounded once, as NumPy's float16 and ml_dtypes' bfloat16 do */
#define HALF_OPS(T, TO_F, FROM_F)                                                                           \
    do {                                                                                                    \
        T *o = (T *)out;                                                                                    \
        const T *x = (const T *)a, *y = (const T *)b;                                                       \
        for (int64_t i = 0; i < n; i++) {                                                                   \
            float p = TO_F(x[i]), q = TO_F(y[i]), r;                                                        \
            switch (op) {                                                                                   \
            case O_SUM: r = p + q; break;                                                                   \
            case O_PROD: r = p * q; break;                                                                  \
            case O_MIN: r = FMIN(p, q); break;                                                              \
            case O_MAX: r = FMAX(p, q); break;                                                              \
            default: return -1;                                                                             \
            }                                                                                               \
            o[i] = FROM_F(r);                                                                               \
        }                                                                                                   \
        return 0;                                                                                           \
    } while (0)

#define F16_TO_F(h) ((float)(h))
#define F_TO_F16(f) ((_Float16)(f))

static int reduce(int dtype, int op, void *out, const void *a, const void *b, int64_t n)
{
    switch (dtype) {
    case D_BOOL: {
        uint8_t *o = (uint8_t *)out;
        const uint8_t *x = (const uint8_t *)a, *y = (const uint8_t *)b;
        for (int64_t i = 0; i < n; i++) {
            uint8_t p = x[i] != 0, q = y[i] != 0;
            switch (op) {
            case O_SUM: case O_MAX: case O_BOR: o[i] = p | q; break;
            case O_PROD: case O_MIN: case O_BAND: o[i] = p & q; break;
            case O_BXOR: o[i] = p ^ q; break;
            default: return -1;
            }
        }
        return 0;
    }
    case D_I8: INT_OPS(int8_t, uint8_t);
    case D_U8: INT_OPS(uint8_t, uint8_t);
    case D_I16: INT_OPS(int16_t, uint16_t);
    case D_U16: INT_OPS(uint16_t, uint16_t);
    case D_I32: INT_OPS(int32_t, uint32_t);
    case D_U32: INT_OPS(uint32_t, uint32_t);
    case D_I64: INT_OPS(int64_t, uint64_t);
    case D_U64: INT_OPS(uint64_t, uint64_t);
    case D_F32: FLOAT_OPS(float);
    case D_F64: FLOAT_OPS(double);
    case D_F16: HALF_OPS(_Float16, F16_TO_F, F_TO_F16);
    case D_BF16: HALF_OPS(uint16_t, bf16_to_f, f_to_bf16);
    }
    return -1;
}

/* ------------------------------------------------------------------ the plan */
typedef struct {
    int type, kind, peer, prev; /* prev: the earlier op of this step on the same connection, or -1 */
    volatile uint64_t *ctl;     /* the connection's control words */
    char *slots;
    uint64_t nslots, slot_bytes;
    char *data, *src;           /* data: what is sent / where it lands; src: the reduce's other operand */
    int dbuf, sbuf;             /* which call buffer (0 IN, 1 OUT, 2 SCRATCH, 3 the plan's own) each lies in */
    int64_t doff, soff;         /* and at which byte offset */
    int64_t nbytes, want;       /* want < 0: an argument-check message of any size, discarded */
    int64_t cma_min;            /* a send from here up goes by address when the receiver can read it */
    int pipelined, bell, snapshot;
    int early;                  /* a local op that may run once the step's receives passed their checks */
    uint64_t ref_rid, ref_off;  /* a send from a comm.alloc region: (region id + 1, offset); 0: none (per call) */
    char *snap;                 /* the snapshot of a send whose source this step overwrites */
    char *region;               /* the peer's alloc region this receive reads (set by Python) */
    uint64_t region_rid, region_size;
    /* progress */
    int done, first, drain;
    int64_t off, total, slice;
    uint64_t posted;
    uint64_t tail_seen;         /* the receiver's tail as last read (a send reads it again only when that is full) */
    uint64_t got_total, got_sig, got_rid;
    int bad;
    char *detail;
    int64_t detail_len;
} hop_t;

typedef struct {
    PyObject_HEAD
    hop_t *ops;
    int nops, nsteps, *step_start; /* ops of step s: [step_start[s], step_start[s + 1]) */
    int dtype, op, itemsize;
    struct sockaddr_un *bells;
    socklen_t *bell_len;
    int nbells;
    char *bounce;
    int64_t bounce_bytes;
    char *base[4];                 /* this call's IN, OUT and SCRATCH addresses, and the plan's own payload */
    uint64_t sig, op_seq;          /* this call's signature (32 bits, as on the wire) and sequence number */
    const uint64_t *spans;         /* this call's comm.alloc regions: (start, end, region id) triples */
    int64_t nspans;
    int step;                      /* the step to resume at */
    int step_started;
    int early_ran;                 /* the step's early local ops have run */
    int err_op;                    /* the op an error or a region request is about */
    int64_t err_code;
    PyObject *keep;                /* arrays this plan points into */
} HotPlan;

static int bell_fd = -1;
static unsigned long long n_runs, n_cma_reads; /* calls completed natively, messages read by single copy */
/* where the waits went (benchmarks/call_overhead.py --parts): waits, their nanoseconds, sleeps on the doorbell,
   doorbells rung for a sleeping peer */
static __thread unsigned long long n_waits, wait_ns, n_sleeps, n_rings;   /* the calling thread's */

static void ring(HotPlan *p, int b)
{
    if (b < 0 || b >= p->nbells)
        return;
    int fd = __atomic_load_n(&bell_fd, __ATOMIC_ACQUIRE);
    if (fd < 0) { /* one sending socket per process; two threads racing to make it keep the first */
        int mine = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), none = -1;
        if (mine < 0)
            return;
        if (__atomic_compare_exchange_n(&bell_fd, &none, mine, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            fd = mine;
        } else {
            close(mine);
            fd = none;
        }
    }
    n_rings++;
    (void)sendto(fd, "\1", 1, MSG_DONTWAIT, (struct sockaddr *)&p->bells[b], p->bell_len[b]);
}

static inline uint64_t ld(volatile uint64_t *w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
static inline void st(volatile uint64_t *w, uint64_t v) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }

static int64_t slice_bytes(int64_t total, int64_t slot_bytes)
{
    if (total <= 2 * MIN_SLICE_BYTES)
        return slot_bytes;
    int64_t per = (total + SLICES_PER_SLOT_MESSAGE - 1) / SLICES_PER_SLOT_MESSAGE;
    per += (-per) & 63;
    if (per < MIN_SLICE_BYTES)
        per = MIN_SLICE_BYTES;
    return per < slot_bytes ? per : slot_bytes;
}

static inline volatile uint64_t *hdr(hop_t *o, uint64_t h) { return o->ctl + SLOT_HDR_WORD + (h % o->nslots) * HDR_WORDS; }

/* ------------------------------------------------------------------ sending */
/* True if slot h is free. The tail (the receiver's word) is read only when the last value read says the ring is
 * full: it only grows, so an old value errs on the safe side, and the sender spares a cache miss per message. */
static inline int slot_free(hop_t *o, uint64_t h)
{
    return h - o->tail_seen < o->nslots || h - (o->tail_seen = ld(&o->ctl[W_TAIL])) < o->nslots;
}

static int send_ref(HotPlan *p, hop_t *o, uint64_t rid, uint64_t off)
{
    volatile uint64_t *c = o->ctl;
    int moved = 0;
    if (!o->posted) {
        uint64_t h = c[W_SHEAD];
        if (!slot_free(o, h))
            return 0;
        volatile uint64_t *b = hdr(o, h);
        b[1] = c[W_SSEQ];
        b[2] = (uint64_t)o->total;
        b[3] = off;
        b[4] = p->sig;
        b[5] = (uint64_t)o->kind | (rid << 32);
        b[6] = p->op_seq;
        b[7] = 0;
        st(&b[0], h + 1);
        c[W_SHEAD] = o->posted = h + 1;
        moved = 1;
        if (ld(&c[W_RWAIT]))
            ring(p, o->bell);
    }
    if (ld(&c[W_TAIL]) >= o->posted) {
        o->done = 1;
        c[W_SSEQ] = c[W_SSEQ] + 1;
        return 1;
    }
    return moved;
}

static int send_progress(HotPlan *p, hop_t *o)
{
    if (o->ref_rid)
        return send_ref(p, o, o->ref_rid, o->ref_off);
    if (o->total >= ZERO_COPY_MIN_BYTES && o->total >= o->cma_min && ld(&o->ctl[W_CMA]) == 1 &&
        !(o->pipelined && o->total >= PIPELINE_MIN_BYTES))
        return send_ref(p, o, REF_CMA, (uint64_t)(uintptr_t)(o->snapshot ? o->snap : o->data));
    volatile uint64_t *c = o->ctl;
    const char *src = o->snapshot ? o->snap : o->data;
    int moved = 0;
    while (!o->done) {
        uint64_t h = c[W_SHEAD];
        if (!slot_free(o, h))
            return moved;
        uint64_t i = h % o->nslots;
        int64_t n = o->total - o->off;
        if (n > o->slice)
            n = o->slice;
        if (n > 0)
            rf_copy(o->slots + i * o->slot_bytes, src + o->off, (size_t)n);
        volatile uint64_t *b = o->ctl + SLOT_HDR_WORD + i * HDR_WORDS;
        b[1] = c[W_SSEQ];
        b[2] = (uint64_t)o->total;
        b[3] = (uint64_t)o->off;
        b[4] = p->sig;
        b[5] = (uint64_t)o->kind;
        b[6] = p->op_seq;
        b[7] = 0;
        st(&b[0], h + 1);
        c[W_SHEAD] = h + 1;
        o->off += n;
        moved = 1;
        if (o->off >= o->total) {
            o->done = 1;
            c[W_SSEQ] = c[W_SSEQ] + 1;
        }
        if (ld(&c[W_RWAIT]))
            ring(p, o->bell);
    }
    return moved;
}

/* ------------------------------------------------------------------ receiving */
static int consume(HotPlan *p, hop_t *o, int64_t off, const char *data, int64_t n)
{
    if (o->type == T_RECV) {
        rf_copy(o->data + off, data, (size_t)n);
        return 0;
    }
    return reduce(p->dtype, p->op, o->data + off, o->src + off, data, n / p->itemsize);
}

/* the bounce buffer of CMA reads: bounce_bytes usable from any page offset (allocated with the plan when it
 * reduces CMA reads, else at the first read that needs it); 0 if it cannot be had (the read then goes direct) */
static int ensure_bounce(HotPlan *p)
{
    if (p->bounce)
        return 1;
    if (!(p->bounce = malloc((size_t)RF_CMA_CHUNK_BYTES + 4096u)))
        return 0;
    p->bounce_bytes = (int64_t)RF_CMA_CHUNK_BYTES;
    return 1;
}

static int recv_ref(HotPlan *p, hop_t *o, uint64_t rid, uint64_t off, int64_t total)
{
    if (rid != REF_CMA) {
        if (o->region_rid != rid)
            return RC_REGION;
        if (off > o->region_size || (uint64_t)total > o->region_size - off) /* no wrap-around on a corrupt offset */
            return RC_PROTOCOL;
        return consume(p, o, 0, o->region + off, total) ? RC_PROTOCOL : RC_DONE;
    }
    pid_t pid = (pid_t)o->ctl[W_PID];
    int64_t got = 0;
    __atomic_add_fetch(&n_cma_reads, 1, __ATOMIC_RELAXED);
    /* the kernel's copy has memcpy's 4 KiB-alias slow case (_copy.h): such a read goes through the bounce buffer,
     * placed at the source's page offset */
    if (o->type == T_RECV && !(rf_copy_aliases(o->data, (const void *)(uintptr_t)off, (size_t)total) &&
                               ensure_bounce(p))) {
        while (got < total) {
            struct iovec l = {o->data + got, (size_t)(total - got)}, r = {(void *)(uintptr_t)(off + got),
                                                                         (size_t)(total - got)};
            ssize_t k = process_vm_readv(pid, &l, 1, &r, 1, 0);
            if (k <= 0) {
                p->err_code = k < 0 ? errno : EIO;
                return RC_CMA;
            }
            got += k;
        }
        return RC_DONE;
    }
    int64_t step = p->bounce_bytes - p->bounce_bytes % p->itemsize;
    for (int64_t at = 0; at < total; at += step) {
        int64_t n = total - at < step ? total - at : step, g = 0;
        char *bb = p->bounce + ((off + (uint64_t)at - (uint64_t)(uintptr_t)p->bounce) & 4095u);
        while (g < n) {
            struct iovec l = {bb + g, (size_t)(n - g)}, r = {(void *)(uintptr_t)(off + at + g), (size_t)(n - g)};
            ssize_t k = process_vm_readv(pid, &l, 1, &r, 1, 0);
            if (k <= 0) {
                p->err_code = k < 0 ? errno : EIO;
                return RC_CMA;
            }
            g += k;
        }
        if (consume(p, o, at, bb, n))
            return RC_PROTOCOL;
    }
    return RC_DONE;
}

/* returns -1 nothing moved, 0 moved, or an RC_ error (> 0) */
static int recv_progress(HotPlan *p, hop_t *o, uint64_t sig)
{
    volatile uint64_t *c = o->ctl;
    int moved = -1;
    while (!o->done) {
        uint64_t h = c[W_TAIL];
        volatile uint64_t *b = hdr(o, h);
        if (ld(&b[0]) != h + 1)
            return moved;
        int64_t total = (int64_t)b[2], off = (int64_t)b[3];
        if (o->first) {
            o->first = 0;
            o->total = total;
            o->slice = slice_bytes(total, (int64_t)o->slot_bytes);
            if (b[1] != c[W_RSEQ]) {
                p->err_code = (int64_t)b[1];
                return RC_PROTOCOL;
            }
            uint64_t kind = b[5] & 0xFFFFFFFFull, want_kind = o->want < 0 ? KIND_CHECK : KIND_DATA;
            o->got_sig = b[4];
            o->got_total = (uint64_t)total;
            if (kind != want_kind || b[4] != (sig & 0xFFFFFFFFull) || (o->want >= 0 && total != o->want))
                o->bad = 1;
            if (o->bad || o->want < 0)
                o->drain = 1;
        }
        uint64_t rid = b[5] >> 32;
        if (rid) {
            if (!o->drain) {
                int rc = recv_ref(p, o, rid, b[3], total);
                if (rc == RC_REGION)
                    o->got_rid = rid;
                if (rc != RC_DONE)
                    return rc;
            }
            o->off = total;
            st(&c[W_TAIL], h + 1);
            o->done = 1;
            c[W_RSEQ] = c[W_RSEQ] + 1;
            if (ld(&c[W_SWAIT]))
                ring(p, o->bell);
            return 0;
        }
        if (off != o->off || total != o->total || off > total) {
            p->err_code = off;
            return RC_PROTOCOL;
        }
        int64_t n = total - off;
        if (n > o->slice)
            n = o->slice;
        const char *slot = o->slots + (h % o->nslots) * o->slot_bytes;
        if (o->drain) {
            if ((b[5] & 0xFFFFFFFFull) == KIND_CHECK && o->detail_len < DETAIL_MAX) {
                int64_t k = DETAIL_MAX - o->detail_len < n ? DETAIL_MAX - o->detail_len : n;
                memcpy(o->detail + o->detail_len, slot, (size_t)k);
                o->detail_len += k;
            }
        } else if (n > 0 && consume(p, o, off, slot, n)) {
            return RC_PROTOCOL;
        }
        o->off = off + n;
        st(&c[W_TAIL], h + 1);
        moved = 0;
        if (o->off >= total) {
            o->done = 1;
            c[W_RSEQ] = c[W_RSEQ] + 1;
        }
        if (ld(&c[W_SWAIT]))
            ring(p, o->bell);
    }
    return moved;
}

static int ready(hop_t *o)
{
    volatile uint64_t *c = o->ctl;
    if (o->type == T_SEND) {
        if (o->posted)
            return ld(&c[W_TAIL]) >= o->posted;
        return c[W_SHEAD] - ld(&c[W_TAIL]) < o->nslots;
    }
    uint64_t h = c[W_TAIL];
    return ld(&hdr(o, h)[0]) == h + 1;
}

static void set_waiting(hop_t *o, uint64_t flag)
{
    st(&o->ctl[o->type == T_SEND ? W_SWAIT : W_RWAIT], flag);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void start_step(HotPlan *p, int s)
{
    for (int k = p->step_start[s]; k < p->step_start[s + 1]; k++) {
        hop_t *o = &p->ops[k];
        o->done = 0, o->first = 1, o->drain = 0, o->off = 0, o->posted = 0, o->bad = 0, o->detail_len = 0;
        o->total = o->nbytes;
        o->data = p->base[o->dbuf] + o->doff;
        o->src = p->base[o->sbuf] + o->soff;
        if (o->type == T_SEND) {
            o->ref_rid = o->ref_off = 0;
            if (o->nbytes >= ZERO_COPY_MIN_BYTES && !o->snapshot)
                for (int64_t j = 0; j < p->nspans; j++) {
                    uint64_t a = (uint64_t)(uintptr_t)o->data, e = a + (uint64_t)o->nbytes;
                    if (p->spans[3 * j] <= a && e <= p->spans[3 * j + 1]) {
                        o->ref_rid = p->spans[3 * j + 2] + 1, o->ref_off = a - p->spans[3 * j];
                        break;
                    }
                }
            o->slice = slice_bytes(o->nbytes, (int64_t)o->slot_bytes);
            if (o->snapshot)
                rf_copy(o->snap, o->data, (size_t)o->nbytes);
        } else if (o->type == T_COPY || o->type == T_REDUCE) {
            o->done = 1;
        }
    }
}

/* Bulk waits spin yielding the core only where this host's ranks outnumber its cores (set_spin_yield): with a
 * core per rank a yield hands the core to another process for a timeslice, not to the peer. */
static int spin_yields;

static PyObject *set_spin_yield(PyObject *self, PyObject *arg)
{
    int v = PyObject_IsTrue(arg);
    if (v < 0)
        return NULL;
    spin_yields = v;
    Py_RETURN_NONE;
}

/* Waits without burning a core: spin (hot: without yielding), then sleep once on this lane's doorbell. */
static int wait_some(HotPlan *p, int s, int bell, double hot_s, double spin_s, double deadline)
{
    int lo = p->step_start[s], hi = p->step_start[s + 1];
    double start = now_s(), end = start + (hot_s > 0 ? hot_s : spin_s);
    int woke = 0;
    for (;;) {
        for (int k = lo; k < hi; k++)
            if (!p->ops[k].done && (p->ops[k].prev < 0 || p->ops[p->ops[k].prev].done) && ready(&p->ops[k])) {
                woke = 1;
                goto done;
            }
        if (now_s() > end)
            break;
        if (hot_s <= 0 && spin_yields)
            sched_yield();
    }
    for (int k = lo; k < hi; k++)
        if (!p->ops[k].done)
            set_waiting(&p->ops[k], 1);
    for (int k = lo; k < hi; k++)
        if (!p->ops[k].done && (p->ops[k].prev < 0 || p->ops[p->ops[k].prev].done) && ready(&p->ops[k]))
            woke = 1;
    if (!woke) {
        double left = deadline - now_s();
        if (left > 0) {
            if (left > 0.005)
                left = 0.005;
            n_sleeps++;
            struct pollfd pf = {bell, POLLIN, 0};
            (void)poll(&pf, 1, (int)(left * 1000) + 1);
            char buf[256];
            while (recv(bell, buf, sizeof buf, MSG_DONTWAIT) > 0) {
            }
        }
    }
    for (int k = lo; k < hi; k++)
        if (!p->ops[k].done)
            set_waiting(&p->ops[k], 0);
done:
    n_waits++;
    wait_ns += (unsigned long long)((now_s() - start) * 1e9);
    return woke;
}

/* True once every receive of step s has passed its header check (kind, signature, size) without a mismatch:
 * from then on the step's early local ops may run while the rest of the data moves */
static int checked(HotPlan *p, int s)
{
    for (int k = p->step_start[s]; k < p->step_start[s + 1]; k++) {
        hop_t *o = &p->ops[k];
        if ((o->type == T_RECV || o->type == T_RECV_REDUCE) && (o->first || o->bad))
            return 0;
    }
    return 1;
}

/* the local copies and reductions of step s that are (early = 1) or are not (0) marked early, in listed order */
static int run_locals(HotPlan *p, int s, int early)
{
    for (int k = p->step_start[s]; k < p->step_start[s + 1]; k++) {
        hop_t *o = &p->ops[k];
        if (o->early != early)
            continue;
        if (o->type == T_COPY) {
            rf_move(o->data, o->src, (size_t)o->nbytes);
        } else if (o->type == T_REDUCE && reduce(p->dtype, p->op, o->data, o->data, o->src, o->nbytes / p->itemsize)) {
            p->err_op = k;
            return -1;
        }
    }
    return 0;
}

/* Runs the plan from where it stands (the step `p->step`) on the call's buffers, the GIL released, until it is
 * done, a step found a mismatch, an error, or one bounded sleep passed without progress (RC_STALLED). */
static int run_plan(HotPlan *p, uint64_t sig, uint64_t op_seq, double deadline, int bell, double hot_s, double spin_s,
                    uint64_t in_addr, uint64_t out_addr, uint64_t scratch_addr, const uint64_t *spans, int64_t nspans)
{
    p->sig = sig & 0xFFFFFFFFull, p->op_seq = op_seq;
    p->base[0] = (char *)(uintptr_t)in_addr, p->base[1] = (char *)(uintptr_t)out_addr;
    p->base[2] = (char *)(uintptr_t)scratch_addr;
    p->spans = spans, p->nspans = nspans;
    int rc = RC_DONE;
    Py_BEGIN_ALLOW_THREADS
    while (p->step < p->nsteps) {
        int s = p->step, lo = p->step_start[s], hi = p->step_start[s + 1];
        if (!p->step_started) {
            start_step(p, s);
            p->step_started = 1;
            p->early_ran = 0;
        }
        int pending = 0, moved = 0;
        for (int k = lo; k < hi; k++) {
            hop_t *o = &p->ops[k];
            if (o->done || (o->prev >= 0 && !p->ops[o->prev].done)) {
                pending += !o->done;
                continue;
            }
            int r;
            if (o->type == T_SEND) {
                r = send_progress(p, o) ? 0 : -1;
            } else {
                r = recv_progress(p, o, sig);
                if (r > 0) {
                    p->err_op = k;
                    rc = r;
                    goto out;
                }
            }
            moved |= r == 0;
            pending += !o->done;
        }
        if (!p->early_ran && checked(p, s)) {
            run_locals(p, s, 1);
            p->early_ran = 1;
            continue;
        }
        if (pending) {
            if (!moved && !wait_some(p, s, bell, hot_s, spin_s, deadline)) {
                rc = RC_STALLED;
                goto out;
            }
            continue;
        }
        int bad = 0;
        for (int k = lo; k < hi; k++)
            bad |= p->ops[k].bad;
        if (bad) {
            p->step++;
            p->step_started = 0;
            rc = RC_MISMATCH;
            goto out;
        }
        if (run_locals(p, s, 0)) {
            rc = RC_PROTOCOL;
            goto out;
        }
        p->step++;
        p->step_started = 0;
    }
    __atomic_add_fetch(&n_runs, 1, __ATOMIC_RELAXED);
out:
    Py_END_ALLOW_THREADS
    p->spans = NULL, p->nspans = 0;
    return rc;
}

/* run(sig, op_seq, deadline, bell_fd, hot_s, spin_s, in_addr, out_addr, scratch_addr, spans) -> rc */
static PyObject *HotPlan_run(HotPlan *p, PyObject *args)
{
    unsigned long long sig, op_seq, in_addr, out_addr, scratch_addr;
    double deadline, hot_s, spin_s;
    int bell;
    Py_buffer spans;
    if (!PyArg_ParseTuple(args, "KKdiddKKKy*", &sig, &op_seq, &deadline, &bell, &hot_s, &spin_s, &in_addr, &out_addr,
                          &scratch_addr, &spans))
        return NULL;
    int rc = run_plan(p, sig, op_seq, deadline, bell, hot_s, spin_s, in_addr, out_addr, scratch_addr,
                      (const uint64_t *)spans.buf, spans.len / 24);
    PyBuffer_Release(&spans);
    return PyLong_FromLong(rc);
}

static PyObject *HotPlan_at(HotPlan *p, PyObject *Py_UNUSED(ignored)) { return PyLong_FromLong(p->step); }

static PyObject *HotPlan_reset(HotPlan *p, PyObject *Py_UNUSED(ignored))
{
    p->step = 0;
    p->step_started = 0;
    p->err_op = -1;
    p->err_code = 0;
    Py_RETURN_NONE;
}

/* append a new reference to a list (taking it); -1 with the list released on failure */
static int append_new(PyObject *list, PyObject *item)
{
    if (!item || PyList_Append(list, item)) {
        Py_XDECREF(item);
        Py_DECREF(list);
        return -1;
    }
    Py_DECREF(item);
    return 0;
}

/* the step being run: (peer, done) of each transfer, for naming who a timeout waits on */
static PyObject *HotPlan_pending(HotPlan *p, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(0);
    if (!out || p->step >= p->nsteps)
        return out;
    for (int k = p->step_start[p->step]; k < p->step_start[p->step + 1]; k++) {
        hop_t *o = &p->ops[k];
        if (o->type <= T_RECV_REDUCE && !(p->step_started && o->done) && append_new(out, PyLong_FromLong(o->peer)))
            return NULL;
    }
    return out;
}

/* the mismatches of the last step run: [(peer, got_nbytes, want_nbytes, got_sig, detail)] */
static PyObject *HotPlan_mismatches(HotPlan *p, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyList_New(0);
    int s = p->step - 1;
    if (!out || s < 0)
        return out;
    for (int k = p->step_start[s]; k < p->step_start[s + 1]; k++) {
        hop_t *o = &p->ops[k];
        if (!o->bad)
            continue;
        if (append_new(out, Py_BuildValue("(iLLKy#)", o->peer, (long long)o->got_total, (long long)o->want,
                                          (unsigned long long)o->got_sig, o->detail, (Py_ssize_t)o->detail_len)))
            return NULL;
    }
    return out;
}

/* (op index, peer, code, region id) of the last error or region request */
static PyObject *HotPlan_error(HotPlan *p, PyObject *Py_UNUSED(ignored))
{
    int k = p->err_op;
    if (k < 0 || k >= p->nops)
        return Py_BuildValue("(iiLK)", -1, -1, (long long)p->err_code, 0ull);
    return Py_BuildValue("(iiLK)", k, p->ops[k].peer, (long long)p->err_code, (unsigned long long)p->ops[k].got_rid);
}

/* set_region(op, rid, address, size): the peer's alloc region `rid` (id + 1, as on the wire) is mapped here */
static PyObject *HotPlan_set_region(HotPlan *p, PyObject *args)
{
    int k;
    unsigned long long rid, addr, size;
    if (!PyArg_ParseTuple(args, "iKKK", &k, &rid, &addr, &size))
        return NULL;
    if (k < 0 || k >= p->nops) {
        PyErr_SetString(PyExc_IndexError, "op index out of range");
        return NULL;
    }
    p->ops[k].region_rid = rid;
    p->ops[k].region = (char *)(uintptr_t)addr;
    p->ops[k].region_size = size;
    Py_RETURN_NONE;
}

static void HotPlan_dealloc(HotPlan *p)
{
    if (p->ops)
        for (int k = 0; k < p->nops; k++) {
            free(p->ops[k].snap);
            free(p->ops[k].detail);
        }
    free(p->ops);
    free(p->step_start);
    free(p->bells);
    free(p->bell_len);
    free(p->bounce);
    Py_XDECREF(p->keep);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyMethodDef HotPlan_methods[] = {
    {"run", (PyCFunction)HotPlan_run, METH_VARARGS,
     "run(sig, op_seq, deadline, bell_fd, hot_s, spin_s, in, out, scratch, spans) -> rc"},
    {"at", (PyCFunction)HotPlan_at, METH_NOARGS, "the step the next run resumes at"},
    {"reset", (PyCFunction)HotPlan_reset, METH_NOARGS, "start the next call at step 0"},
    {"pending", (PyCFunction)HotPlan_pending, METH_NOARGS, "peers of the step being run"},
    {"mismatches", (PyCFunction)HotPlan_mismatches, METH_NOARGS, "mismatched messages of the last step"},
    {"error", (PyCFunction)HotPlan_error, METH_NOARGS, "(op, peer, code, region id) of the last error"},
    {"set_region", (PyCFunction)HotPlan_set_region, METH_VARARGS, "map a peer's alloc region for one op"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HotPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ringflow.runtime.native._hotpath.HotPlan",
    .tp_basicsize = sizeof(HotPlan),
    .tp_dealloc = (destructor)HotPlan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "one rank's compiled plan bound to arrays and shared-memory connections",
    .tp_methods = HotPlan_methods,
};

#define NCOLS 18
static const int ITEMSIZE[] = {1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8}; /* by D_ code */

/* ValueError naming the row and column of a plan that cannot be run; returns -1 */
static int bad_row(int k, const char *what, long long value)
{
    PyErr_Format(PyExc_ValueError, "native plan row %d: %s (got %lld)", k, what, value);
    return -1;
}

/* Every index and range a plan's rows hold, checked before any is used: the executor trusts them. Addresses (the
 * control words, the call's buffers) cannot be checked here; hotpath.py takes them from live mappings and arrays. */
static int check_rows(const int64_t *rows, int nops, const int *starts, int nsteps, int nbells, int dtype, int op,
                      int itemsize, unsigned long long own)
{
    if (dtype < D_BOOL || dtype > D_F64) {
        PyErr_Format(PyExc_ValueError, "native plan: unknown dtype code %d", dtype);
        return -1;
    }
    if (op < O_SUM || op > O_BXOR || ((dtype >= D_F16) && op > O_MAX)) {
        PyErr_Format(PyExc_ValueError, "native plan: op code %d is unknown or not defined on dtype code %d", op, dtype);
        return -1;
    }
    if (itemsize != ITEMSIZE[dtype]) {
        PyErr_Format(PyExc_ValueError, "native plan: itemsize %d is not dtype code %d's (%d)", itemsize, dtype,
                     ITEMSIZE[dtype]);
        return -1;
    }
    if (starts[0] != 0 || starts[nsteps] != nops) {
        PyErr_Format(PyExc_ValueError, "native plan: step starts must run from 0 to the %d rows (got %d .. %d)", nops,
                     starts[0], starts[nsteps]);
        return -1;
    }
    for (int s = 0; s < nsteps; s++)
        if (starts[s + 1] < starts[s]) {
            PyErr_Format(PyExc_ValueError, "native plan: step %d starts at row %d, after step %d's end %d", s + 1,
                         starts[s + 1], s, starts[s]);
            return -1;
        }
    for (int s = 0; s < nsteps; s++)
        for (int k = starts[s]; k < starts[s + 1]; k++) {
            const int64_t *r = rows + (int64_t)k * NCOLS;
            int64_t type = r[0], kind = r[1], peer = r[2], prev = r[3], nslots = r[5], slot_bytes = r[6];
            int64_t dbuf = r[7], doff = r[8], sbuf = r[9], soff = r[10], nbytes = r[11], want = r[12];
            if (type < T_SEND || type > T_REDUCE)
                return bad_row(k, "unknown op type", type);
            if (dbuf < 0 || dbuf > 3 || sbuf < 0 || sbuf > 3)
                return bad_row(k, "buffer index outside 0..3", dbuf < 0 || dbuf > 3 ? dbuf : sbuf);
            if ((dbuf == 3 || sbuf == 3) && !own)
                return bad_row(k, "buffer 3 (the plan's own payload) without one", 3);
            if (doff < 0 || soff < 0 || nbytes < 0)
                return bad_row(k, "negative byte offset or size", doff < 0 ? doff : soff < 0 ? soff : nbytes);
            if (doff > INT64_MAX - nbytes || soff > INT64_MAX - nbytes)
                return bad_row(k, "byte range overflows", nbytes);
            for (int c = 14; c < 18; c++)
                if (c != 15 && (r[c] < 0 || r[c] > 1))
                    return bad_row(k, c == 14 ? "pipelined is not 0/1" : c == 16 ? "snapshot is not 0/1"
                                                                                 : "early is not 0/1", r[c]);
            if ((type == T_RECV_REDUCE || type == T_REDUCE) && nbytes % itemsize)
                return bad_row(k, "a reduction's byte count is not a whole number of items", nbytes);
            if (type >= T_COPY)
                continue;
            if (kind != KIND_DATA && kind != KIND_CHECK)
                return bad_row(k, "unknown message kind", kind);
            if (peer < 0)
                return bad_row(k, "negative peer", peer);
            if (prev != -1 && (prev < starts[s] || prev >= k || rows[prev * NCOLS + 4] != r[4]))
                return bad_row(k, "prev is not an earlier op of this step on the same connection", prev);
            if (r[15] < -1 || r[15] >= nbells)
                return bad_row(k, "doorbell index outside the plan's doorbells", r[15]);
            if (!r[4] || r[4] % 8)
                return bad_row(k, "control-word address missing or unaligned", r[4]);
            if (nslots < 2 || nslots > (int64_t)MAX_SLOTS)
                return bad_row(k, "slot count outside 2..MAX_SLOTS", nslots);
            if (slot_bytes < 64 || slot_bytes % 64)
                return bad_row(k, "slot size not a positive multiple of 64", slot_bytes);
            if (r[13] < 0)
                return bad_row(k, "negative single-copy threshold", r[13]);
            if (type == T_SEND && want != 0)
                return bad_row(k, "a send's want must be 0", want);
            if (type != T_SEND && want != nbytes && !(want == -1 && type == T_RECV && nbytes == 0))
                return bad_row(k, "a receive's want must equal its byte count (or be -1 with none, a check)", want);
            if (type != T_SEND && r[16])
                return bad_row(k, "only a send snapshots its source", r[16]);
        }
    return 0;
}

/* plan(ops: bytes of int64 rows of NCOLS, step_start: bytes of int32, bells: list of bytes, dtype, op, itemsize,
 *      own: address of the plan's own payload (buffer 3), keep) -> HotPlan
 * row: type, kind, peer, prev, ctl, nslots, slot_bytes, dbuf, doff, sbuf, soff, nbytes, want, cma_min,
 *      pipelined, bell, snapshot, early */
static PyObject *make_plan(PyObject *self, PyObject *args)
{
    Py_buffer rows, starts;
    PyObject *bells, *keep;
    int dtype, op, itemsize;
    unsigned long long own;
    if (!PyArg_ParseTuple(args, "y*y*O!iiiKO", &rows, &starts, &PyList_Type, &bells, &dtype, &op, &itemsize, &own,
                          &keep))
        return NULL;
    HotPlan *p = NULL;
    if (rows.len % (NCOLS * 8) || starts.len % 4 || starts.len < 4 || rows.len / (NCOLS * 8) > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "malformed native plan: %zd bytes of rows (whole rows of %d int64 wanted), "
                     "%zd bytes of step starts (at least one int32 wanted)", rows.len, NCOLS, starts.len);
        goto fail;
    }
    int nops = (int)(rows.len / (NCOLS * 8)), nsteps = (int)(starts.len / 4) - 1;
    int nbells = (int)PyList_GET_SIZE(bells);
    for (int b = 0; b < nbells; b++) {
        PyObject *it = PyList_GET_ITEM(bells, b);
        if (!PyBytes_Check(it) || PyBytes_GET_SIZE(it) > (Py_ssize_t)sizeof(((struct sockaddr_un *)0)->sun_path)) {
            PyErr_Format(PyExc_ValueError, "native plan: doorbell %d is not a bytes address of at most %zu bytes", b,
                         sizeof(((struct sockaddr_un *)0)->sun_path));
            goto fail;
        }
    }
    if (check_rows((const int64_t *)rows.buf, nops, (const int *)starts.buf, nsteps, nbells, dtype, op, itemsize, own))
        goto fail;
    p = PyObject_New(HotPlan, &HotPlanType);
    if (!p)
        goto fail;
    p->ops = calloc((size_t)(nops ? nops : 1), sizeof(hop_t));
    p->step_start = malloc((size_t)(nsteps + 1) * sizeof(int));
    p->nbells = nbells;
    p->bells = calloc((size_t)(p->nbells ? p->nbells : 1), sizeof(struct sockaddr_un));
    p->bell_len = calloc((size_t)(p->nbells ? p->nbells : 1), sizeof(socklen_t));
    p->bounce = NULL, p->bounce_bytes = 0, p->keep = NULL;
    p->nops = nops, p->nsteps = nsteps, p->dtype = dtype, p->op = op, p->itemsize = itemsize;
    p->step = 0, p->step_started = 0, p->err_op = -1, p->err_code = 0;
    p->base[0] = p->base[1] = p->base[2] = NULL, p->base[3] = (char *)(uintptr_t)own;
    p->spans = NULL, p->nspans = 0;
    if (!p->ops || !p->step_start || !p->bells || !p->bell_len) {
        PyErr_NoMemory();
        goto fail;
    }
    memcpy(p->step_start, starts.buf, (size_t)(nsteps + 1) * sizeof(int));
    for (int b = 0; b < p->nbells; b++) {
        PyObject *it = PyList_GET_ITEM(bells, b);
        Py_ssize_t n = PyBytes_GET_SIZE(it);
        p->bells[b].sun_family = AF_UNIX;
        memcpy(p->bells[b].sun_path, PyBytes_AS_STRING(it), (size_t)n);
        p->bell_len[b] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
    }
    const int64_t *r = (const int64_t *)rows.buf;
    int64_t bounce = 0;
    for (int k = 0; k < nops; k++, r += NCOLS) {
        hop_t *o = &p->ops[k];
        o->type = (int)r[0], o->kind = (int)r[1], o->peer = (int)r[2], o->prev = (int)r[3];
        o->ctl = (volatile uint64_t *)(uintptr_t)r[4];
        o->nslots = (uint64_t)r[5], o->slot_bytes = (uint64_t)r[6];
        o->slots = (char *)(uintptr_t)r[4] + DATA_OFF;
        o->dbuf = (int)r[7], o->doff = r[8], o->sbuf = (int)r[9], o->soff = r[10];
        o->nbytes = r[11], o->want = r[12], o->cma_min = r[13], o->pipelined = (int)r[14], o->bell = (int)r[15];
        o->snapshot = (int)r[16], o->early = (int)r[17];
        if (o->snapshot && !(o->snap = malloc((size_t)(o->nbytes ? o->nbytes : 1)))) {
            PyErr_NoMemory();
            goto fail;
        }
        if (o->type == T_RECV || o->type == T_RECV_REDUCE) {
            if (!(o->detail = malloc(DETAIL_MAX))) {
                PyErr_NoMemory();
                goto fail;
            }
            if (o->type == T_RECV_REDUCE) {
                int64_t want = o->nbytes >= (int64_t)RF_CMA_LARGE_CHUNK_FROM_BYTES ? (int64_t)RF_CMA_LARGE_CHUNK_BYTES
                                                                                  : (int64_t)RF_CMA_CHUNK_BYTES;
                if (want > bounce)
                    bounce = want;
            }
        }
    }
    if (bounce && !(p->bounce = malloc((size_t)bounce + 4096u))) {
        PyErr_NoMemory();
        goto fail;
    }
    p->bounce_bytes = bounce;
    Py_INCREF(keep);
    p->keep = keep;
    PyBuffer_Release(&rows);
    PyBuffer_Release(&starts);
    return (PyObject *)p;
fail:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&starts);
    Py_XDECREF(p);
    return NULL;
}

/* reduce_into(dtype, op, out, a, b, n): out = a (op) b over n elements (tests compare it with NumPy) */
static PyObject *reduce_into(PyObject *self, PyObject *args)
{
    int dtype, op;
    unsigned long long out, a, b;
    long long n;
    if (!PyArg_ParseTuple(args, "iiKKKL", &dtype, &op, &out, &a, &b, &n))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = reduce(dtype, op, (void *)(uintptr_t)out, (const void *)(uintptr_t)a, (const void *)(uintptr_t)b, n);
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_SetString(PyExc_ValueError, "unsupported dtype/op");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *stats(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{sKsKsKsKsKsK}", "runs", n_runs, "cma_reads", n_cma_reads, "waits", n_waits, "wait_ns",
                         wait_ns, "sleeps", n_sleeps, "rings", n_rings);
}

/* protocol() -> {name: value}: the shared-memory protocol numbers this module was built with (_protocol.h) */
static PyObject *protocol(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *d = PyDict_New(), *v;
    if (!d)
        return NULL;
#define X(name)                                                                                                     \
    v = PyLong_FromUnsignedLongLong(RF_##name);                                                                     \
    if (!v || PyDict_SetItemString(d, #name, v)) {                                                                  \
        Py_XDECREF(v);                                                                                              \
        Py_DECREF(d);                                                                                               \
        return NULL;                                                                                                \
    }                                                                                                               \
    Py_DECREF(v);
    RF_PROTOCOL_TABLE(X)
#undef X
    return d;
}

/* plan_codes() -> {name: value}: the codes of a plan's rows (hotpath.py writes them; a test compares) */
static PyObject *plan_codes(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    static const struct {
        const char *name;
        int value;
    } codes[] = {
        {"NCOLS", NCOLS}, {"T_SEND", T_SEND}, {"T_RECV", T_RECV}, {"T_RECV_REDUCE", T_RECV_REDUCE},
        {"T_COPY", T_COPY}, {"T_REDUCE", T_REDUCE}, {"RC_DONE", RC_DONE}, {"RC_STALLED", RC_STALLED},
        {"RC_MISMATCH", RC_MISMATCH}, {"RC_PROTOCOL", RC_PROTOCOL}, {"RC_CMA", RC_CMA}, {"RC_REGION", RC_REGION},
        {"CHECK_RC", CHECK_RC},
        {"bool", D_BOOL}, {"int8", D_I8}, {"uint8", D_U8}, {"int16", D_I16}, {"uint16", D_U16}, {"int32", D_I32},
        {"uint32", D_U32}, {"int64", D_I64}, {"uint64", D_U64}, {"float16", D_F16}, {"bfloat16", D_BF16},
        {"float32", D_F32}, {"float64", D_F64}, {"sum", O_SUM}, {"prod", O_PROD}, {"min", O_MIN}, {"max", O_MAX},
        {"band", O_BAND}, {"bor", O_BOR}, {"bxor", O_BXOR},
    };
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < sizeof codes / sizeof codes[0]; i++) {
        PyObject *v = PyLong_FromLong(codes[i].value);
        if (!v || PyDict_SetItemString(d, codes[i].name, v)) {
            Py_XDECREF(v);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(v);
    }
    return d;
}

/* The Python shared-memory path's flag words: a release store publishes everything written before it, an acquire
 * load makes everything published before the matching store visible after it (x86 and aarch64 alike). */
static int word_address(PyObject *arg, volatile uint64_t **w)
{
    void *a = PyLong_AsVoidPtr(arg);
    if (!a && PyErr_Occurred())
        return -1;
    if (!a || (uintptr_t)a % 8) {
        PyErr_SetString(PyExc_ValueError, "a flag word's address must be non-zero and 8-byte aligned");
        return -1;
    }
    *w = (volatile uint64_t *)a;
    return 0;
}

static PyObject *store_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    volatile uint64_t *w;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "store_release(address, value)");
        return NULL;
    }
    if (word_address(args[0], &w))
        return NULL;
    unsigned long long v = PyLong_AsUnsignedLongLong(args[1]);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    __atomic_store_n(w, (uint64_t)v, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *load_acquire(PyObject *self, PyObject *arg)
{
    volatile uint64_t *w;
    if (word_address(arg, &w))
        return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(w, __ATOMIC_ACQUIRE));
}

/* The data pointer of a NumPy array: numpy's PyArrayObject_fields (numpy/ndarraytypes.h) holds it right
   after the object header, a layout its ABI keeps. ndarray.ctypes.data builds a ctypes object per call (about
   a microsecond); a call passes two or three addresses. */
typedef struct {
    PyObject_HEAD
    char *data;
} ArrayHead;

static PyTypeObject *ndarray_type = NULL;

static PyObject *set_array_type(PyObject *self, PyObject *arg)
{
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "set_array_type(numpy.ndarray)");
        return NULL;
    }
    Py_XSETREF(ndarray_type, (PyTypeObject *)Py_NewRef(arg));
    Py_RETURN_NONE;
}

/* The leading fields of numpy's PyArrayObject_fields (numpy/ndarraytypes.h; the same in NumPy 1 and 2). */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    intptr_t *dimensions;
    intptr_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ArrayFields;

#define ARRAY_C_CONTIGUOUS 0x0001   /* NPY_ARRAY_C_CONTIGUOUS */
#define ARRAY_WRITEABLE 0x0400      /* NPY_ARRAY_WRITEABLE */

/* What determines a remembered call's plan about an array, as words: data address, dtype object, contiguity and
   writeability, shape and strides (buf holds 3 + 2 * 64 words); the word count, or -1 for a dimension count out of
   range. Equal words mean the same memory seen the same way, as long as the caller keeps the dtype alive. */
static int state_words(ArrayFields *a, intptr_t *buf)
{
    int nd = a->nd;
    if (nd < 0 || nd > 64)
        return -1;
    buf[0] = (intptr_t)a->data;
    buf[1] = (intptr_t)a->descr;
    buf[2] = ((intptr_t)nd << 32) | (a->flags & (ARRAY_C_CONTIGUOUS | ARRAY_WRITEABLE));
    for (int i = 0; i < nd; i++) {
        buf[3 + i] = a->dimensions[i];
        buf[3 + nd + i] = a->strides[i];
    }
    return 3 + 2 * nd;
}

/* array_state(a) -> bytes: state_words in one call (attribute reads from Python cost a microsecond). */
static PyObject *array_state(PyObject *self, PyObject *arg)
{
    if (ndarray_type == NULL || !PyObject_TypeCheck(arg, ndarray_type)) {
        PyErr_SetString(PyExc_TypeError, "array_state() takes a numpy.ndarray (after set_array_type)");
        return NULL;
    }
    intptr_t buf[3 + 2 * 64];
    int n = state_words((ArrayFields *)arg, buf);
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "array_state(): the array's dimension count is out of range");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)(n * sizeof(intptr_t)));
}

static PyObject *address(PyObject *self, PyObject *arg)
{
    if (ndarray_type == NULL || !PyObject_TypeCheck(arg, ndarray_type)) {
        PyErr_SetString(PyExc_TypeError, "address() takes a numpy.ndarray (after set_array_type)");
        return NULL;
    }
    return PyLong_FromVoidPtr(((ArrayHead *)arg)->data);
}

/* ------------------------------------------------------------------ the remembered call, in one C call */
/* A Runner is a call remembered for the very arrays it was made with (fastcall.py): its native plan, the buffer
 * addresses, and what determines the plan about each array (weak reference, state words). `go` re-checks them all
 * and runs the plan, so a repeated call costs one C call beyond the communicator's own bookkeeping. */
typedef struct {
    PyObject_HEAD
    HotPlan *plan;
    HotPlan *check;              /* the argument-check exchange run before the plan, or NULL (the plan checks) */
    PyObject *xref, *xstate;     /* weakref.ref to x, and array_state(x) when remembered */
    PyObject *outref, *outstate; /* the same for out; NULL where the call had no out */
    uint64_t sig, base[3];
    int bell;
    double hot_s, spin_s;
    double deadline;             /* the deadline of the latest go(), for resuming a call go() left unfinished */
} Runner;

static PyTypeObject RunnerType;

/* 1 if `obj` is the array `ref` refers to, in the state `state` holds; 0 otherwise */
static int same_array(PyObject *obj, PyObject *ref, PyObject *state)
{
    if (PyWeakref_GetObject(ref) != obj || ndarray_type == NULL || Py_TYPE(obj) != ndarray_type)
        return 0;
    intptr_t buf[3 + 2 * 64];
    int n = state_words((ArrayFields *)obj, buf);
    Py_ssize_t len = PyBytes_GET_SIZE(state);
    return n >= 0 && len == (Py_ssize_t)(n * sizeof(intptr_t)) && !memcmp(buf, PyBytes_AS_STRING(state), (size_t)len);
}

/* runner(plan, check, xref, xstate, outref, outstate, sig, bell_fd, hot_s, spin_s, in, out, scratch) -> Runner
 * (check: the argument-check plan or None; outref and outstate None where the call has no out) */
static PyObject *make_runner(PyObject *self, PyObject *args)
{
    PyObject *plan, *check, *xref, *xstate, *outref, *outstate;
    unsigned long long sig, b0, b1, b2;
    int bell;
    double hot_s, spin_s;
    if (!PyArg_ParseTuple(args, "O!OO!O!OOKiddKKK", &HotPlanType, &plan, &check, &_PyWeakref_RefType, &xref,
                          &PyBytes_Type, &xstate, &outref, &outstate, &sig, &bell, &hot_s, &spin_s, &b0, &b1, &b2))
        return NULL;
    if (check != Py_None && !PyObject_TypeCheck(check, &HotPlanType)) {
        PyErr_SetString(PyExc_TypeError, "runner(): check is a HotPlan or None");
        return NULL;
    }
    int has_out = outref != Py_None;
    if (has_out != (outstate != Py_None) ||
        (has_out && (!PyWeakref_CheckRefExact(outref) || !PyBytes_Check(outstate)))) {
        PyErr_SetString(PyExc_TypeError, "runner(): outref and outstate are a weakref.ref and bytes, or both None");
        return NULL;
    }
    Runner *r = PyObject_New(Runner, &RunnerType);
    if (!r)
        return NULL;
    r->plan = (HotPlan *)Py_NewRef(plan);
    r->check = check == Py_None ? NULL : (HotPlan *)Py_NewRef(check);
    r->xref = Py_NewRef(xref), r->xstate = Py_NewRef(xstate);
    r->outref = has_out ? Py_NewRef(outref) : NULL, r->outstate = has_out ? Py_NewRef(outstate) : NULL;
    r->sig = sig, r->bell = bell, r->hot_s = hot_s, r->spin_s = spin_s;
    r->base[0] = b0, r->base[1] = b1, r->base[2] = b2;
    r->deadline = 0;
    return (PyObject *)r;
}

/* One call's first native pass: the check exchange (if any), then the plan; the plan's rc, or CHECK_RC + rc where
 * the check exchange did not finish (the plan has not started) */
static int run_call(Runner *r, uint64_t op_seq, double timeout_s, const uint64_t *spans, int64_t nspans)
{
    HotPlan *p = r->plan, *c = r->check;
    r->deadline = now_s() + timeout_s;
    if (c) {
        c->step = 0, c->step_started = 0, c->err_op = -1, c->err_code = 0;
        int rc = run_plan(c, r->sig, op_seq, r->deadline, r->bell, r->hot_s, r->spin_s, r->base[0], r->base[1],
                          r->base[2], spans, nspans);
        if (rc != RC_DONE)
            return CHECK_RC + rc;
    }
    p->step = 0, p->step_started = 0, p->err_op = -1, p->err_code = 0;
    return run_plan(p, r->sig, op_seq, r->deadline, r->bell, r->hot_s, r->spin_s, r->base[0], r->base[1], r->base[2],
                    spans, nspans);
}

/* go(x, out, op_seq, timeout_s, spans) -> rc (run_call's), or -1 (nothing done) where x or out is not the array
 * remembered in the state remembered */
static PyObject *Runner_go(Runner *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "go(x, out, op_seq, timeout_s, spans: bytes)");
        return NULL;
    }
    PyObject *x = args[0], *out = args[1];
    if (!same_array(x, r->xref, r->xstate) ||
        (r->outref == NULL ? out != Py_None : !same_array(out, r->outref, r->outstate)))
        return PyLong_FromLong(-1);
    unsigned long long op_seq = PyLong_AsUnsignedLongLong(args[2]);
    double timeout_s = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(run_call(r, op_seq, timeout_s, (const uint64_t *)PyBytes_AS_STRING(args[4]),
                                    PyBytes_GET_SIZE(args[4]) / 24));
}

/* repeat(x, out, op_seq, n, timeout_s, spans) -> rc: go() n times in a row (op_seq, op_seq + 1, ...) without
 * returning to Python, resuming a stalled call until its deadline, up to the first call that ends otherwise than
 * done (its rc); the floor of a repeated call (benchmarks/call_overhead.py). Every rank must call it with the
 * same n. */
static PyObject *Runner_repeat(Runner *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || !PyBytes_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "repeat(x, out, op_seq, n, timeout_s, spans: bytes)");
        return NULL;
    }
    if (!same_array(args[0], r->xref, r->xstate) ||
        (r->outref == NULL ? args[1] != Py_None : !same_array(args[1], r->outref, r->outstate)))
        return PyLong_FromLong(-1);
    unsigned long long op_seq = PyLong_AsUnsignedLongLong(args[2]);
    long long n = PyLong_AsLongLong(args[3]);
    double timeout_s = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred())
        return NULL;
    const uint64_t *spans = (const uint64_t *)PyBytes_AS_STRING(args[5]);
    Py_ssize_t nspans = PyBytes_GET_SIZE(args[5]) / 24;
    int rc = RC_DONE;
    for (long long i = 0; i < n && rc == RC_DONE; i++) {
        uint64_t seq = op_seq + (unsigned long long)i;
        rc = run_call(r, seq, timeout_s, spans, nspans);
        for (;;) { /* a stalled call (a peer descheduled) resumes until its deadline */
            if ((rc != RC_STALLED && rc != CHECK_RC + RC_STALLED) || now_s() >= r->deadline)
                break;
            HotPlan *p = rc == RC_STALLED ? r->plan : r->check;
            rc = run_plan(p, r->sig, seq, r->deadline, r->bell, r->hot_s, r->spin_s, r->base[0], r->base[1],
                          r->base[2], spans, nspans);
            if (p == r->check) {
                if (rc != RC_DONE) {
                    rc += CHECK_RC;
                    continue;
                }
                r->plan->step = 0, r->plan->step_started = 0, r->plan->err_op = -1, r->plan->err_code = 0;
                rc = run_plan(r->plan, r->sig, seq, r->deadline, r->bell, r->hot_s, r->spin_s, r->base[0],
                              r->base[1], r->base[2], spans, nspans);
            }
        }
    }
    return PyLong_FromLong(rc);
}

static PyObject *Runner_deadline(Runner *r, void *Py_UNUSED(closure)) { return PyFloat_FromDouble(r->deadline); }

static void Runner_dealloc(Runner *r)
{
    Py_XDECREF(r->plan);
    Py_XDECREF(r->check);
    Py_XDECREF(r->xref);
    Py_XDECREF(r->xstate);
    Py_XDECREF(r->outref);
    Py_XDECREF(r->outstate);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyMethodDef Runner_methods[] = {
    {"go", (PyCFunction)(void (*)(void))Runner_go, METH_FASTCALL,
     "go(x, out, op_seq, timeout_s, spans) -> rc, or -1 where x or out changed (nothing done)"},
    {"repeat", (PyCFunction)(void (*)(void))Runner_repeat, METH_FASTCALL,
     "repeat(x, out, op_seq, n, timeout_s, spans) -> rc: go() n times without returning to Python (a benchmark)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Runner_getset[] = {
    {"deadline", (getter)Runner_deadline, NULL, "the deadline of the latest go() (time.monotonic seconds)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RunnerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ringflow.runtime.native._hotpath.Runner",
    .tp_basicsize = sizeof(Runner),
    .tp_dealloc = (destructor)Runner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a call remembered for its arrays: re-checks them and runs its native plan in one call",
    .tp_methods = Runner_methods,
    .tp_getset = Runner_getset,
};

/* ------------------------------------------------------------------ the communicator's door for one collective */
/* A Door is one collective's entry on one communicator (fastcall.py): it holds the calls remembered last for that
 * collective (up to DOOR_ENTRIES: each one's Runner and what else the call's bookkeeping names) and the
 * communicator's instance dict. `call` does, in C, every check the remembered Python path does (the communicator
 * neither failed nor destroyed, no queued asynchronous call, the owning thread, the same op or root, a timeout > 0,
 * the plan still the prepared one, the very arrays in the same state), the communicator's bookkeeping (sequence
 * number, last call, in-call flag, last schedule) and the call's first native pass, inside the recorder's `run`
 * where the communicator has a recorder; anything else returns the miss object, having changed nothing, and the
 * full path decides. */
enum { DOOR_ENTRIES = 16 };

typedef struct {
    Runner *runner;      /* NULL: a free entry */
    PyObject *arg, *prep, *hot, *last_desc, *schedule, *regions, *resume;
    PyObject *what, *meta;   /* the recorder's description and meta of the call */
} DoorEntry;

typedef struct {
    PyObject_HEAD
    PyObject *dict;      /* the communicator's __dict__ */
    PyObject *lane;      /* its collective lane (`_outstanding` counts queued asynchronous calls) */
    PyObject *miss;      /* what call() returns where the door does not apply */
    PyObject *inner;     /* the door's own `run` (call() without the recorder), handed to the recorder */
    int next;            /* the entry set() replaces when none is free */
    DoorEntry e[DOOR_ENTRIES];
} Door;

static PyTypeObject DoorType;
static PyObject *s_failure, *s_destroyed, *s_rec, *s_owner_id, *s_op_seq, *s_last_call, *s_in_call,
    *s_last_schedule, *s_timeout, *s_outstanding, *s_hot, *s_packed, *s_run;

static void entry_forget(DoorEntry *e)
{
    Py_CLEAR(e->runner);
    Py_CLEAR(e->arg);
    Py_CLEAR(e->prep);
    Py_CLEAR(e->hot);
    Py_CLEAR(e->last_desc);
    Py_CLEAR(e->schedule);
    Py_CLEAR(e->regions);
    Py_CLEAR(e->resume);
    Py_CLEAR(e->what);
    Py_CLEAR(e->meta);
}

static void door_forget(Door *d)
{
    for (int i = 0; i < DOOR_ENTRIES; i++)
        entry_forget(&d->e[i]);
}

/* door(comm_dict, lane, miss) -> Door */
static PyObject *make_door(PyObject *self, PyObject *args)
{
    PyObject *dict, *lane, *miss;
    if (!PyArg_ParseTuple(args, "O!OO", &PyDict_Type, &dict, &lane, &miss))
        return NULL;
    Door *d = PyObject_GC_New(Door, &DoorType);
    if (!d)
        return NULL;
    d->dict = Py_NewRef(dict), d->lane = Py_NewRef(lane), d->miss = Py_NewRef(miss);
    d->next = 0;
    memset(d->e, 0, sizeof d->e);
    d->inner = NULL;
    PyObject_GC_Track((PyObject *)d);
    if ((d->inner = PyObject_GetAttrString((PyObject *)d, "run")) == NULL) {
        Py_DECREF(d);
        return NULL;
    }
    return (PyObject *)d;
}

static PyObject *ref_target(PyObject *ref) { return ref == NULL ? Py_None : PyWeakref_GetObject(ref); }

/* the entry for these objects (x, out, arg), or NULL; -1 in *err on an error */
static DoorEntry *door_find(Door *d, PyObject *x, PyObject *out, PyObject *arg, int *err)
{
    for (int i = 0; i < DOOR_ENTRIES; i++) {
        DoorEntry *e = &d->e[i];
        Runner *r = e->runner;
        if (r == NULL || PyWeakref_GetObject(r->xref) != x || ref_target(r->outref) != out ||
            Py_TYPE(arg) != Py_TYPE(e->arg))
            continue;
        if (arg == e->arg)
            return e;
        int eq = PyObject_RichCompareBool(arg, e->arg, Py_EQ);
        if (eq < 0) {
            *err = -1;
            return NULL;
        }
        if (eq)
            return e;
    }
    return NULL;
}

/* set(runner, arg, prep, hot, desc, schedule, regions, resume, what, meta): remember this call (resume(op_seq, rc)
 * finishes a call whose first native pass left it unfinished; what and meta: the recorder's description of it) */
static PyObject *Door_set(Door *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !PyObject_TypeCheck(args[0], &RunnerType) || !PyCallable_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError,
                        "set(runner: Runner, arg, prep, hot, desc, schedule, regions, resume, what, meta)");
        return NULL;
    }
    Runner *r = (Runner *)args[0];
    int err = 0;
    DoorEntry *e = door_find(d, PyWeakref_GetObject(r->xref), ref_target(r->outref), args[1], &err);
    if (err)
        return NULL;
    for (int i = 0; e == NULL && i < DOOR_ENTRIES; i++)
        if (d->e[i].runner == NULL || PyWeakref_GetObject(d->e[i].runner->xref) == Py_None)
            e = &d->e[i];
    if (e == NULL) {
        e = &d->e[d->next];
        d->next = (d->next + 1) % DOOR_ENTRIES;
    }
    entry_forget(e);
    e->runner = (Runner *)Py_NewRef(r);
    e->arg = Py_NewRef(args[1]), e->prep = Py_NewRef(args[2]), e->hot = Py_NewRef(args[3]);
    e->last_desc = Py_NewRef(args[4]), e->schedule = Py_NewRef(args[5]), e->regions = Py_NewRef(args[6]);
    e->resume = Py_NewRef(args[7]);
    e->what = Py_NewRef(args[8]), e->meta = Py_NewRef(args[9]);
    Py_RETURN_NONE;
}

static PyObject *Door_clear(Door *d, PyObject *Py_UNUSED(ignored))
{
    door_forget(d);
    Py_RETURN_NONE;
}

static PyObject *Door_held(Door *d, PyObject *Py_UNUSED(ignored))
{
    long n = 0;
    for (int i = 0; i < DOOR_ENTRIES; i++)
        n += d->e[i].runner != NULL;
    return PyLong_FromLong(n);
}

static PyObject *door_miss(Door *d) { return Py_NewRef(d->miss); }

/* the dict's value under `key` (borrowed), or NULL where absent */
static PyObject *comm_get(Door *d, PyObject *key) { return PyDict_GetItemWithError(d->dict, key); }

/* Every check of call(): 1 where the remembered call applies (timeout_s, the sequence number and the regions'
 * packed spans, a new reference, filled in), 0 where it does not, -1 on an error */
static int door_ready(Door *d, PyObject *const *args, Py_ssize_t nargs, int recorded, double *timeout_s,
                      unsigned long long *seq, PyObject **spans_out, DoorEntry **entry)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "call(x, out, arg, async_op, timeout)");
        return -1;
    }
    PyObject *x = args[0], *out = args[1], *arg = args[2], *timeout = args[4];
    if (args[3] != Py_False)
        return 0;
    int err = 0;
    DoorEntry *e = door_find(d, x, out, arg, &err);
    if (e == NULL)
        return err;
    Runner *r = e->runner;
    if (timeout == Py_None && (timeout = comm_get(d, s_timeout)) == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyFloat_CheckExact(timeout) && !PyLong_CheckExact(timeout))
        return 0;
    *timeout_s = PyFloat_AsDouble(timeout);
    if (*timeout_s == -1.0 && PyErr_Occurred())
        return -1;
    if (!(*timeout_s > 0))
        return 0;
    if (comm_get(d, s_failure) != Py_None || comm_get(d, s_destroyed) != Py_False ||
        (!recorded && comm_get(d, s_rec) != Py_None))
        return PyErr_Occurred() ? -1 : 0;
    PyObject *owner = comm_get(d, s_owner_id);
    if (owner == NULL || !PyLong_CheckExact(owner) ||
        PyLong_AsUnsignedLong(owner) != PyThread_get_thread_ident())
        return PyErr_Occurred() ? -1 : 0;
    PyObject *queued = PyObject_GetAttr(d->lane, s_outstanding);
    if (queued == NULL)
        return -1;
    int idle = PyLong_CheckExact(queued) && PyLong_AsLong(queued) == 0;
    Py_DECREF(queued);
    if (!idle)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *hot = PyObject_GetAttr(e->prep, s_hot);
    if (hot == NULL)
        return -1;
    Py_DECREF(hot);   /* prep holds it: only its identity is compared */
    if (hot != e->hot) {
        entry_forget(e);
        return 0;
    }
    if (!same_array(x, r->xref, r->xstate) || (r->outref != NULL && !same_array(out, r->outref, r->outstate)))
        return 0;
    PyObject *seq_obj = comm_get(d, s_op_seq);
    if (seq_obj == NULL || !PyLong_CheckExact(seq_obj))
        return PyErr_Occurred() ? -1 : 0;
    *seq = PyLong_AsUnsignedLongLong(seq_obj);
    if (PyErr_Occurred())
        return -1;
    PyObject *spans = PyObject_GetAttr(e->regions, s_packed);
    if (spans == NULL)
        return -1;
    if (!PyBytes_Check(spans)) {
        Py_DECREF(spans);
        return 0;
    }
    *spans_out = spans;
    *entry = e;
    return 1;
}

/* checks(x, out, arg, async_op, timeout) -> True where call() would run the remembered call (nothing done) */
static PyObject *Door_checks(Door *d, PyObject *const *args, Py_ssize_t nargs)
{
    double timeout_s;
    unsigned long long seq;
    PyObject *spans = NULL;
    DoorEntry *e;
    int ok = door_ready(d, args, nargs, 0, &timeout_s, &seq, &spans, &e);
    Py_XDECREF(spans);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

/* the call, where door_ready (the recorder's check skipped where `recorded`) lets it run; else the miss object */
static PyObject *door_run(Door *d, PyObject *const *args, Py_ssize_t nargs, int recorded)
{
    double timeout_s;
    unsigned long long seq;
    PyObject *spans = NULL;
    DoorEntry *e;
    int ok = door_ready(d, args, nargs, recorded, &timeout_s, &seq, &spans, &e);
    if (ok <= 0)
        return ok < 0 ? NULL : door_miss(d);
    PyObject *x = args[0], *out = args[1];
    /* everything checked: from here the call is this communicator's next collective */
    Py_INCREF(d);
    Runner *keep = (Runner *)Py_NewRef(e->runner);
    PyObject *resume = Py_NewRef(e->resume);   /* resume() may run Python that clears the door */
    PyObject *result = Py_NewRef(out == Py_None ? x : out);
    PyObject *next = PyLong_FromUnsignedLongLong(seq + 1), *seq_now = PyLong_FromUnsignedLongLong(seq);
    PyObject *last = seq_now ? PyTuple_Pack(2, seq_now, e->last_desc) : NULL;
    int failed = next == NULL || last == NULL || PyDict_SetItem(d->dict, s_op_seq, next) < 0 ||
                 PyDict_SetItem(d->dict, s_last_call, last) < 0 || PyDict_SetItem(d->dict, s_in_call, Py_True) < 0 ||
                 PyDict_SetItem(d->dict, s_last_schedule, e->schedule) < 0;
    Py_XDECREF(next);
    Py_XDECREF(last);
    if (!failed) {
        int rc = run_call(keep, seq, timeout_s, (const uint64_t *)PyBytes_AS_STRING(spans),
                          PyBytes_GET_SIZE(spans) / 24);
        if (rc == RC_DONE) {
            failed = PyDict_SetItem(d->dict, s_in_call, Py_False) < 0;
        } else {
            PyObject *rc_obj = PyLong_FromLong(rc);
            PyObject *res = rc_obj ? PyObject_CallFunctionObjArgs(resume, seq_now, rc_obj, NULL) : NULL;
            Py_XDECREF(rc_obj);
            failed = res == NULL;
            Py_XDECREF(res);
        }
    }
    Py_XDECREF(seq_now);
    Py_DECREF(spans);
    Py_DECREF(keep);
    Py_DECREF(resume);
    Py_DECREF(d);
    if (failed) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

/* run(x, out, arg, async_op, timeout): call() inside the flight recorder's record of it (the recorder not checked) */
static PyObject *Door_run(Door *d, PyObject *const *args, Py_ssize_t nargs) { return door_run(d, args, nargs, 1); }

/* call(x, out, arg, async_op, timeout) -> the call's result, or the miss object (nothing done); with a recorder
 * on the communicator, the recorder's run(what, meta, miss, door.run, ...) records it (and takes its record back
 * where it missed) */
static PyObject *Door_call(Door *d, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *rec = nargs == 5 ? comm_get(d, s_rec) : NULL;
    if (rec == NULL || rec == Py_None)
        return PyErr_Occurred() ? NULL : door_run(d, args, nargs, 0);
    int err = 0;
    DoorEntry *e = args[3] == Py_False ? door_find(d, args[0], args[1], args[2], &err) : NULL;
    if (e == NULL)
        return err ? NULL : door_miss(d);
    PyObject *call[10] = {rec, e->what, e->meta, d->miss, d->inner, args[0], args[1], args[2], args[3], args[4]};
    Py_INCREF(rec);
    PyObject *res = PyObject_VectorcallMethod(s_run, call, 10, NULL);
    Py_DECREF(rec);
    return res;
}

static int Door_traverse(Door *d, visitproc visit, void *arg)
{
    Py_VISIT(d->dict);
    Py_VISIT(d->lane);
    Py_VISIT(d->miss);
    Py_VISIT(d->inner);
    for (int i = 0; i < DOOR_ENTRIES; i++) {
        DoorEntry *e = &d->e[i];
        Py_VISIT((PyObject *)e->runner);
        Py_VISIT(e->arg);
        Py_VISIT(e->prep);
        Py_VISIT(e->hot);
        Py_VISIT(e->last_desc);
        Py_VISIT(e->schedule);
        Py_VISIT(e->regions);
        Py_VISIT(e->resume);
        Py_VISIT(e->what);
        Py_VISIT(e->meta);
    }
    return 0;
}

static int Door_tp_clear(Door *d)
{
    door_forget(d);
    Py_CLEAR(d->dict);
    Py_CLEAR(d->lane);
    Py_CLEAR(d->miss);
    Py_CLEAR(d->inner);
    return 0;
}

static void Door_dealloc(Door *d)
{
    PyObject_GC_UnTrack((PyObject *)d);
    Door_tp_clear(d);
    PyObject_GC_Del(d);
}

static PyMethodDef Door_methods[] = {
    {"call", (PyCFunction)(void (*)(void))Door_call, METH_FASTCALL,
     "call(x, out, arg, async_op, timeout) -> the result, or the miss object where the remembered call does not "
     "apply (nothing done)"},
    {"run", (PyCFunction)(void (*)(void))Door_run, METH_FASTCALL,
     "run(x, out, arg, async_op, timeout): call() inside the recorder's record of it (the recorder not checked)"},
    {"checks", (PyCFunction)(void (*)(void))Door_checks, METH_FASTCALL,
     "checks(x, out, arg, async_op, timeout) -> True where call() would run the remembered call (nothing done)"},
    {"set", (PyCFunction)(void (*)(void))Door_set, METH_FASTCALL,
     "set(runner, arg, prep, hot, desc, schedule, regions, resume, what, meta): remember this call"},
    {"clear", (PyCFunction)Door_clear, METH_NOARGS, "forget the remembered call"},
    {"held", (PyCFunction)Door_held, METH_NOARGS, "how many calls are remembered"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DoorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ringflow.runtime.native._hotpath.Door",
    .tp_basicsize = sizeof(Door),
    .tp_dealloc = (destructor)Door_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Door_traverse,
    .tp_clear = (inquiry)Door_tp_clear,
    .tp_doc = "one collective's entry on one communicator: the calls remembered last for it, checked and run in C",
    .tp_methods = Door_methods,
};

static int intern_names(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_failure, "_failure"}, {&s_destroyed, "_destroyed"}, {&s_rec, "_rec"}, {&s_owner_id, "_owner_id"},
        {&s_op_seq, "_op_seq"}, {&s_last_call, "_last_call"}, {&s_in_call, "_in_call"},
        {&s_last_schedule, "last_schedule"}, {&s_timeout, "timeout"}, {&s_outstanding, "_outstanding"},
        {&s_hot, "hot"}, {&s_packed, "packed"}, {&s_run, "run"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    return 0;
}

static PyMethodDef methods[] = {
    {"stats", stats, METH_NOARGS,
     "{runs, cma_reads, waits, wait_ns, sleeps, rings}: plans completed natively, single-copy reads, and (by the "
     "calling thread) waits for a peer, nanoseconds in them, sleeps on the doorbell, doorbells rung"},
    {"protocol", protocol, METH_NOARGS, "the shared-memory protocol numbers this module was built with"},
    {"plan_codes", plan_codes, METH_NOARGS, "the codes of a plan's rows: types, return codes, dtypes, ops"},
    {"store_release", (PyCFunction)(void (*)(void))store_release, METH_FASTCALL, "store_release(address, value)"},
    {"load_acquire", load_acquire, METH_O, "load_acquire(address) -> the 64-bit word"},
    {"plan", make_plan, METH_VARARGS, "build a HotPlan"},
    {"reduce_into", reduce_into, METH_VARARGS, "out = a (op) b"},
    {"array_state", array_state, METH_O, "array_state(ndarray) -> bytes: address, dtype, flags, shape, strides"},
    {"set_array_type", set_array_type, METH_O, "set_array_type(numpy.ndarray): the type address() takes"},
    {"address", address, METH_O, "a NumPy array's data address (as ndarray.ctypes.data)"},
    {"runner", make_runner, METH_VARARGS, "a remembered call's Runner (see Runner.go)"},
    {"door", make_door, METH_VARARGS, "door(comm_dict, lane, miss) -> Door: one collective's entry (see Door.call)"},
    {"set_spin_yield", set_spin_yield, METH_O, "set_spin_yield(flag): bulk waits yield the core while spinning"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hotpath", "the native executor", -1, methods};

PyMODINIT_FUNC PyInit__hotpath(void)
{
    if (PyType_Ready(&HotPlanType) < 0 || PyType_Ready(&RunnerType) < 0 || PyType_Ready(&DoorType) < 0 ||
        intern_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&HotPlanType);
    if (PyModule_AddObject(m, "HotPlan", (PyObject *)&HotPlanType) < 0) {
        Py_DECREF(&HotPlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
