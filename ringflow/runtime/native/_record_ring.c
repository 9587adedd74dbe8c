/* The Ring type (a communicator's last calls, in memory and in a flight ring file) as Python sees it: its
 * construction, garbage-collector support and methods; and the SIGTERM handler that marks every live ring ended
 * before the signal kills the process. */
#include "_record.h"

/* Ring(mapping, slots_at, nslots, namer, comm=None, size=1); mapping None: in memory until attach() */
static PyObject *ring_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"mapping", "slots_at", "nslots", "namer", "comm", "size", NULL};
    PyObject *mapping, *namer, *comm = Py_None;
    Py_ssize_t slots_at, nslots;
    long size = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnnO|Ol", names, &mapping, &slots_at, &nslots, &namer, &comm,
                                     &size))
        return NULL;
    if (nslots < 1) {
        PyErr_SetString(PyExc_ValueError, "Ring: nslots >= 1");
        return NULL;
    }
    Ring *r = (Ring *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->reg = -1;
    r->last_pos = -1;
    r->nslots = nslots;
    r->size = size;
    r->comm = Py_NewRef(comm);
    if ((r->mem = PyMem_Calloc((size_t)nslots, sizeof(MSlot))) == NULL) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    if (mapping != Py_None && rec_ring_attach(r, mapping, slots_at, namer) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

static int ring_traverse(Ring *r, visitproc visit, void *arg)
{
    for (int64_t i = 0; r->mem != NULL && i <= r->nslots; i++) {
        MSlot *m = i < r->nslots ? &r->mem[i] : &r->last;
        Py_VISIT(m->entry);
        Py_VISIT(m->meta);
        Py_VISIT(m->desc);
        Py_VISIT(m->code);
        Py_VISIT(m->status);
        Py_VISIT(m->algo);
    }
    Py_VISIT(r->comm);
    Py_VISIT(r->namer);
    Py_VISIT(r->k_meta);
    Py_VISIT(r->k_desc);
    Py_VISIT(r->k_code);
    return 0;
}

static int ring_clear(Ring *r)
{
    for (int64_t i = 0; r->mem != NULL && i < r->nslots; i++)
        rec_mslot_release(&r->mem[i]);
    rec_mslot_release(&r->last);
    r->last_pos = -1;
    Py_CLEAR(r->comm);
    Py_CLEAR(r->namer);
    Py_CLEAR(r->k_meta);
    Py_CLEAR(r->k_desc);
    Py_CLEAR(r->k_code);
    return 0;
}

static void ring_dealloc(Ring *r)
{
    PyObject_GC_UnTrack(r);
    rec_ring_release(r);
    ring_clear(r);
    PyMem_Free(r->mem);
    if (r->names.slots != NULL) {
        rec_table_clear(&r->names);
        PyMem_Free(r->names.slots);
    }
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *ring_enter_m(Ring *r, PyObject *e)
{
    return PyLong_FromLongLong(rec_ring_keep(r, e));
}

static int pos_entry(PyObject *const *args, Py_ssize_t nargs, int64_t *pos)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "(pos, entry) expected");
        return -1;
    }
    *pos = PyLong_AsLongLong(args[0]);
    return *pos == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *ring_start_m(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t pos;
    if (pos_entry(args, nargs, &pos) < 0)
        return NULL;
    if (PyList_Check(args[1]) && PyList_GET_SIZE(args[1]) == NFIELDS)
        rec_map_start(r, pos, rec_i64_or(PyList_GET_ITEM(args[1], T_START), 0));
    Py_RETURN_NONE;
}

static PyObject *ring_exit_m(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t pos;
    if (pos_entry(args, nargs, &pos) < 0)
        return NULL;
    rec_map_exit_entry(r, pos, args[1]);
    Py_RETURN_NONE;
}

static PyObject *ring_find_m(Ring *r, PyObject *e)
{
    return PyLong_FromLongLong(rec_ring_find(r, e));
}

static PyObject *ring_cancel_m(Ring *r, PyObject *pos)
{
    int64_t p = PyLong_AsLongLong(pos);
    if (p == -1 && PyErr_Occurred())
        return NULL;
    rec_ring_hole(r, p);
    Py_RETURN_NONE;
}

static PyObject *ring_release_m(Ring *r, PyObject *unused)
{
    rec_ring_release(r);
    Py_RETURN_NONE;
}

static PyObject *ring_attach_m(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slots_at;
    if (nargs != 3 || (slots_at = PyLong_AsSsize_t(args[1])) == -1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "attach(mapping, slots_at, namer)");
        return NULL;
    }
    if (rec_ring_attach(r, args[0], slots_at, args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *ring_entries_m(Ring *r, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    for (int64_t pos = r->head - r->nslots > 0 ? r->head - r->nslots : 0; out != NULL && pos < r->head; pos++) {
        MSlot *m = &r->mem[pos % r->nslots];
        if (m->gen != pos + 1)
            continue;
        PyObject *e = rec_mem_entry(m);
        if (e == NULL || PyList_Append(out, e) < 0)
            Py_CLEAR(out);
        Py_XDECREF(e);
    }
    return out;
}

static PyObject *ring_last_m(Ring *r, PyObject *unused)
{
    MSlot *m = r->last_pos == LAST_HELD ? &r->last : rec_mem_live(r, r->last_pos);
    return m == NULL ? Py_NewRef(Py_None) : rec_mem_entry(m);
}

static PyObject *ring_get_coll_seq(Ring *r, void *unused)
{
    return PyLong_FromLongLong(r->coll_seq);
}

static int ring_set_coll_seq(Ring *r, PyObject *v, void *unused)
{
    long long x = v == NULL ? -1 : PyLong_AsLongLong(v);
    if (x == -1 && (v == NULL || PyErr_Occurred())) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "coll_seq cannot be deleted");
        return -1;
    }
    r->coll_seq = x;
    return 0;
}

static PyGetSetDef ring_getset[] = {
    {"coll_seq", (getter)ring_get_coll_seq, (setter)ring_set_coll_seq, "the next collective's sequence number", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef ring_methods[] = {
    {"enter", (PyCFunction)ring_enter_m, METH_O, "enter(entry) -> pos: keep a new call's entry (-1: not an entry)."},
    {"start", (PyCFunction)(void (*)(void))ring_start_m, METH_FASTCALL, "start(pos, entry): the call started."},
    {"exit", (PyCFunction)(void (*)(void))ring_exit_m, METH_FASTCALL, "exit(pos, entry): its end and status."},
    {"find", (PyCFunction)ring_find_m, METH_O, "find(entry) -> pos of an entry kept earlier, or -1."},
    {"cancel", (PyCFunction)ring_cancel_m, METH_O, "cancel(pos): leave the call's slot empty (it did not run)."},
    {"release", (PyCFunction)ring_release_m, METH_NOARGS, "release(): stop writing the file; the mapping may be closed."},
    {"attach", (PyCFunction)(void (*)(void))ring_attach_m, METH_FASTCALL,
     "attach(mapping, slots_at, namer): write every call from now on into a flight ring file's mapping too."},
    {"entries", (PyCFunction)ring_entries_m, METH_NOARGS, "entries() -> the kept calls' entries, oldest first."},
    {"last", (PyCFunction)ring_last_m, METH_NOARGS, "last() -> the latest collective's entry, or None."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject rec_RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ringflow.runtime.native._record.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = ring_new,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_traverse = (traverseproc)ring_traverse,
    .tp_clear = (inquiry)ring_clear,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_doc = "Ring(mapping, slots_at, nslots, namer, comm=None, size=1): a communicator's last calls, in memory "
              "and in a flight ring file's mapping (runtime/flightring.py's layout; mapping None: attach() later).",
};
/* SIGTERM: mark every live ring ended (plain stores into shared mappings: async-signal-safe), then die of it */
static void on_term(int sig)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    for (int i = 0; i < MAX_RINGS; i++) {
        int64_t *h = g_rings[i];
        if (h != NULL && h[H_STATE] == RING_RUNNING) {
            h[H_END_NS] = now, h[H_SIGNAL] = sig;
            __atomic_store_n(&h[H_STATE], RING_SIGNALLED, __ATOMIC_RELEASE);
        }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

PyObject *rec_install_term_handler(PyObject *mod, PyObject *unused)
{
    struct sigaction old, act;
    if (sigaction(SIGTERM, NULL, &old) < 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) {
        if (old.sa_handler == on_term)
            Py_RETURN_TRUE;
        Py_RETURN_FALSE;   /* someone handles SIGTERM (or ignores it): leave it to them */
    }
    memset(&act, 0, sizeof act);
    act.sa_handler = on_term;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &act, NULL) < 0)
        Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}
