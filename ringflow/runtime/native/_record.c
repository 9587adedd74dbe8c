/* The call recorder's per-call path (record.py's Recorder.call and call_site_of) in C.
 *
 * `call` is a method descriptor: `class NativeRecorder(Recorder): call = _record.call` runs
 * rec.call(lane, description, meta, guard, fn, deadline, entry=None, async_op=False) here, with the
 * entries, sequence numbers and call sites of the Python version, which stays the reference.
 * `Ring` keeps a communicator's last calls in memory and, once a flight ring file's mapping is attached, in
 * the file too (runtime/flightring.py describes its layout; its PyRing is the reference), each call written as
 * it is entered, started and ended. A synchronous collective of a communicator that is not recording every call
 * (the repeated call of a training loop under `ringflow run`) makes no Python object: its fields go into the
 * ring in place, and its entry list is made only when read (Ring.entries, Ring.last). Other calls keep entry
 * lists, as record.py does. Call sites are found by walking the interpreter's frames without making frame
 * objects (CPython 3.11's frame layout; other versions make frame objects and remember depths, as record.py).
 * Times are CLOCK_MONOTONIC ns, the clock of time.perf_counter_ns on Linux. `pack` turns a batch of entries
 * into the base64 text of the record file's int64 rows; `install_term_handler` marks every ring ended on
 * SIGTERM, even while Python code cannot run (a rank blocked in a native wait), then lets the signal kill the
 * process.
 *
 * This file is the module: its set-up, function table and the method descriptor that puts `call` and `run` in
 * a recorder class. Call sites are found in _record_site.c, the ring's slots kept in _record_slots.c, the Ring
 * type and the SIGTERM handler are in _record_ring.c, the recorded call in _record_call.c and the record file's
 * rows packed in _record_pack.c; _record.h holds what they share. */
#include "_record.h"

/* set by setup(): record.py's _internal, thread-local queued site, _is_internal and knobs */
PyObject *g_internal, *g_queued, *g_is_internal, *g_getframe;
long g_max_walk = 24, g_flush_every = 1024;
int g_untrack = 1;

PyObject *s_pending, *s_seqs, *s_size, *s_comm, *s_last_schedule, *s_flush, *s_failed, *s_site, *s_sink,
    *s_append, *s_co_filename, *s_name, *s_entry, *s_async_op, *s_empty, *s_calls;

int rec_ready(void)
{
    if (g_internal == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ringflow.runtime.native._record: setup() was not called");
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- the method descriptor */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
} Method;

static PyObject *method_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyTypeObject MethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ringflow.runtime.native._record.method",
    .tp_basicsize = sizeof(Method),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Method, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = method_get,
    .tp_doc = "Recorder.call or Recorder.run in C: a method of the recorder class it is put in.",
};

/* ---------------------------------------------------------------- set-up */
static PyObject *setup(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"internal", "queued", "is_internal", "max_walk", "flush_every", "untrack", NULL};
    PyObject *internal, *queued, *is_internal;
    long max_walk, flush_every;
    int untrack = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOll|p", names, &PyDict_Type, &internal, &queued,
                                     &is_internal, &max_walk, &flush_every, &untrack))
        return NULL;
    if (g_getframe == NULL) {
        PyObject *gf = PySys_GetObject("_getframe");   /* borrowed */
        if (gf == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "sys._getframe is missing");
            return NULL;
        }
        g_getframe = Py_NewRef(gf);
    }
    if (rec_t_internal.slots == NULL && (rec_table_init(&rec_t_internal) < 0 || rec_table_init(&rec_t_sites) < 0))
        return NULL;
    if (internal != g_internal)   /* a new record._internal: what the C side remembered may differ */
        rec_table_clear(&rec_t_internal);
#if RAW_FRAMES
    rec_path_clear();   /* found under the knobs as they were */
#endif
    Py_XSETREF(g_internal, Py_NewRef(internal));
    Py_XSETREF(g_queued, Py_NewRef(queued));
    Py_XSETREF(g_is_internal, Py_NewRef(is_internal));
    g_max_walk = max_walk, g_flush_every = flush_every, g_untrack = untrack;
    Py_RETURN_NONE;
}

static PyObject *clock_ns(PyObject *mod, PyObject *unused)
{
    return PyLong_FromLongLong(rec_mono_ns());
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(internal, queued, is_internal, max_walk, flush_every, untrack=True): record.py's _internal, its "
     "thread-local queued site, _is_internal, MAX_WALK and FLUSH_EVERY; untrack: entries are not the collector's."},
    {"pack", (PyCFunction)(void (*)(void))rec_pack, METH_FASTCALL,
     "pack(entries, desc_id) -> str: base64 of the little-endian int64 rows (seq, enq, start, end, desc id)."},
    {"install_term_handler", rec_install_term_handler, METH_NOARGS,
     "install_term_handler() -> bool: on SIGTERM mark every ring ended, then die of it (only if SIGTERM is unhandled)."},
    {"clock_ns", clock_ns, METH_NOARGS, "clock_ns() -> int: CLOCK_MONOTONIC in ns, the clock of the entries."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record", "The call recorder's per-call path (record.py's Recorder.call) in C.", -1,
    methods,
};

#define INTERN(var, text)                                   \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;

PyMODINIT_FUNC PyInit__record(void)
{
    INTERN(s_calls, "calls") INTERN(s_pending, "pending") INTERN(s_seqs, "seqs")
    INTERN(s_size, "size") INTERN(s_comm, "comm") INTERN(s_last_schedule, "last_schedule")
    INTERN(s_flush, "flush") INTERN(s_failed, "failed") INTERN(s_site, "site") INTERN(s_sink, "sink")
    INTERN(s_append, "append") INTERN(s_co_filename, "co_filename") INTERN(s_name, "__name__")
    INTERN(s_entry, "entry") INTERN(s_async_op, "async_op") INTERN(s_empty, "")
    if (PyType_Ready(&MethodType) < 0 || PyType_Ready(&rec_RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Method *call = PyObject_New(Method, &MethodType);
    if (call == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    call->vectorcall = rec_call;
    if (PyModule_AddObjectRef(m, "Ring", (PyObject *)&rec_RingType) < 0) {
        Py_DECREF(call);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObject(m, "call", (PyObject *)call) < 0) {
        Py_DECREF(call);
        Py_DECREF(m);
        return NULL;
    }
    Method *run = PyObject_New(Method, &MethodType);
    if (run == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    run->vectorcall = rec_run;
    if (PyModule_AddObject(m, "run", (PyObject *)run) < 0) {
        Py_DECREF(run);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
