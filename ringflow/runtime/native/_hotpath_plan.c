/* The native executor's plan object (HotPlan): built once per call shape and bound arrays from the rows
 * hotpath.py writes, every index and range checked before use, and its methods that run it, resume it and say
 * where it stopped (pending peers, mismatched messages, the last error). */
#include "_hotpath.h"

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
    int rc = rf_run_plan(p, sig, op_seq, deadline, bell, hot_s, spin_s, in_addr, out_addr, scratch_addr,
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

PyTypeObject rf_HotPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ringflow.runtime.native._hotpath.HotPlan",
    .tp_basicsize = sizeof(HotPlan),
    .tp_dealloc = (destructor)HotPlan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "one rank's compiled plan bound to arrays and shared-memory connections",
    .tp_methods = HotPlan_methods,
};

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
PyObject *rf_make_plan(PyObject *self, PyObject *args)
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
    p = PyObject_New(HotPlan, &rf_HotPlanType);
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
    if (bounce && !rf_alloc_bounce(p, bounce)) {
        PyErr_NoMemory();
        goto fail;
    }
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
