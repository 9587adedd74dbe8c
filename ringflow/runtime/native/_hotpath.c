/* The native executor: runs one rank's compiled plan of a collective over shared-memory slots
 * without returning to Python between steps, the GIL released.
 *
 * It speaks the shared-memory protocol of ringflow/runtime/transport/shm.py (the module docstring
 * there has the segment layout) word for word, so a peer on the Python path and one on this path
 * talk to each other. A plan is built once per call shape and bound arrays (hotpath.py) and run
 * many times. `run` returns when the plan is done, when a step found a mismatched message, on an
 * error, or after one bounded sleep without progress (STALLED), so Python can check abort, peers
 * that left and the deadline, then call `run` again to resume where it stopped.
 *
 * This file is the module: its function table and set-up, and the functions that only hand numbers and words to
 * Python. The reductions are in _hotpath_reduce.c, the shared-memory protocol in _hotpath_shm.c, the runner loop
 * in _hotpath_run.c, the plan object in _hotpath_plan.c, the Runner in _hotpath_runner.c, the Door in
 * _hotpath_door.c and its call shapes in _hotpath_shape.c; _hotpath.h holds what they share.
 */
#include "_hotpath.h"

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
    rc = rf_reduce(dtype, op, (void *)(uintptr_t)out, (const void *)(uintptr_t)a, (const void *)(uintptr_t)b, n);
    Py_END_ALLOW_THREADS
    if (rc) {
        PyErr_SetString(PyExc_ValueError, "unsupported dtype/op");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *stats(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{sKsKsKsKsKsK}", "runs", rf_n_runs, "cma_reads", rf_n_cma_reads, "waits", rf_n_waits,
                         "wait_ns", rf_wait_ns, "sleeps", rf_n_sleeps, "rings", rf_n_rings);
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

static PyMethodDef methods[] = {
    {"stats", stats, METH_NOARGS,
     "{runs, cma_reads, waits, wait_ns, sleeps, rings}: plans completed natively, single-copy reads, and (by the "
     "calling thread) waits for a peer, nanoseconds in them, sleeps on the doorbell, doorbells rung"},
    {"protocol", protocol, METH_NOARGS, "the shared-memory protocol numbers this module was built with"},
    {"plan_codes", plan_codes, METH_NOARGS, "the codes of a plan's rows: types, return codes, dtypes, ops"},
    {"store_release", (PyCFunction)(void (*)(void))store_release, METH_FASTCALL, "store_release(address, value)"},
    {"load_acquire", load_acquire, METH_O, "load_acquire(address) -> the 64-bit word"},
    {"plan", rf_make_plan, METH_VARARGS, "build a HotPlan"},
    {"reduce_into", reduce_into, METH_VARARGS, "out = a (op) b"},
    {"array_state", rf_array_state, METH_O, "array_state(ndarray) -> bytes: address, dtype, flags, shape, strides"},
    {"set_array_type", rf_set_array_type, METH_O, "set_array_type(numpy.ndarray): the type address() takes"},
    {"address", rf_address, METH_O, "a NumPy array's data address (as ndarray.ctypes.data)"},
    {"runner", rf_make_runner, METH_VARARGS, "a remembered call's Runner (see Runner.go)"},
    {"door", rf_make_door, METH_VARARGS, "door(comm_dict, lane, miss) -> Door: one collective's entry (see Door.call)"},
    {"set_spin_yield", rf_set_spin_yield, METH_O, "set_spin_yield(flag): bulk waits yield the core while spinning"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_hotpath", "the native executor", -1, methods};

PyMODINIT_FUNC PyInit__hotpath(void)
{
    if (PyType_Ready(&rf_HotPlanType) < 0 || PyType_Ready(&rf_RunnerType) < 0 || PyType_Ready(&rf_DoorType) < 0 ||
        rf_intern_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&rf_HotPlanType);
    if (PyModule_AddObject(m, "HotPlan", (PyObject *)&rf_HotPlanType) < 0) {
        Py_DECREF(&rf_HotPlanType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
