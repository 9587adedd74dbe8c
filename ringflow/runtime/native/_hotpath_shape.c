/* A Door's call shapes (ShapeEntry): a collective remembered for any arrays of one dtype and shape, so a call on
 * fresh arrays runs the shape's native plan at their addresses in the same C call as a repeated one. */
#include "_hotpath.h"

void rf_shape_forget(ShapeEntry *s)
{
    rf_entry_forget(&s->c);
    Py_CLEAR(s->type);
    Py_CLEAR(s->xdescr);
    Py_CLEAR(s->odescr);
    Py_CLEAR(s->scratch);
}

int rf_shape_traverse(ShapeEntry *s, visitproc visit, void *arg)
{
    int rc = rf_entry_traverse(&s->c, visit, arg);
    if (rc)
        return rc;
    Py_VISIT(s->type);
    Py_VISIT(s->xdescr);
    Py_VISIT(s->odescr);
    Py_VISIT(s->scratch);
    return 0;
}

enum { USABLE = ARRAY_C_CONTIGUOUS | ARRAY_ALIGNED | ARRAY_WRITEABLE };

/* 1 if `obj` is an array of exactly `type`, C-contiguous, aligned and writeable, with dtype object `descr` and
 * shape dims[:nd] */
static int fits(PyObject *obj, PyObject *type, PyObject *descr, int nd, const intptr_t *dims)
{
    if ((PyObject *)Py_TYPE(obj) != type)
        return 0;
    ArrayFields *a = (ArrayFields *)obj;
    if (a->descr != descr || a->nd != nd || (a->flags & USABLE) != USABLE)
        return 0;
    for (int i = 0; i < nd; i++)
        if (a->dimensions[i] != dims[i])
            return 0;
    return 1;
}

/* the call shape call(x, out, arg) matches (base: the addresses it runs at), or NULL; -1 in *err on an error */
ShapeEntry *rf_shape_find(Door *d, PyObject *x, PyObject *out, PyObject *arg, int *err, uint64_t *base)
{
    for (int i = 0; i < SHAPE_ENTRIES; i++) {
        ShapeEntry *s = &d->s[i];
        if (s->c.runner == NULL || Py_TYPE(arg) != Py_TYPE(s->c.arg) ||
            !fits(x, s->type, s->xdescr, s->xnd, s->xdims))
            continue;
        uint64_t xa = (uint64_t)(uintptr_t)((ArrayFields *)x)->data, oa;
        if (s->out == SHAPE_OUT_NONE) {
            if (out != Py_None)
                continue;
            oa = xa;
        } else if (s->out == SHAPE_OUT_X) {
            if (out != x)
                continue;
            oa = xa;
        } else {
            if (out == x || !fits(out, s->type, s->odescr, s->ond, s->odims))
                continue;
            oa = (uint64_t)(uintptr_t)((ArrayFields *)out)->data;
            if (xa < oa + (uint64_t)s->obytes && oa < xa + (uint64_t)s->xbytes)   /* x and out overlap */
                continue;
        }
        if (arg != s->c.arg) {
            int eq = PyObject_RichCompareBool(arg, s->c.arg, Py_EQ);
            if (eq < 0) {
                *err = -1;
                return NULL;
            }
            if (!eq)
                continue;
        }
        base[0] = xa, base[1] = oa, base[2] = s->scratch != NULL ? s->scratch_addr : oa;
        return s;
    }
    return NULL;
}

/* the dtype object and shape of an array of exactly `type` (0), or -1 where it is none or has too many dims */
static int read_shape(PyObject *obj, PyObject *type, PyObject **descr, int *nd, intptr_t *dims)
{
    if ((PyObject *)Py_TYPE(obj) != type)
        return -1;
    ArrayFields *a = (ArrayFields *)obj;
    if (a->nd < 0 || a->nd > SHAPE_MAX_DIMS)
        return -1;
    *descr = a->descr, *nd = a->nd;
    for (int i = 0; i < a->nd; i++)
        dims[i] = a->dimensions[i];
    return 0;
}

/* an array's nbytes, or -1 on an error */
static long long nbytes_of(PyObject *a)
{
    PyObject *v = PyObject_GetAttrString(a, "nbytes");
    long long n = v ? PyLong_AsLongLong(v) : -1;
    Py_XDECREF(v);
    return n;
}

/* set_shape(runner, arg, prep, hot, desc, schedule, regions, resume, what, meta, x, out, scratch) -> bool: remember
 * this call for any arrays of x's dtype and shape (and out's: out is None, x, or another array of this type; scratch:
 * the plan's own scratch array or None); False where the shape cannot be remembered (more than SHAPE_MAX_DIMS dims,
 * or arrays not exactly of x's type, or x's type not the one set_array_type named) */
PyObject *rf_door_set_shape(Door *d, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13 || !PyObject_TypeCheck(args[0], &rf_RunnerType) || !PyCallable_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "set_shape(runner: Runner, arg, prep, hot, desc, schedule, regions, resume, "
                                         "what, meta, x, out, scratch)");
        return NULL;
    }
    PyObject *x = args[10], *out = args[11], *scratch = args[12];
    PyObject *type = (PyObject *)Py_TYPE(x), *xdescr, *odescr = NULL;
    int xnd, ond = 0, mode = out == Py_None ? SHAPE_OUT_NONE : out == x ? SHAPE_OUT_X : SHAPE_OUT_ARRAY;
    intptr_t xdims[SHAPE_MAX_DIMS] = {0}, odims[SHAPE_MAX_DIMS] = {0};
    if (!rf_is_array_type(type) || read_shape(x, type, &xdescr, &xnd, xdims) < 0 ||
        (mode == SHAPE_OUT_ARRAY && read_shape(out, type, &odescr, &ond, odims) < 0) ||
        (scratch != Py_None && !rf_is_array_type((PyObject *)Py_TYPE(scratch))))
        Py_RETURN_FALSE;
    long long xbytes = nbytes_of(x), obytes = mode == SHAPE_OUT_ARRAY ? nbytes_of(out) : 0;
    if (xbytes < 0 || obytes < 0)
        return NULL;
    ShapeEntry *s = NULL;
    for (int i = 0; s == NULL && i < SHAPE_ENTRIES; i++) {   /* the entry of this very shape, else a free one */
        ShapeEntry *t = &d->s[i];
        if (t->c.runner != NULL && t->type == type && t->xdescr == xdescr && t->out == mode && t->xnd == xnd &&
            !memcmp(t->xdims, xdims, (size_t)xnd * sizeof(intptr_t)) && t->odescr == odescr && t->ond == ond &&
            !memcmp(t->odims, odims, (size_t)ond * sizeof(intptr_t))) {
            int eq = PyObject_RichCompareBool(t->c.arg, args[1], Py_EQ);
            if (eq < 0)
                return NULL;
            if (eq && Py_TYPE(t->c.arg) == Py_TYPE(args[1]))
                s = t;
        }
    }
    for (int i = 0; s == NULL && i < SHAPE_ENTRIES; i++)
        if (d->s[i].c.runner == NULL)
            s = &d->s[i];
    if (s == NULL) {
        s = &d->s[d->next_shape];
        d->next_shape = (d->next_shape + 1) % SHAPE_ENTRIES;
    }
    rf_shape_forget(s);
    rf_entry_fill(&s->c, args);
    s->type = Py_NewRef(type), s->xdescr = Py_NewRef(xdescr), s->odescr = odescr ? Py_NewRef(odescr) : NULL;
    s->xnd = xnd, s->ond = ond, s->out = mode;
    memcpy(s->xdims, xdims, sizeof xdims);
    memcpy(s->odims, odims, sizeof odims);
    s->xbytes = xbytes, s->obytes = mode == SHAPE_OUT_ARRAY ? obytes : xbytes;
    s->scratch = scratch == Py_None ? NULL : Py_NewRef(scratch);
    s->scratch_addr = s->scratch ? (uint64_t)(uintptr_t)((ArrayFields *)scratch)->data : 0;
    Py_RETURN_TRUE;
}
