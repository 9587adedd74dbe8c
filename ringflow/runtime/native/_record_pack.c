/* The record file's rows: pack() turns a batch of entries into the base64 text of little-endian int64 rows,
 * asking for a description id once per run of entries of one description. */
#include "_record.h"

/* ---------------------------------------------------------------- the record file's rows */
/* pack(entries, desc_id) -> str: the base64 text of the little-endian int64 quintuples (seq, enq_ns, start_ns,
 * end_ns, desc id), one per entry;
 * desc_id(entry) gives an entry's description id. A run of entries of one description (the same lane,
 * meta, description, site, status, algorithm, async and whether it ended) asks desc_id once. */
static int equal(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    int r = PyObject_RichCompareBool(a, b, Py_EQ);
    if (r < 0)
        PyErr_Clear();
    return r > 0;
}

/* record.desc_key(ns, a) == record.desc_key(ns, b), or 0 where unsure (then desc_id decides) */
static int same_desc(PyObject *a, PyObject *b)
{
    PyObject **x = ((PyListObject *)a)->ob_item, **y = ((PyListObject *)b)->ob_item;
    if (x[CODE] != y[CODE] || x[ALGO] != y[ALGO] || !equal(x[LANE], y[LANE]) || !equal(x[LINE], y[LINE]) ||
        !equal(x[STATUS], y[STATUS]) || !equal(x[ASYNC], y[ASYNC]) || !equal(x[DESC], y[DESC]))
        return 0;
    int ea = PyObject_IsTrue(x[T_END]), eb = PyObject_IsTrue(y[T_END]);
    if (ea < 0 || eb < 0) {
        PyErr_Clear();
        return 0;
    }
    if (ea != eb)
        return 0;
    PyObject *m = x[META], *n = y[META];
    if (m == n)
        return 1;
    /* the key holds the ids of the meta's operation and dtype, and its count, root or peer and reduction or tag */
    if (!PyTuple_CheckExact(m) || !PyTuple_CheckExact(n) || PyTuple_GET_SIZE(m) != 5 || PyTuple_GET_SIZE(n) != 5)
        return 0;
    PyObject **p = ((PyTupleObject *)m)->ob_item, **q = ((PyTupleObject *)n)->ob_item;
    return p[0] == q[0] && p[1] == q[1] && equal(p[2], q[2]) && equal(p[3], q[3]) && equal(p[4], q[4]);
}

static int as_i64(PyObject *v, int64_t *out)
{
    int overflow;   /* the ...AndOverflow form: PyLong_AsLongLong goes through a byte array past one digit */
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "pack: a recorder field does not fit in int64");
        return -1;
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* standard base64 with padding, as base64.b64encode */
static void b64(const unsigned char *in, size_t n, unsigned char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i = 0;
    for (; i + 3 <= n; i += 3, out += 4) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[0] = abc[v >> 18], out[1] = abc[(v >> 12) & 63], out[2] = abc[(v >> 6) & 63], out[3] = abc[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        out[0] = abc[v >> 18], out[1] = abc[(v >> 12) & 63];
        out[2] = i + 1 < n ? abc[(v >> 6) & 63] : '=';
        out[3] = '=';
    }
}

PyObject *rec_pack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pack(entries: list, desc_id) -> str");
        return NULL;
    }
    PyObject *entries = args[0], *desc_id = args[1], *prev = NULL, *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(entries);
    size_t nbytes = (size_t)n * 5 * sizeof(int64_t);
    int64_t *rows = PyMem_Malloc(nbytes + 1), *row = rows, id = -1;
    if (rows == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++, row += 5) {
        if (i >= PyList_GET_SIZE(entries)) {   /* desc_id is Python: it could change the list */
            PyErr_SetString(PyExc_RuntimeError, "pack: the entries changed while they were packed");
            goto done;
        }
        PyObject *e = Py_NewRef(PyList_GET_ITEM(entries, i));
        if (!PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS) {
            PyErr_SetString(PyExc_TypeError, "pack: an entry is not a recorder entry (a list of 12 fields)");
            Py_DECREF(e);
            goto done;
        }
        int bad = 0;
        if (prev == NULL || !same_desc(prev, e)) {
            PyObject *k = PyObject_CallOneArg(desc_id, e);
            bad = k == NULL || as_i64(k, &id) < 0;
            Py_XDECREF(k);
        }
        PyObject **f = ((PyListObject *)e)->ob_item;
        Py_XSETREF(prev, e);   /* held: the previous entry of the next round */
        if (bad || as_i64(f[SEQ], &row[0]) < 0 || as_i64(f[T_ENQ], &row[1]) < 0 ||
            as_i64(f[T_START], &row[2]) < 0 || as_i64(f[T_END], &row[3]) < 0)
            goto done;
        row[4] = id;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (int64_t *p = rows; p < row; p++)   /* the file's rows are little-endian */
        *p = (int64_t)__builtin_bswap64((uint64_t)*p);
#endif
    if ((out = PyUnicode_New((Py_ssize_t)((nbytes + 2) / 3 * 4), 127)) != NULL)
        b64((const unsigned char *)rows, nbytes, PyUnicode_1BYTE_DATA(out));
done:
    Py_XDECREF(prev);
    PyMem_Free(rows);
    return out;
}
