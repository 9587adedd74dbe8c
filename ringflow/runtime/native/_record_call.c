/* The recorded call: Recorder.call and Recorder.run as record.py takes their steps (sequence numbers, entries,
 * the guarded call, its failure, end and algorithm), and the path of a synchronous collective whose fields go
 * into the ring in place, without an entry list. */
#include "_record.h"

/* ---------------------------------------------------------------- the recorded call */
/* an attribute of the recorder, from its __dict__ d (a dict lookup, where getattr first searches the class) */
static PyObject *attr(PyObject *d, PyObject *self, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(d, name);
    if (v != NULL)
        return Py_NewRef(v);
    return PyErr_Occurred() ? NULL : PyObject_GetAttr(self, name);
}

static PyObject *plus_one(PyObject *v)
{
    static PyObject *one;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL)
        return NULL;
    return PyNumber_Add(v, one);
}

/* the next sequence number of this call's lane (collectives: the ring's count) or key (lane, peer, tag) */
static PyObject *next_seq(PyObject *d, PyObject *self, Ring *ring, PyObject *lane, long lane_v,
                          PyObject *description, PyObject *meta)
{
    if (lane_v == 0)
        return PyLong_FromLongLong(ring->coll_seq++);
    int mt = PyObject_IsTrue(meta);
    if (mt < 0)
        return NULL;
    PyObject *key;
    if (mt) {
        PyObject *peer = PySequence_GetItem(meta, 3), *tag = PySequence_GetItem(meta, 4);
        key = peer == NULL || tag == NULL ? NULL : PyTuple_Pack(3, lane, peer, tag);
        Py_XDECREF(peer), Py_XDECREF(tag);
    } else {
        key = PyTuple_Pack(2, lane, description);
    }
    PyObject *seqs = key == NULL ? NULL : attr(d, self, s_seqs);
    PyObject *seq = NULL, *nxt = NULL;
    if (seqs != NULL) {
        if (PyDict_CheckExact(seqs)) {   /* seqs.get(key, 0) */
            seq = PyDict_GetItemWithError(seqs, key);
            seq = seq != NULL ? Py_NewRef(seq) : PyErr_Occurred() ? NULL : PyLong_FromLong(0);
        } else if ((seq = PyObject_GetItem(seqs, key)) == NULL && PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
            seq = PyLong_FromLong(0);
        }
        nxt = seq == NULL ? NULL : plus_one(seq);
        if (nxt == NULL || PyObject_SetItem(seqs, key, nxt) < 0)
            Py_CLEAR(seq);
    }
    Py_XDECREF(nxt), Py_XDECREF(seqs), Py_XDECREF(key);
    return seq;
}

/* the entry of a new call, kept in the ring (*pos: its position) and in pending when recording */
static PyObject *make_entry(PyObject *d, PyObject *self, Ring *ring, PyObject *lane, long lane_v,
                            PyObject *description, PyObject *meta, PyObject *async_op, int64_t *pos)
{
    PyObject *code, *line, *queued, *e = NULL;
    if (rec_call_site(&code, &line, &queued) < 0)
        return NULL;
    PyObject *seq = next_seq(d, self, ring, lane, lane_v, description, meta);
    int at = seq == NULL ? -1 : PyObject_IsTrue(async_op);
    PyObject *enq = at < 0 ? NULL : queued != NULL ? Py_NewRef(queued) : PyLong_FromLongLong(rec_mono_ns());
    if (enq == NULL || (e = PyList_New(NFIELDS)) == NULL) {
        Py_XDECREF(seq), Py_XDECREF(enq), Py_DECREF(code), Py_DECREF(line), Py_XDECREF(queued);
        return NULL;
    }
    PyList_SET_ITEM(e, LANE, Py_NewRef(lane));
    PyList_SET_ITEM(e, SEQ, seq);
    PyList_SET_ITEM(e, META, Py_NewRef(meta));
    PyList_SET_ITEM(e, DESC, Py_NewRef(description));
    PyList_SET_ITEM(e, T_ENQ, enq);
    PyList_SET_ITEM(e, T_START, PyLong_FromLong(0));
    PyList_SET_ITEM(e, T_END, PyLong_FromLong(0));
    PyList_SET_ITEM(e, CODE, code);
    PyList_SET_ITEM(e, LINE, line);
    PyList_SET_ITEM(e, STATUS, Py_NewRef(s_empty));
    PyList_SET_ITEM(e, ALGO, Py_NewRef(Py_None));
    PyList_SET_ITEM(e, ASYNC, Py_NewRef(at ? async_op : (queued != NULL ? Py_True : Py_False)));
    /* an entry refers to no container that refers back to it: the collector need not look at it */
    if (g_untrack)
        PyObject_GC_UnTrack(e);
    if (queued != NULL) {
        Py_DECREF(queued);
        PyObject *sink = PyObject_GetAttr(g_queued, s_sink);
        if (sink == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                goto fail;
            PyErr_Clear();
        } else if (sink != Py_None) {
            PyObject *pair = PyTuple_Pack(2, self, e);
            PyObject *r = pair == NULL ? NULL : PyObject_CallMethodOneArg(sink, s_append, pair);
            Py_XDECREF(pair);
            if (r == NULL) {
                Py_DECREF(sink);
                goto fail;
            }
            Py_DECREF(r);
        }
        Py_XDECREF(sink);
    }
    *pos = rec_ring_keep(ring, e);
    PyObject *pending = attr(d, self, s_pending);
    if (pending == NULL)
        goto fail;
    if (pending != Py_None) {
        Py_ssize_t n = -1;
        if (PyList_CheckExact(pending)) {
            if (PyList_Append(pending, e) == 0)
                n = PyList_GET_SIZE(pending);
        } else {
            PyObject *ar = PyObject_CallMethodOneArg(pending, s_append, e);
            Py_XDECREF(ar);
            n = ar == NULL ? -1 : PyObject_Length(pending);
        }
        Py_DECREF(pending);
        if (n < 0)
            goto fail;
        if (n >= g_flush_every) {
            PyObject *fr = PyObject_CallMethodNoArgs(self, s_flush);
            if (fr == NULL)
                goto fail;
            Py_DECREF(fr);
        }
    } else {
        Py_DECREF(pending);
    }
    return e;
fail:
    Py_DECREF(e);
    return NULL;
}

/* The guarded call raised (the error set; *type_name a new reference to its type's name, NULL on error): fetch it.
 * Returns 0, or -1 with an error set (then nothing is fetched). */
static int fetch_failure(PyObject **type, PyObject **value, PyObject **tb, PyObject **type_name)
{
    PyErr_Fetch(type, value, tb);
    if (*type == NULL) {
        PyErr_SetString(PyExc_SystemError, "the guarded call failed without an exception");
        return -1;
    }
    PyErr_NormalizeException(type, value, tb);
    if (*tb != NULL)
        PyException_SetTraceback(*value, *tb);
    if ((*type_name = PyObject_GetAttr(*type, s_name)) == NULL) {
        Py_XDECREF(*type), Py_XDECREF(*value), Py_XDECREF(*tb);
        return -1;
    }
    return 0;
}

/* run rec.failed(exc) as the handled exception, then raise the call's error again (or failed's, the call's as
 * its context); takes the references */
static PyObject *reraise_after_failed(PyObject *self, PyObject *type, PyObject *value, PyObject *tb)
{
    PyObject *outer = PyErr_GetHandledException();
    PyErr_SetHandledException(value);
    PyObject *r = PyObject_CallMethodOneArg(self, s_failed, value);
    PyErr_SetHandledException(outer);
    Py_XDECREF(outer);
    if (r == NULL) {   /* the new error propagates, the call's as its context */
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        if (v2 != NULL && v2 != value)
            PyException_SetContext(v2, value);   /* takes the reference */
        else
            Py_DECREF(value);
        Py_XDECREF(type), Py_XDECREF(tb);
        PyErr_Restore(t2, v2, tb2);
        return NULL;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, tb);
    return NULL;
}

/* an entry-path call raised: note when and what in its entry and the file */
static PyObject *call_failed(PyObject *self, PyObject *e, Ring *ring, int64_t pos)
{
    PyObject *type, *value, *tb, *name;
    if (fetch_failure(&type, &value, &tb, &name) < 0)
        return NULL;
    if (PyList_SetItem(e, STATUS, name) < 0 || PyList_SetItem(e, T_END, PyLong_FromLongLong(rec_mono_ns())) < 0) {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
        return NULL;
    }
    rec_map_exit_entry(ring, pos, e);
    return reraise_after_failed(self, type, value, tb);
}

/* Note a synchronous collective entered at t0 as fields in the ring (no entry list): its position. code (the
 * user's site, a new reference) and line come from user_site. */
static int64_t inline_enter(Ring *ring, PyObject *description, PyObject *meta, PyObject *code, long line,
                            int64_t t0)
{
    int64_t pos = ring->head++, seq = ring->coll_seq++;
    MSlot old, old_last, *m = rec_mem_take(ring, pos, &old, &old_last);
    m->meta = Py_NewRef(meta), m->desc = Py_NewRef(description), m->code = code;
    m->seq = seq, m->enq = m->start = t0, m->line = line;
    ring->last_pos = pos;
    rec_map_write(ring, pos, 0, 0, seq, t0, t0, 0, meta, description, code, line, NULL);
    rec_mslot_release(&old);
    rec_mslot_release(&old_last);
    return pos;
}

/* the inline call at pos raised (the error set): note when and what, run rec.failed, raise again */
static PyObject *inline_failed(PyObject *self, Ring *ring, int64_t pos, int64_t t0, int64_t t1)
{
    PyObject *type, *value, *tb, *name;
    if (fetch_failure(&type, &value, &tb, &name) < 0)
        return NULL;
    MSlot *m = rec_mem_live(ring, pos);
    if (m != NULL) {
        m->end = t1;
        Py_XSETREF(m->status, Py_NewRef(name));
    }
    rec_map_exit(ring, pos, t0, name, t1);
    Py_DECREF(name);
    return reraise_after_failed(self, type, value, tb);
}

/* the inline call at pos ended at t1: its algorithm (the communicator's last schedule) and end; -1 on error */
static int inline_exit(Ring *ring, int64_t pos, int64_t t0, int64_t t1)
{
    PyObject *sched = NULL;
    if (ring->size > 1 && ring->comm != NULL) {   /* the schedule's name is read when the entry is written */
        PyObject *comm = PyWeakref_Check(ring->comm) ? PyWeakref_GetObject(ring->comm) : ring->comm;
        if (comm == NULL || (comm != Py_None && (sched = PyObject_GetAttr(comm, s_last_schedule)) == NULL))
            return -1;
    }
    MSlot *m = rec_mem_live(ring, pos);
    if (m != NULL) {
        m->end = t1;
        Py_XSETREF(m->algo, sched);
    } else {
        Py_XDECREF(sched);
    }
    rec_map_exit(ring, pos, t0, NULL, t1);
    return 0;
}

/* take back the collective at pos, numbered seq, which did not run (the full path records it): its slot left
 * empty, its sequence number and the latest collective (prev_last) as they were */
static void take_back(Ring *r, int64_t pos, int64_t seq, int64_t prev_last)
{
    rec_ring_hole(r, pos);
    if (r->coll_seq == seq + 1)
        r->coll_seq = seq;
    if (r->last_pos == pos)
        r->last_pos = prev_last;
}

/* A synchronous collective, not recorded in full: its fields go into the ring's slot in place (no entry list). */
static PyObject *call_inline(PyObject *self, Ring *ring, PyObject *const *args, PyObject *code, long line)
{
    int64_t t0 = rec_mono_ns(), pos = inline_enter(ring, args[2], args[3], code, line, t0);
    PyObject *gargs[4] = {NULL, args[5], args[6], args[1]};
    PyObject *r = PyObject_Vectorcall(args[4], gargs + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    int64_t t1 = rec_mono_ns();
    if (r == NULL)
        return inline_failed(self, ring, pos, t0, t1);
    Py_DECREF(r);
    if (inline_exit(ring, pos, t0, t1) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* an entry-path call: Recorder.call's steps as record.py takes them */
static PyObject *call_entry(PyObject *self, PyObject *d, Ring *ring, PyObject *const *args, long lane_v,
                            PyObject *entry, PyObject *async_op)
{
    PyObject *lane = args[1], *description = args[2], *meta = args[3], *guard = args[4], *e;
    int64_t pos = -1;
    if (entry == Py_None) {
        if ((e = make_entry(d, self, ring, lane, lane_v, description, meta, async_op, &pos)) == NULL)
            return NULL;
    } else {
        e = Py_NewRef(entry);
        if (guard != Py_None)
            pos = rec_ring_find(ring, e);
    }
    if (guard == Py_None)
        return e;
    if (!PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS) {
        PyErr_SetString(PyExc_TypeError, "call(entry=...) takes an entry of this recorder (a list of 12 fields)");
        goto fail;
    }
    int64_t t0 = rec_mono_ns();
    if (PyList_SetItem(e, T_START, PyLong_FromLongLong(t0)) < 0)
        goto fail;
    rec_map_start(ring, pos, t0);
    if (lane_v == 0)
        rec_ring_last_entry(ring, e);
    PyObject *gargs[4] = {NULL, args[5], args[6], lane};
    PyObject *r = PyObject_Vectorcall(guard, gargs + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) {
        call_failed(self, e, ring, pos);
        goto fail;
    }
    Py_DECREF(r);
    if (PyList_SetItem(e, T_END, PyLong_FromLongLong(rec_mono_ns())) < 0)
        goto fail;
    rec_map_exit_entry(ring, pos, e);
    if (lane_v == 0) {
        PyObject *size = attr(d, self, s_size);
        long n = size == NULL ? -1 : PyLong_AsLong(size);
        Py_XDECREF(size);
        if (n == -1 && PyErr_Occurred())
            goto fail;
        if (n > 1) {   /* the schedule's name is read when the entry is written */
            PyObject *comm = attr(d, self, s_comm);
            PyObject *sched = comm == NULL ? NULL : PyObject_GetAttr(comm, s_last_schedule);
            Py_XDECREF(comm);
            if (sched == NULL || PyList_SetItem(e, ALGO, sched) < 0)
                goto fail;
        }
    }
    Py_DECREF(e);
    Py_RETURN_NONE;
fail:
    Py_DECREF(e);
    return NULL;
}

/* the recorder's __dict__ (*d, a new reference) and its C ring (a new reference); NULL with an error set */
static Ring *recorder_ring(PyObject *self, PyObject **d)
{
    if (!rec_ready() || (*d = PyObject_GenericGetDict(self, NULL)) == NULL)
        return NULL;
    PyObject *rv = PyDict_GetItemWithError(*d, s_calls);
    if (rv == NULL || !PyObject_TypeCheck(rv, &rec_RingType)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "the recorder keeps no _record.Ring as `calls` "
                            "(record_native.NativeRecorder makes one)");
        Py_CLEAR(*d);
        return NULL;
    }
    return (Ring *)Py_NewRef(rv);
}

/* the user's site of a collective kept as fields: 1 (code a new reference: None, line 0, where no frame is the
 * user's), 0 where it is kept as an entry (recording every call, or a worker thread's queued job), -1 on error */
static int inline_site(PyObject *d, PyObject **code, long *line)
{
    PyObject *pending = PyDict_GetItemWithError(d, s_pending);
    if (pending != Py_None)
        return PyErr_Occurred() ? -1 : 0;
    int r = rec_user_site(code, NULL, line);
    if (r != 0)
        return r;
    /* every frame is ringflow's (a benchmark run as __main__) or torch's: call_site's (None, 0) unless a queued
     * job's site and queue time apply, which an entry keeps */
    PyObject *s = PyObject_GetAttr(g_queued, s_site);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    }
    int queued = s == NULL ? 0 : PyObject_IsTrue(s);
    Py_XDECREF(s);
    if (queued != 0)
        return queued < 0 ? -1 : 0;
    *code = Py_NewRef(Py_None), *line = 0;
    return 1;
}

/* Recorder.call(self, lane, description, meta, guard, fn, deadline, entry=None, async_op=False) */
PyObject *rec_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 7 || nargs > 9) {
        PyErr_Format(PyExc_TypeError, "call(lane, description, meta, guard, fn, deadline, entry=None, "
                     "async_op=False) takes 6 to 8 arguments after the recorder (%zd given)", nargs - 1);
        return NULL;
    }
    PyObject *entry = nargs > 7 ? args[7] : Py_None, *async_op = nargs > 8 ? args[8] : Py_False;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == s_entry || PyUnicode_Compare(k, s_entry) == 0)
            entry = args[nargs + i];
        else if (k == s_async_op || PyUnicode_Compare(k, s_async_op) == 0)
            async_op = args[nargs + i];
        else {
            PyErr_Format(PyExc_TypeError, "call() got an unexpected keyword argument '%U'", k);
            return NULL;
        }
    }
    long lane_v = PyLong_AsLong(args[1]);
    if (lane_v == -1 && PyErr_Occurred())
        return NULL;
    PyObject *d, *r = NULL;
    Ring *ring = recorder_ring(args[0], &d);
    if (ring == NULL)
        return NULL;
    if (entry == Py_None && lane_v == 0 && args[4] != Py_None && (async_op == Py_False || async_op == Py_None)) {
        PyObject *code;
        long line;
        int site = inline_site(d, &code, &line);
        if (site != 0) {
            r = site < 0 ? NULL : call_inline(args[0], ring, args, code, line);
            goto done;
        }
    }
    r = call_entry(args[0], d, ring, args, lane_v, entry, async_op);
done:
    Py_DECREF(d);
    Py_DECREF(ring);
    return r;
}

/* remove the item of list `l` that is e (or, pairs, whose second item is e), from the end */
static void remove_identical(PyObject *l, PyObject *e, int pairs)
{
    if (l == NULL || !PyList_Check(l))
        return;
    for (Py_ssize_t i = PyList_GET_SIZE(l) - 1; i >= 0; i--) {
        PyObject *it = PyList_GET_ITEM(l, i);
        if (pairs ? PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 2 && PyTuple_GET_ITEM(it, 1) == e : it == e) {
            if (PyList_SetSlice(l, i, i + 1, NULL) < 0)
                PyErr_Clear();
            return;
        }
    }
}

/* run, kept as an entry: Recorder.run's steps as record.py takes them */
static PyObject *run_entry(PyObject *self, PyObject *d, Ring *ring, PyObject *const *args, Py_ssize_t nargs)
{
    static PyObject *zero;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    int64_t pos = -1, prev_last = ring->last_pos;
    MSlot prev = ring->last;   /* held again below: ring_last_entry releases the ring's */
    Py_XINCREF(prev.entry), Py_XINCREF(prev.meta), Py_XINCREF(prev.desc), Py_XINCREF(prev.code);
    Py_XINCREF(prev.status), Py_XINCREF(prev.algo);
    PyObject *e = make_entry(d, self, ring, zero, 0, args[1], args[2], Py_False, &pos), *r = NULL;
    int64_t seq = ring->coll_seq - 1;
    if (e == NULL)
        goto done;
    int64_t t0 = rec_mono_ns();
    if (PyList_SetItem(e, T_START, PyLong_FromLongLong(t0)) < 0)
        goto done;
    rec_map_start(ring, pos, t0);
    rec_ring_last_entry(ring, e);
    r = PyObject_Vectorcall(args[4], args + 5, (size_t)(nargs - 5), NULL);
    if (r == NULL) {
        call_failed(self, e, ring, pos);
    } else if (r == args[3]) {   /* ran nothing */
        take_back(ring, pos, seq, prev_last);
        MSlot held = ring->last;
        ring->last = prev, ring->last_pos = prev_last;
        memset(&prev, 0, sizeof prev);
        rec_mslot_release(&held);
        PyObject *pending = PyDict_GetItemWithError(d, s_pending);
        remove_identical(pending, e, 0);
        PyObject *sink = PyObject_GetAttr(g_queued, s_sink);
        if (sink == NULL)
            PyErr_Clear();
        remove_identical(sink, e, 1);
        Py_XDECREF(sink);
    } else if (PyList_SetItem(e, T_END, PyLong_FromLongLong(rec_mono_ns())) < 0) {
        Py_CLEAR(r);
    } else {
        rec_map_exit_entry(ring, pos, e);
        PyObject *size = attr(d, self, s_size);
        long n = size == NULL ? -1 : PyLong_AsLong(size);
        Py_XDECREF(size);
        if (n > 1) {   /* the schedule's name is read when the entry is written */
            PyObject *comm = attr(d, self, s_comm);
            PyObject *sched = comm == NULL ? NULL : PyObject_GetAttr(comm, s_last_schedule);
            Py_XDECREF(comm);
            if (sched == NULL || PyList_SetItem(e, ALGO, sched) < 0)
                Py_CLEAR(r);
        } else if (n == -1 && PyErr_Occurred()) {
            Py_CLEAR(r);
        }
    }
done:
    rec_mslot_release(&prev);
    Py_XDECREF(e);
    return r;
}

/* Recorder.run(self, description, meta, miss, fn, *args): fn(*args), a collective run without the
 * communicator's guard (the remembered-call path on NumPy arrays), recorded as call() records one; fn returning
 * `miss` ran nothing, and its record is taken back */
PyObject *rec_run(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 5 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError, "run(description, meta, miss, fn, *args) takes no keyword arguments");
        return NULL;
    }
    PyObject *d, *r, *code;
    long line;
    Ring *ring = recorder_ring(args[0], &d);
    if (ring == NULL)
        return NULL;
    int site = inline_site(d, &code, &line);
    if (site > 0) {
        int64_t prev_last = ring->last_pos, t0 = rec_mono_ns(), seq = ring->coll_seq;
        int64_t pos = inline_enter(ring, args[1], args[2], code, line, t0);
        r = PyObject_Vectorcall(args[4], args + 5, (size_t)(nargs - 5), NULL);
        int64_t t1 = rec_mono_ns();
        if (r == NULL)
            r = inline_failed(args[0], ring, pos, t0, t1);
        else if (r == args[3])
            take_back(ring, pos, seq, prev_last);
        else if (inline_exit(ring, pos, t0, t1) < 0)
            Py_CLEAR(r);
    } else {
        r = site < 0 ? NULL : run_entry(args[0], d, ring, args, nargs);
    }
    Py_DECREF(d);
    Py_DECREF(ring);
    return r;
}
