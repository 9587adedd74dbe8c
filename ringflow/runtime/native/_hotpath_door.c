/* The communicator's door for one collective (Door): the calls remembered last for it, every check of the
 * remembered Python path done in C, the communicator's bookkeeping and the call's first native pass. */
#include "_hotpath.h"

/* ------------------------------------------------------------------ the communicator's door for one collective */
/* A Door is one collective's entry on one communicator (fastcall.py): it holds the calls remembered last for that
 * collective (up to DOOR_ENTRIES: each one's Runner and what else the call's bookkeeping names), the call shapes
 * remembered for it (up to SHAPE_ENTRIES, _hotpath_shape.c: a call on any arrays of that dtype and shape, C-contiguous,
 * aligned, writeable and not overlapping) and the communicator's instance dict. `call` does, in C, every check the
 * remembered Python paths do (the communicator neither failed nor destroyed, no queued asynchronous call, the
 * owning thread, the same op or root, a timeout > 0, the plan still the prepared one, the very arrays in the same
 * state or arrays of the remembered shape), the communicator's bookkeeping (sequence number, last call, in-call
 * flag, last schedule) and the call's first native pass at the arrays' addresses, inside the recorder's `run`
 * where the communicator has a recorder; anything else returns the miss object, having changed nothing, and the
 * full path decides. The argument check across ranks is the plan's own (its first messages or its check
 * exchange), on every call. */
static PyObject *s_failure, *s_destroyed, *s_rec, *s_owner_id, *s_op_seq, *s_last_call, *s_in_call,
    *s_last_schedule, *s_timeout, *s_outstanding, *s_hot, *s_packed, *s_run;

void rf_entry_forget(DoorEntry *e)
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

/* e (forgotten first) takes set()'s ten arguments: runner, arg, prep, hot, desc, schedule, regions, resume, what,
 * meta (type-checked by the caller) */
void rf_entry_fill(DoorEntry *e, PyObject *const *args)
{
    rf_entry_forget(e);
    e->runner = (Runner *)Py_NewRef(args[0]);
    e->arg = Py_NewRef(args[1]), e->prep = Py_NewRef(args[2]), e->hot = Py_NewRef(args[3]);
    e->last_desc = Py_NewRef(args[4]), e->schedule = Py_NewRef(args[5]), e->regions = Py_NewRef(args[6]);
    e->resume = Py_NewRef(args[7]);
    e->what = Py_NewRef(args[8]), e->meta = Py_NewRef(args[9]);
}

int rf_entry_traverse(DoorEntry *e, visitproc visit, void *arg)
{
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
    return 0;
}

static void door_forget(Door *d)
{
    for (int i = 0; i < DOOR_ENTRIES; i++)
        rf_entry_forget(&d->e[i]);
    for (int i = 0; i < SHAPE_ENTRIES; i++)
        rf_shape_forget(&d->s[i]);
}

/* door(comm_dict, lane, miss) -> Door */
PyObject *rf_make_door(PyObject *self, PyObject *args)
{
    PyObject *dict, *lane, *miss;
    if (!PyArg_ParseTuple(args, "O!OO", &PyDict_Type, &dict, &lane, &miss))
        return NULL;
    Door *d = PyObject_GC_New(Door, &rf_DoorType);
    if (!d)
        return NULL;
    d->dict = Py_NewRef(dict), d->lane = Py_NewRef(lane), d->miss = Py_NewRef(miss);
    d->next = d->next_shape = 0;
    memset(d->e, 0, sizeof d->e);
    memset(d->s, 0, sizeof d->s);
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

/* set(runner, arg, prep, hot, desc, schedule, regions, resume, what, meta): remember this call (resume(op_seq, rc,
 * in, out, scratch, deadline) finishes a call whose first native pass at those addresses left it unfinished; what
 * and meta: the recorder's description of it) */
static PyObject *Door_set(Door *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 || !PyObject_TypeCheck(args[0], &rf_RunnerType) || !PyCallable_Check(args[7])) {
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
    rf_entry_fill(e, args);
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

static PyObject *Door_shapes(Door *d, PyObject *Py_UNUSED(ignored))
{
    long n = 0;
    for (int i = 0; i < SHAPE_ENTRIES; i++)
        n += d->s[i].c.runner != NULL;
    return PyLong_FromLong(n);
}

static PyObject *door_miss(Door *d) { return Py_NewRef(d->miss); }

/* the dict's value under `key` (borrowed), or NULL where absent */
static PyObject *comm_get(Door *d, PyObject *key) { return PyDict_GetItemWithError(d->dict, key); }

/* A call call() may run: its entry (an identity entry, or a call shape's common part), the buffer addresses it runs
 * at and its result (borrowed) */
typedef struct {
    DoorEntry *e;
    ShapeEntry *shape;   /* NULL: an identity entry */
    uint64_t base[3];
    PyObject *result;
} DoorHit;

/* the entry call(x, out, arg) would run (h filled in; 1), none (0), or an error (-1); identity entries first */
static int door_lookup(Door *d, PyObject *x, PyObject *out, PyObject *arg, DoorHit *h)
{
    int err = 0;
    h->shape = NULL;
    h->e = door_find(d, x, out, arg, &err);
    if (h->e != NULL) {
        memcpy(h->base, h->e->runner->base, sizeof h->base);
        h->result = out == Py_None ? x : out;
        return 1;
    }
    if (err)
        return -1;
    h->shape = rf_shape_find(d, x, out, arg, &err, h->base);
    if (h->shape == NULL)
        return err;
    h->e = &h->shape->c;
    h->result = h->shape->out == SHAPE_OUT_ARRAY ? out : x;
    return 1;
}

/* Every check of call(): 1 where the remembered call applies (timeout_s, the sequence number and the regions'
 * packed spans, a new reference, filled in), 0 where it does not, -1 on an error */
static int door_ready(Door *d, PyObject *const *args, Py_ssize_t nargs, int recorded, double *timeout_s,
                      unsigned long long *seq, PyObject **spans_out, DoorHit *h)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "call(x, out, arg, async_op, timeout)");
        return -1;
    }
    PyObject *x = args[0], *out = args[1], *arg = args[2], *timeout = args[4];
    if (args[3] != Py_False)
        return 0;
    int found = door_lookup(d, x, out, arg, h);
    if (found <= 0)
        return found;
    DoorEntry *e = h->e;
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
        if (h->shape != NULL)
            rf_shape_forget(h->shape);
        else
            rf_entry_forget(e);
        return 0;
    }
    if (h->shape == NULL && (!rf_same_array(x, r->xref, r->xstate) ||
                             (r->outref != NULL && !rf_same_array(out, r->outref, r->outstate))))
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
    return 1;
}

/* checks(x, out, arg, async_op, timeout) -> True where call() would run a remembered call (nothing done) */
static PyObject *Door_checks(Door *d, PyObject *const *args, Py_ssize_t nargs)
{
    double timeout_s;
    unsigned long long seq;
    PyObject *spans = NULL;
    DoorHit h;
    int ok = door_ready(d, args, nargs, 0, &timeout_s, &seq, &spans, &h);
    Py_XDECREF(spans);
    return ok < 0 ? NULL : PyBool_FromLong(ok);
}

/* the call, where door_ready (the recorder's check skipped where `recorded`) lets it run; else the miss object */
static PyObject *door_run(Door *d, PyObject *const *args, Py_ssize_t nargs, int recorded)
{
    double timeout_s;
    unsigned long long seq;
    PyObject *spans = NULL;
    DoorHit h;
    int ok = door_ready(d, args, nargs, recorded, &timeout_s, &seq, &spans, &h);
    if (ok <= 0)
        return ok < 0 ? NULL : door_miss(d);
    DoorEntry *e = h.e;
    /* everything checked: from here the call is this communicator's next collective */
    Py_INCREF(d);
    Runner *keep = (Runner *)Py_NewRef(e->runner);
    PyObject *resume = Py_NewRef(e->resume);   /* resume() may run Python that clears the door */
    PyObject *result = Py_NewRef(h.result);
    PyObject *next = PyLong_FromUnsignedLongLong(seq + 1), *seq_now = PyLong_FromUnsignedLongLong(seq);
    PyObject *last = seq_now ? PyTuple_Pack(2, seq_now, e->last_desc) : NULL;
    int failed = next == NULL || last == NULL || PyDict_SetItem(d->dict, s_op_seq, next) < 0 ||
                 PyDict_SetItem(d->dict, s_last_call, last) < 0 || PyDict_SetItem(d->dict, s_in_call, Py_True) < 0 ||
                 PyDict_SetItem(d->dict, s_last_schedule, e->schedule) < 0;
    Py_XDECREF(next);
    Py_XDECREF(last);
    if (!failed) {
        int rc = rf_run_call_at(keep, h.base, seq, timeout_s, (const uint64_t *)PyBytes_AS_STRING(spans),
                                PyBytes_GET_SIZE(spans) / 24);
        if (rc == RC_DONE) {
            failed = PyDict_SetItem(d->dict, s_in_call, Py_False) < 0;
        } else {   /* resume(op_seq, rc, in, out, scratch, deadline) finishes it */
            PyObject *res = PyObject_CallFunction(resume, "OiKKKd", seq_now, rc, (unsigned long long)h.base[0],
                                                  (unsigned long long)h.base[1], (unsigned long long)h.base[2],
                                                  keep->deadline);
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
    DoorHit h;
    int found = args[3] == Py_False ? door_lookup(d, args[0], args[1], args[2], &h) : 0;
    if (found <= 0)
        return found < 0 ? NULL : door_miss(d);
    PyObject *call[10] = {rec, h.e->what, h.e->meta, d->miss, d->inner, args[0], args[1], args[2], args[3], args[4]};
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
        int rc = rf_entry_traverse(&d->e[i], visit, arg);
        if (rc)
            return rc;
    }
    for (int i = 0; i < SHAPE_ENTRIES; i++) {
        int rc = rf_shape_traverse(&d->s[i], visit, arg);
        if (rc)
            return rc;
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
    {"set_shape", (PyCFunction)(void (*)(void))rf_door_set_shape, METH_FASTCALL,
     "set_shape(runner, arg, prep, hot, desc, schedule, regions, resume, what, meta, x, out, scratch) -> True where "
     "remembered: run this call on any arrays of x's (and out's) dtype and shape"},
    {"clear", (PyCFunction)Door_clear, METH_NOARGS, "forget the remembered calls and call shapes"},
    {"held", (PyCFunction)Door_held, METH_NOARGS, "how many calls are remembered for their arrays"},
    {"shapes", (PyCFunction)Door_shapes, METH_NOARGS, "how many call shapes are remembered"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject rf_DoorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ringflow.runtime.native._hotpath.Door",
    .tp_basicsize = sizeof(Door),
    .tp_dealloc = (destructor)Door_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Door_traverse,
    .tp_clear = (inquiry)Door_tp_clear,
    .tp_doc = "one collective's entry on one communicator: the calls remembered last for it, checked and run in C",
    .tp_methods = Door_methods,
};

int rf_intern_names(void)
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
