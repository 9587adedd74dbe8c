/* The native executor's side of the shared-memory protocol (transport/shm.py has the segment layout): sending a
 * message through a connection's slots or by address, receiving one (slot copies, single-copy reads of the
 * peer's memory, reads of a peer's alloc region), the doorbells that wake a sleeping peer, and the counters of
 * what moved. */
#include "_hotpath.h"

static int bell_fd = -1;
unsigned long long rf_n_runs, rf_n_cma_reads; /* calls completed natively, messages read by single copy */
/* where the waits went (benchmarks/call_overhead.py --parts): waits, their nanoseconds, sleeps on the doorbell,
   doorbells rung for a sleeping peer */
__thread unsigned long long rf_n_waits, rf_wait_ns, rf_n_sleeps, rf_n_rings;   /* the calling thread's */

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
    rf_n_rings++;
    (void)sendto(fd, "\1", 1, MSG_DONTWAIT, (struct sockaddr *)&p->bells[b], p->bell_len[b]);
}

static inline uint64_t ld(volatile uint64_t *w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
static inline void st(volatile uint64_t *w, uint64_t v) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }

int64_t rf_slice_bytes(int64_t total, int64_t slot_bytes)
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

int rf_send_progress(HotPlan *p, hop_t *o)
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
    return rf_reduce(p->dtype, p->op, o->data + off, o->src + off, data, n / p->itemsize);
}

/* give the plan a bounce buffer for CMA reads of `nbytes` at a time, usable from any page offset (a read lands at
 * its source's page offset); 0 if it cannot be had */
int rf_alloc_bounce(HotPlan *p, int64_t nbytes)
{
    if (!(p->bounce = malloc((size_t)nbytes + 4096u)))
        return 0;
    p->bounce_bytes = nbytes;
    return 1;
}

/* the plan's bounce buffer (made with the plan when it reduces CMA reads, else at the first read that needs it);
 * 0 if it cannot be had (the read then goes direct) */
static int ensure_bounce(HotPlan *p)
{
    return p->bounce != NULL || rf_alloc_bounce(p, (int64_t)RF_CMA_CHUNK_BYTES);
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
    __atomic_add_fetch(&rf_n_cma_reads, 1, __ATOMIC_RELAXED);
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
int rf_recv_progress(HotPlan *p, hop_t *o, uint64_t sig)
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
            o->slice = rf_slice_bytes(total, (int64_t)o->slot_bytes);
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
            uint64_t kind = b[5] & 0xFFFFFFFFull;   /* a peer's call or a relayed finding: kept as the detail */
            if ((kind == KIND_CHECK || kind == KIND_RELAY) && o->detail_len < DETAIL_MAX) {
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

int rf_ready(hop_t *o)
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

void rf_set_waiting(hop_t *o, uint64_t flag)
{
    st(&o->ctl[o->type == T_SEND ? W_SWAIT : W_RWAIT], flag);
}
