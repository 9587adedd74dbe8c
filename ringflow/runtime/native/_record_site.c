/* The call recorder's call sites (record.py's call_site_of): the first frame outside ringflow and torch, found by
 * walking the interpreter's frames (CPython 3.11's frame layout read directly; other versions through frame
 * objects and remembered depths), or the site a worker thread's job was queued from; and the caches keyed by a
 * code object's address that keep the walk cheap. */
#include "_record.h"
#if RAW_FRAMES
#define Py_BUILD_CORE
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE
#endif

Table rec_t_internal = {NULL, 0, 0, 1 << 14};   /* record._internal: code -> outside (0) or inside (1) */
Table rec_t_sites = {NULL, 0, 0, 4097};          /* record._sites (cleared past 4096, as there) */

int rec_table_init(Table *t)
{
    size_t cap = 1;
    while (cap < 2 * t->max_count)
        cap <<= 1;
    if ((t->slots = PyMem_Calloc(cap, sizeof(Slot))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->mask = cap - 1;
    return 0;
}

void rec_table_clear(Table *t)
{
    for (size_t i = 0; i <= t->mask; i++) {
        PyObject *k = t->slots[i].key;
        t->slots[i].key = NULL;
        Py_XDECREF(k);
    }
    t->count = 0;
}

void rec_table_put(Table *t, PyObject *key, long value)
{
    Slot *s = rec_table_find(t, key);
    if (s->key == NULL) {
        if (t->count >= t->max_count) {
            rec_table_clear(t);
            s = rec_table_find(t, key);
        }
        s->key = Py_NewRef(key);
        t->count++;
    }
    s->value = value;
}

/* a frame's line, cached per (code, instruction offset): finding it walks the code's line table */
#define LINE_SLOTS 1024
static struct {
    PyObject *code, *line;
    long lineno;
    int lasti;
} lines[LINE_SLOTS];

/* record._inside: 1 if code is ringflow's, torch's or a thread start's, cached per code; -1 on error */
static int inside(PyObject *code)
{
    Slot *slot = rec_table_find(&rec_t_internal, code);
    if (slot->key != NULL)
        return (int)slot->value;
    PyObject *v = PyDict_GetItemWithError(g_internal, code);   /* record.py's cache, then its rule */
    if (v != NULL) {
        Py_INCREF(v);
    } else {
        if (PyErr_Occurred())
            return -1;
        PyObject *fname = PyObject_GetAttr(code, s_co_filename);
        if (fname == NULL)
            return -1;
        v = PyObject_CallOneArg(g_is_internal, fname);
        Py_DECREF(fname);
        if (v == NULL || PyDict_SetItem(g_internal, code, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
    }
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t >= 0)
        rec_table_put(&rec_t_internal, code, t);
    return t;
}

/* code's line at instruction offset lasti, through the cache (lineno: the line, used on a miss); -1 on error */
static int cached_line(PyObject *c, int lasti, long lineno, PyObject **line, long *out)
{
    size_t i = rec_hash_ptr(c, lasti) & (LINE_SLOTS - 1);
    if (lines[i].code != c || lines[i].lasti != lasti || lasti < 0) {
        PyObject *l = PyLong_FromLong(lineno);
        if (l == NULL)
            return -1;
        PyObject *oc = lines[i].code, *ol = lines[i].line;
        lines[i].code = Py_NewRef(c), lines[i].line = l, lines[i].lineno = lineno, lines[i].lasti = lasti;
        Py_XDECREF(oc), Py_XDECREF(ol);
    }
    if (line != NULL)
        *line = Py_NewRef(lines[i].line);
    *out = lines[i].lineno;
    return 0;
}

#if RAW_FRAMES
/* the line of a frame's last instruction (PyFrame_GetLineNumber), through the cache */
static int frame_line(_PyInterpreterFrame *f, PyObject **line, long *out)
{
    PyObject *c = (PyObject *)f->f_code;
    int lasti = _PyInterpreterFrame_LASTI(f);
    size_t i = rec_hash_ptr(c, lasti) & (LINE_SLOTS - 1);
    if (lines[i].code == c && lines[i].lasti == lasti && lasti >= 0) {
        if (line != NULL)
            *line = Py_NewRef(lines[i].line);
        *out = lines[i].lineno;
        return 0;
    }
    return cached_line(c, lasti, PyCode_Addr2Line(f->f_code, lasti * (int)sizeof(_Py_CODEUNIT)), line, out);
}

/* The codes of the frames the latest site was found through, the user's last, or (path_none) of every frame
 * walked where none was the user's: a call made along the same codes (the repeated call of a loop) has its site in
 * the same place, or none, found without classifying each frame again. Held, so no other code takes an address it
 * names. */
#define PATH_MAX_FRAMES 64
static PyObject *path[PATH_MAX_FRAMES];
static int path_n, path_none;

void rec_path_clear(void)
{
    for (int i = 0; i < path_n; i++)
        Py_CLEAR(path[i]);
    path_n = 0;
}

static void path_keep(PyObject *const *seen, int n, int none)
{
    rec_path_clear();
    for (int i = 0; i < n; i++)
        path[i] = Py_NewRef(seen[i]);
    path_n = n, path_none = none;
}

/* the next frame from g outward that PyFrame_GetBack would give (incomplete frames skipped) */
static inline _PyInterpreterFrame *complete_from(_PyInterpreterFrame *g)
{
    while (g != NULL && _PyFrame_IsIncomplete(g))
        g = g->previous;
    return g;
}

/* The user's call site of a call entered now: the first frame outside ringflow and torch from the recorder's
 * caller outward, within MAX_WALK - 2 frames (as record.call_site_of counts them). 1: found (code a new
 * reference, its line as *lineno and, if line is given, as a new int); 0: none; -1: error. */
int rec_user_site(PyObject **code, PyObject **line, long *lineno)
{
    _PyInterpreterFrame *f = PyThreadState_Get()->cframe->current_frame, *g;
    int n = 0;
    for (g = complete_from(f); g != NULL && n < path_n; g = complete_from(g->previous)) {   /* the latest path? */
        if ((PyObject *)g->f_code != path[n])
            break;
        if (++n == path_n) {
            if (!path_none)
                goto found;
            if (n >= g_max_walk - 2 || complete_from(g->previous) == NULL)   /* the walk would stop here again */
                return 0;
            break;
        }
    }
    PyObject *seen[PATH_MAX_FRAMES];
    n = 0;
    for (g = complete_from(f); g != NULL && n < g_max_walk - 2; g = complete_from(g->previous)) {
        int t = inside((PyObject *)g->f_code);
        if (t < 0)
            return -1;
        if (n < PATH_MAX_FRAMES)
            seen[n] = (PyObject *)g->f_code;
        n++;
        if (!t) {
            if (n <= PATH_MAX_FRAMES)
                path_keep(seen, n, 0);
            goto found;
        }
    }
    if (n <= PATH_MAX_FRAMES)
        path_keep(seen, n, 1);
    return 0;
found:
    if (frame_line(g, line, lineno) < 0)
        return -1;
    *code = Py_NewRef((PyObject *)g->f_code);
    return 1;
}
#else
/* record._internal.get(code) of a frame: 1, 0, or -1 when not known yet (-2 on error) */
static int internal_of(PyFrameObject *f)
{
    PyObject *code = (PyObject *)PyFrame_GetCode(f);
    Slot *slot = rec_table_find(&rec_t_internal, code);
    int r;
    if (slot->key != NULL) {
        r = (int)slot->value;
    } else {
        PyObject *v = PyDict_GetItemWithError(g_internal, code);
        r = v == NULL ? (PyErr_Occurred() ? -2 : -1) : v == Py_True ? 1 : v == Py_False ? 0 : -1;
        if (r >= 0)
            rec_table_put(&rec_t_internal, code, r);
    }
    Py_DECREF(code);
    return r;
}

static int found(PyFrameObject *g, PyObject **code, PyObject **line, long *lineno)
{
    PyObject *c = (PyObject *)PyFrame_GetCode(g);
    int lasti = PyFrame_GetLasti(g);
    size_t i = rec_hash_ptr(c, lasti) & (LINE_SLOTS - 1);
    int hit = lines[i].code == c && lines[i].lasti == lasti && lasti >= 0;
    if (cached_line(c, lasti, hit ? lines[i].lineno : PyFrame_GetLineNumber(g), line, lineno) < 0) {
        Py_DECREF(c);
        return -1;
    }
    *code = c;
    return 1;
}

/* user_site with frame objects: depths count as in the Python version (0: call_site_of, 1: Recorder.call),
 * so rec_t_sites holds what record._sites would: the frame this is called from (PyEval_GetFrame) is depth 2. */
int rec_user_site(PyObject **code, PyObject **line, long *lineno)
{
    PyFrameObject *f = NULL, *g = NULL;
    PyObject *fcode = NULL;
    int rc = -1;
    static PyObject *two;   /* sys._getframe(2) from here: the frame 4 up from call_site_of */
    if (two == NULL && (two = PyLong_FromLong(2)) == NULL)
        return -1;
    f = (PyFrameObject *)PyObject_CallOneArg(g_getframe, two);
    if (f == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))   /* a shallow stack */
            return -1;
        PyErr_Clear();
    }
    if (f != NULL) {
        fcode = (PyObject *)PyFrame_GetCode(f);
        Slot *slot = rec_table_find(&rec_t_sites, fcode);
        if (slot->key != NULL) {
            long d = slot->value;
            if (d < 0) {
                rc = 0;
                goto done;
            }
            /* the remembered depth holds if the frames below it are ringflow's or torch's */
            int broke = 0;
            g = (PyFrameObject *)Py_NewRef(f);
            for (long i = 0; i < d - 4; i++) {
                int v = g == NULL ? -1 : internal_of(g);
                if (v == -2)
                    goto done;
                if (v != 1) {
                    broke = 1;
                    break;
                }
                PyFrameObject *b = PyFrame_GetBack(g);
                Py_SETREF(g, b);
            }
            if (!broke && g != NULL) {
                int v = internal_of(g);
                if (v == -2)
                    goto done;
                if (v == 0) {
                    rc = found(g, code, line, lineno);
                    goto done;
                }
            }
            Py_CLEAR(g);
        }
    }
    /* walk from depth 2 (the caller: PyEval_GetFrame) outward to the first frame outside ringflow and torch */
    long n = 0, limit = g_max_walk - 2;
    g = (PyFrameObject *)Py_XNewRef(PyEval_GetFrame());
    while (g != NULL && n < limit) {
        PyObject *gc = (PyObject *)PyFrame_GetCode(g);
        int t = inside(gc);
        Py_DECREF(gc);
        if (t < 0)
            goto done;
        if (!t)
            break;
        PyFrameObject *b = PyFrame_GetBack(g);
        Py_SETREF(g, b);
        n++;
    }
    if (g != NULL && n >= limit)
        Py_CLEAR(g);
    if (f != NULL)
        rec_table_put(&rec_t_sites, fcode, g != NULL ? n + 2 : -1);
    rc = g != NULL ? found(g, code, line, lineno) : 0;
done:
    Py_XDECREF(g);
    Py_XDECREF(f);
    Py_XDECREF(fcode);
    return rc;
}
#endif

/* the site a worker thread's job was queued from (with_site), else (None, 0, no queue time) */
static int queued_site(PyObject **code, PyObject **line, PyObject **queued)
{
    PyObject *s = PyObject_GetAttr(g_queued, s_site);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    }
    int t = s == NULL ? 0 : PyObject_IsTrue(s);
    if (t < 0) {
        Py_DECREF(s);
        return -1;
    }
    if (!t) {
        Py_XDECREF(s);
        *code = Py_NewRef(Py_None);
        *line = PyLong_FromLong(0);
        *queued = NULL;
        return 0;
    }
    PyObject *c = PySequence_GetItem(s, 0), *l = PySequence_GetItem(s, 1), *q = PySequence_GetItem(s, 2);
    Py_DECREF(s);
    int qt = q == NULL ? -1 : PyObject_IsTrue(q);
    if (c == NULL || l == NULL || qt < 0) {
        Py_XDECREF(c), Py_XDECREF(l), Py_XDECREF(q);
        return -1;
    }
    if (!qt)
        Py_CLEAR(q);
    *code = c, *line = l, *queued = q;
    return 0;
}

/* record.call_site_of: new references to code and line, *queued NULL or the (non-zero) queue time */
int rec_call_site(PyObject **code, PyObject **line, PyObject **queued)
{
    long lineno;
    *queued = NULL;
    int r = rec_user_site(code, line, &lineno);
    return r < 0 ? -1 : r > 0 ? 0 : queued_site(code, line, queued);
}
