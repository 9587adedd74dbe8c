/* The remembered call in one C call (Runner): a NumPy array's data address and state words read from the array
 * object, and the Runner that re-checks a call's arrays and runs its check exchange and plan. */
#include "_hotpath.h"

/* The data pointer of a NumPy array: numpy's PyArrayObject_fields (numpy/ndarraytypes.h) holds it right
   after the object header, a layout its ABI keeps. ndarray.ctypes.data builds a ctypes object per call (about
   a microsecond); a call passes two or three addresses. */
typedef struct {
    PyObject_HEAD
    char *data;
} ArrayHead;

static PyTypeObject *ndarray_type = NULL;

PyObject *rf_set_array_type(PyObject *self, PyObject *arg)
{
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "set_array_type(numpy.ndarray)");
        return NULL;
    }
    Py_XSETREF(ndarray_type, (PyTypeObject *)Py_NewRef(arg));
    Py_RETURN_NONE;
}

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
PyObject *rf_array_state(PyObject *self, PyObject *arg)
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

/* 1 if t is the type set_array_type named (numpy.ndarray) */
int rf_is_array_type(PyObject *t) { return ndarray_type != NULL && t == (PyObject *)ndarray_type; }

PyObject *rf_address(PyObject *self, PyObject *arg)
{
    if (ndarray_type == NULL || !PyObject_TypeCheck(arg, ndarray_type)) {
        PyErr_SetString(PyExc_TypeError, "address() takes a numpy.ndarray (after set_array_type)");
        return NULL;
    }
    return PyLong_FromVoidPtr(((ArrayHead *)arg)->data);
}

/* ------------------------------------------------------------------ the remembered call, in one C call */

/* 1 if `obj` is the array `ref` refers to, in the state `state` holds; 0 otherwise */
int rf_same_array(PyObject *obj, PyObject *ref, PyObject *state)
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
PyObject *rf_make_runner(PyObject *self, PyObject *args)
{
    PyObject *plan, *check, *xref, *xstate, *outref, *outstate;
    unsigned long long sig, b0, b1, b2;
    int bell;
    double hot_s, spin_s;
    if (!PyArg_ParseTuple(args, "O!OO!O!OOKiddKKK", &rf_HotPlanType, &plan, &check, &_PyWeakref_RefType, &xref,
                          &PyBytes_Type, &xstate, &outref, &outstate, &sig, &bell, &hot_s, &spin_s, &b0, &b1, &b2))
        return NULL;
    if (check != Py_None && !PyObject_TypeCheck(check, &rf_HotPlanType)) {
        PyErr_SetString(PyExc_TypeError, "runner(): check is a HotPlan or None");
        return NULL;
    }
    int has_out = outref != Py_None;
    if (has_out != (outstate != Py_None) ||
        (has_out && (!PyWeakref_CheckRefExact(outref) || !PyBytes_Check(outstate)))) {
        PyErr_SetString(PyExc_TypeError, "runner(): outref and outstate are a weakref.ref and bytes, or both None");
        return NULL;
    }
    Runner *r = PyObject_New(Runner, &rf_RunnerType);
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

/* One call's first native pass at the buffer addresses `base` (IN, OUT, SCRATCH): the check exchange (if any),
 * then the plan; the plan's rc, or CHECK_RC + rc where the check exchange did not finish (the plan has not started) */
int rf_run_call_at(Runner *r, const uint64_t *base, uint64_t op_seq, double timeout_s, const uint64_t *spans,
                   int64_t nspans)
{
    HotPlan *p = r->plan, *c = r->check;
    r->deadline = rf_now_s() + timeout_s;
    if (c) {
        c->step = 0, c->step_started = 0, c->err_op = -1, c->err_code = 0;
        int rc = rf_run_plan(c, r->sig, op_seq, r->deadline, r->bell, r->hot_s, r->spin_s, base[0], base[1], base[2],
                             spans, nspans);
        if (rc != RC_DONE)
            return CHECK_RC + rc;
    }
    p->step = 0, p->step_started = 0, p->err_op = -1, p->err_code = 0;
    return rf_run_plan(p, r->sig, op_seq, r->deadline, r->bell, r->hot_s, r->spin_s, base[0], base[1], base[2],
                       spans, nspans);
}

/* rf_run_call_at at the addresses the Runner was made with */
int rf_run_call(Runner *r, uint64_t op_seq, double timeout_s, const uint64_t *spans, int64_t nspans)
{
    return rf_run_call_at(r, r->base, op_seq, timeout_s, spans, nspans);
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
    if (!rf_same_array(x, r->xref, r->xstate) ||
        (r->outref == NULL ? out != Py_None : !rf_same_array(out, r->outref, r->outstate)))
        return PyLong_FromLong(-1);
    unsigned long long op_seq = PyLong_AsUnsignedLongLong(args[2]);
    double timeout_s = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(rf_run_call(r, op_seq, timeout_s, (const uint64_t *)PyBytes_AS_STRING(args[4]),
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
    if (!rf_same_array(args[0], r->xref, r->xstate) ||
        (r->outref == NULL ? args[1] != Py_None : !rf_same_array(args[1], r->outref, r->outstate)))
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
        rc = rf_run_call(r, seq, timeout_s, spans, nspans);
        for (;;) { /* a stalled call (a peer descheduled) resumes until its deadline */
            if ((rc != RC_STALLED && rc != CHECK_RC + RC_STALLED) || rf_now_s() >= r->deadline)
                break;
            HotPlan *p = rc == RC_STALLED ? r->plan : r->check;
            rc = rf_run_plan(p, r->sig, seq, r->deadline, r->bell, r->hot_s, r->spin_s, r->base[0], r->base[1],
                          r->base[2], spans, nspans);
            if (p == r->check) {
                if (rc != RC_DONE) {
                    rc += CHECK_RC;
                    continue;
                }
                r->plan->step = 0, r->plan->step_started = 0, r->plan->err_op = -1, r->plan->err_code = 0;
                rc = rf_run_plan(r->plan, r->sig, seq, r->deadline, r->bell, r->hot_s, r->spin_s, r->base[0],
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

PyTypeObject rf_RunnerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ringflow.runtime.native._hotpath.Runner",
    .tp_basicsize = sizeof(Runner),
    .tp_dealloc = (destructor)Runner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a call remembered for its arrays: re-checks them and runs its native plan in one call",
    .tp_methods = Runner_methods,
    .tp_getset = Runner_getset,
};
