/* The native executor's runner loop: runs a plan's steps on one call's buffers, the GIL released, moving every
 * transfer of a step as far as it goes, running the step's local copies and reductions, and waiting (spin, then
 * one bounded sleep on the doorbell) when nothing moved. */
#include "_hotpath.h"

double rf_now_s(void)
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
            o->slice = rf_slice_bytes(o->nbytes, (int64_t)o->slot_bytes);
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

PyObject *rf_set_spin_yield(PyObject *self, PyObject *arg)
{
    int v = PyObject_IsTrue(arg);
    if (v < 0)
        return NULL;
    spin_yields = v;
    Py_RETURN_NONE;
}

/* a wait that began at `start` ended: counted in this thread's wait statistics */
static void count_wait(double start)
{
    rf_n_waits++;
    rf_wait_ns += (unsigned long long)((rf_now_s() - start) * 1e9);
}

/* Waits without burning a core: spin (hot: without yielding), then sleep once on this lane's doorbell. */
static int wait_some(HotPlan *p, int s, int bell, double hot_s, double spin_s, double deadline)
{
    int lo = p->step_start[s], hi = p->step_start[s + 1];
    double start = rf_now_s(), end = start + (hot_s > 0 ? hot_s : spin_s);
    int woke = 0;
    for (;;) {
        for (int k = lo; k < hi; k++)
            if (!p->ops[k].done && (p->ops[k].prev < 0 || p->ops[p->ops[k].prev].done) && rf_ready(&p->ops[k])) {
                woke = 1;
                goto done;
            }
        if (rf_now_s() > end)
            break;
        if (hot_s <= 0 && spin_yields)
            sched_yield();
    }
    for (int k = lo; k < hi; k++)
        if (!p->ops[k].done)
            rf_set_waiting(&p->ops[k], 1);
    for (int k = lo; k < hi; k++)
        if (!p->ops[k].done && (p->ops[k].prev < 0 || p->ops[p->ops[k].prev].done) && rf_ready(&p->ops[k]))
            woke = 1;
    if (!woke) {
        double left = deadline - rf_now_s();
        if (left > 0) {
            if (left > 0.005)
                left = 0.005;
            rf_n_sleeps++;
            struct pollfd pf = {bell, POLLIN, 0};
            (void)poll(&pf, 1, (int)(left * 1000) + 1);
            char buf[256];
            while (recv(bell, buf, sizeof buf, MSG_DONTWAIT) > 0) {
            }
        }
    }
    for (int k = lo; k < hi; k++)
        if (!p->ops[k].done)
            rf_set_waiting(&p->ops[k], 0);
done:
    count_wait(start);
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
        } else if (o->type == T_REDUCE &&
                   rf_reduce(p->dtype, p->op, o->data, o->data, o->src, o->nbytes / p->itemsize)) {
            p->err_op = k;
            return -1;
        }
    }
    return 0;
}

/* A latency-mode call (hot_s > 0: small messages, a core per rank) polls for up to GIL_HOLD_S with the GIL held
 * before it releases it: a peer in step answers within a microsecond or two, and releasing and taking back the GIL
 * costs about a quarter of the native 8-byte exchange; other threads wait at most this long. Bulk calls release it
 * at once. */
#define GIL_HOLD_S 5e-6

/* a GIL-held poll that began at *start (0: none) ended: counted as one wait */
static void count_poll(double *start)
{
    if (*start > 0) {
        count_wait(*start);
        *start = 0;
    }
}

/* Runs the plan from where it stands (the step `p->step`) on the call's buffers, the GIL released (see GIL_HOLD_S),
 * until it is done, a step found a mismatch, an error, or one bounded sleep passed without progress (RC_STALLED). */
int rf_run_plan(HotPlan *p, uint64_t sig, uint64_t op_seq, double deadline, int bell, double hot_s, double spin_s,
                uint64_t in_addr, uint64_t out_addr, uint64_t scratch_addr, const uint64_t *spans, int64_t nspans)
{
    p->sig = sig & 0xFFFFFFFFull, p->op_seq = op_seq;
    p->base[0] = (char *)(uintptr_t)in_addr, p->base[1] = (char *)(uintptr_t)out_addr;
    p->base[2] = (char *)(uintptr_t)scratch_addr;
    p->spans = spans, p->nspans = nspans;
    int rc = RC_DONE;
    PyThreadState *ts = hot_s > 0 ? NULL : PyEval_SaveThread();   /* NULL while this call holds the GIL */
    double poll_start = 0, hold_end = 0;   /* the GIL-held poll under way, and when the GIL goes */
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
                r = rf_send_progress(p, o) ? 0 : -1;
            } else {
                r = rf_recv_progress(p, o, sig);
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
        if (moved || !pending)
            count_poll(&poll_start);
        if (pending) {
            if (!ts && !moved) { /* poll again with the GIL held until hold_end, then release it and wait */
                double t = rf_now_s();
                if (poll_start == 0)
                    poll_start = t;
                if (hold_end == 0)
                    hold_end = t + GIL_HOLD_S;
                if (t < hold_end)
                    continue;
                count_poll(&poll_start);
                ts = PyEval_SaveThread();
            }
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
    __atomic_add_fetch(&rf_n_runs, 1, __ATOMIC_RELAXED);
out:
    if (ts)
        PyEval_RestoreThread(ts);
    p->spans = NULL, p->nspans = 0;
    return rc;
}
